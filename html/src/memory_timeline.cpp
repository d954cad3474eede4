// Memory timelines: read and checked as a crafted file may be, and drawn.
#include "isorun/html/memory_timeline.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "isorun/html/page.hpp"
#include "isorun/html/svg.hpp"
#include "isorun/runner/bounded_json.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/serialization/whole_file.hpp"

namespace isorun::html {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace svg;

namespace {

// a + b, held at the ends of the range: a crafted timeline's sizes cannot overflow the counts
// drawn back from them (timeline_problem has checked each size is from 0 to 2^63-1).
std::int64_t plus(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
  return r;
}

// What event `e` adds to a device's allocated and reserved bytes.
struct change {
  std::int64_t alloc = 0, res = 0;
};
change change_of(const json& e) {
  const std::string a = e.value("action", "");
  const std::int64_t n = e.value("size", std::int64_t{0});
  if (a == "alloc") return {n, 0};
  if (a == "free") return {-n, 0};
  if (a == "segment_alloc" || a == "map") return {0, n};
  if (a == "segment_free" || a == "unmap") return {0, -n};
  return {};
}

// A device's counts after each of its events, from the start of the task to its end.
struct history {
  struct point {
    double ms;
    std::int64_t alloc, res;
  };
  std::vector<point> pts;
  std::vector<double> ooms;  // when the allocator failed, in ms into the task
  std::uint64_t cap = 0;
  std::uint64_t top = 0;  // the highest count, or the cap: the top of the axis
};

history replay(const json& dev, const json& events, std::int64_t start, std::int64_t end) {
  // The ring buffer may have dropped the oldest events: start from what the end counts imply.
  std::int64_t alloc = dev.value("allocated", std::int64_t{0}), res = dev.value("reserved", std::int64_t{0});
  for (const auto& e : events) {
    const change c = change_of(e);
    alloc = plus(alloc, -c.alloc);
    res = plus(res, -c.res);
  }
  history h;
  h.cap = h.top = dev.value("cap", std::uint64_t{0});
  h.pts.push_back({0, alloc, res});
  for (const auto& e : events) {
    const double ms = std::max(0.0, static_cast<double>(e.value("t_ns", start) - start) / 1e6);
    const change c = change_of(e);
    alloc = plus(alloc, c.alloc);
    res = plus(res, c.res);
    if (e.value("action", "") == "oom") h.ooms.push_back(ms);
    h.pts.push_back({ms, alloc, res});
    h.top = std::max({h.top, static_cast<std::uint64_t>(std::max<std::int64_t>(0, res)),
                      static_cast<std::uint64_t>(std::max<std::int64_t>(0, alloc))});
  }
  const double span = std::max(h.pts.back().ms, static_cast<double>(end - start) / 1e6);
  h.pts.push_back({span, alloc, res});
  return h;
}

// A device's chart: its size and the frame's edges, in viewBox units.
constexpr double W = 900, H = 220, L = 70, R = W - 10, T = 10, B = H - 36;

// Bytes up the left, ms along the bottom, and which device it is.
void timeline_axes(std::ostringstream& o, const scale& x, const byte_axis& y, const json& dev, std::size_t events) {
  o << "<g class=\"axis\">";
  byte_ticks(o, y, L, R);
  for (double v : fitted_ticks(x))
    o << "<text x=\"" << px(x(v)) << "\" y=\"" << px(B + 14) << "\" text-anchor=\"middle\">" << tick_label(v)
      << "</text>";
  o << "<text x=\"" << px((L + R) / 2) << "\" y=\"" << px(B + 30)
    << "\" text-anchor=\"middle\" class=\"label\">ms into the task"
    << (dev.value("index", -1) >= 0 ? " · GPU " + std::to_string(dev.value("index", -1)) : std::string(" · CPU"))
    << " · " << events << " events</text></g>";
}

// One count (`which`: reserved or allocated) as a step line: a value holds until the next
// event. Past 4 * max_points events, every n-th is drawn, and the last.
void step_line(std::ostringstream& o, const history& h, const scale& x, const byte_axis& y, const char* which) {
  const auto& pts = h.pts;
  o << "<polyline class=\"" << which << "\" points=\"";
  const std::size_t stride = pts.size() > 4 * max_points ? pts.size() / (4 * max_points) + 1 : 1;
  double prev_y = -1;
  for (std::size_t i = 0; i < pts.size();
       i += (i + stride < pts.size() || i + 1 == pts.size()) ? stride : pts.size() - 1 - i) {
    const double v = static_cast<double>(std::string(which) == "reserved" ? pts[i].res : pts[i].alloc);
    if (prev_y >= 0) o << px(x(pts[i].ms)) << "," << px(prev_y) << " ";
    prev_y = y(std::max(0.0, v));
    o << px(x(pts[i].ms)) << "," << px(prev_y) << " ";
    if (i + 1 == pts.size()) break;
  }
  o << "\"/>";
}

void device_chart(std::ostringstream& o, const json& dev, std::int64_t start, std::int64_t end) {
  const auto events = dev.value("events", json::array());
  const history h = replay(dev, events, start, end);
  const scale x{0, std::max(h.pts.back().ms, 1e-3), L, R};
  const byte_axis y(h.top, B, T);
  o << "<svg viewBox=\"0 0 " << W << " " << H << "\" width=\"" << W << "\" height=\"" << H << "\" class=\"timeline\">";
  timeline_axes(o, x, y, dev, events.size());
  // A command's timeline (the cap's view) has what its processes held alone, drawn as
  // reserved: no allocator's count of its own.
  step_line(o, h, x, y, "reserved");
  if (dev.contains("allocated")) step_line(o, h, x, y, "allocated");
  if (h.cap) cap_line(o, y, h.cap, L, R);
  for (double ms : h.ooms)
    o << "<line class=\"oom\" x1=\"" << px(x(ms)) << "\" x2=\"" << px(x(ms)) << "\" y1=\"" << px(T) << "\" y2=\""
      << px(B) << "\"><title>out of memory at " << num(ms, 4) << " ms</title></line>";
  o << "</svg>";
}

// What the lines mean: an allocator's counts, or what a command's processes held.
void legend(std::ostringstream& o, const json& t) {
  bool allocator = false;
  for (const auto& dev : t.value("devices", json::array())) allocator = allocator || dev.contains("allocated");
  if (allocator)
    o << "<p class=\"legend\"><span class=\"swatch reserved\"></span>reserved <span class=\"swatch allocated\"></span>allocated "
         "<span class=\"swatch cap\"></span>cap</p>";
  else
    o << "<p class=\"legend\"><span class=\"swatch reserved\"></span>held by the command's processes "
         "<span class=\"swatch cap\"></span>cap</p>";
}

// A command's: what each of its processes held on that device when the cap refused.
void oom_by_process(std::ostringstream& o, const json& f) {
  o << "<div class=\"oom\"><p><b>Out of memory:</b> a process asked for "
    << bytes(f.value("requested", std::uint64_t{0})) << " with " << bytes(f.value("reserved", std::uint64_t{0}))
    << " held of a cap of " << bytes(f.value("limit", std::uint64_t{0}))
    << ". Held at the refusal, by process, largest first"
    << (f.value("complete", true) ? "" : " (from the changes still kept: the oldest were dropped)") << ":</p>"
    << "<table class=\"live\"><tr><th>process</th><th>held</th><th>share of the cap</th></tr>";
  const double limit = static_cast<double>(std::max<std::uint64_t>(1, f.value("limit", std::uint64_t{1})));
  for (const auto& p : f["processes"]) {
    const std::uint64_t held = p.value("bytes", std::uint64_t{0});
    const double share = 100.0 * static_cast<double>(held) / limit;
    o << "<tr><td>" << p.value("pid", 0) << "</td><td>" << bytes(held)
      << "</td><td><span class=\"bar\" style=\"width:" << px(std::min(100.0, share)) << "px\"></span> " << num(share, 3)
      << "%</td></tr>";
  }
  o << "</table></div>";
}

// A task's: what its allocator held, and the allocations live when it failed.
void oom_by_size(std::ostringstream& o, const json& f) {
  o << "<div class=\"oom\"><p><b>Out of memory:</b> asked for " << bytes(f.value("requested", std::uint64_t{0}))
    << " with " << bytes(f.value("allocated", std::uint64_t{0})) << " allocated and "
    << bytes(f.value("reserved", std::uint64_t{0})) << " reserved of a cap of "
    << bytes(f.value("limit", std::uint64_t{0})) << " (largest free cached block "
    << bytes(f.value("largest_free", std::uint64_t{0}))
    << "). Live allocations at the failure, by size, largest first:</p>"
    << "<table class=\"live\"><tr><th>allocations</th><th>together</th><th>share of the cap</th></tr>";
  // Allocations of one size are one row (a model's layers are many of the same size).
  std::map<std::uint64_t, std::uint64_t, std::greater<>> by_size;
  for (const auto& b : f.value("live", json::array()))
    if (b.is_number_unsigned()) ++by_size[b.get<std::uint64_t>()];
  const double limit = static_cast<double>(std::max<std::uint64_t>(1, f.value("limit", std::uint64_t{1})));
  for (const auto& [size, count] : by_size) {
    const double share = 100.0 * static_cast<double>(size) * static_cast<double>(count) / limit;
    o << "<tr><td>" << count << " &times; " << bytes(size) << "</td><td>" << bytes(size * count)
      << "</td><td><span class=\"bar\" style=\"width:" << px(std::min(100.0, share)) << "px\"></span> " << num(share, 3)
      << "%</td></tr>";
  }
  o << "</table></div>";
}

}  // namespace

json parse_memory_timeline(const std::string& text, const fs::path& shown) {
  json t = parse_bounded_json(text);
  const std::string problem = t.is_discarded() ? "it is not JSON (cut short?)" : timeline_problem(t);
  if (!problem.empty()) throw std::runtime_error(shown.string() + " is not a memory timeline: " + problem);
  return t;
}

std::string timeline_svg(const json& t) {
  std::ostringstream o;
  const std::int64_t start = t.value("start_ns", std::int64_t{0}), end = t.value("end_ns", start);
  for (const auto& dev : t.value("devices", json::array())) device_chart(o, dev, start, end);
  legend(o, t);
  if (t.contains("oom") && t["oom"].is_object() && t["oom"].contains("processes")) oom_by_process(o, t["oom"]);
  else if (t.contains("oom") && t["oom"].is_object()) oom_by_size(o, t["oom"]);
  return o.str();
}

std::string timeline_problem(const json& t) {
  if (!t.is_object()) return "it is not a JSON object";
  // Absent, or a whole number from 0 to 2^63-1 (what times, sizes and counts are).
  auto count = [](const json& o, const char* key) {
    const auto it = o.find(key);
    if (it == o.end()) return true;
    if (it->is_number_unsigned()) return it->get<std::uint64_t>() <= INT64_MAX;
    return it->is_number_integer() && it->get<std::int64_t>() >= 0;
  };
  for (const char* k : {"start_ns", "end_ns"})
    if (!count(t, k)) return std::string(k) + " is not a time in ns";
  if (const auto devices = t.find("devices"); devices != t.end()) {
    if (!devices->is_array()) return "devices is not a list";
    for (std::size_t i = 0; i < devices->size(); ++i) {
      const json& dev = (*devices)[i];
      const std::string where = "devices[" + std::to_string(i) + "]";
      if (!dev.is_object()) return where + " is not an object";
      for (const char* k : {"cap", "allocated", "reserved"})
        if (!count(dev, k)) return where + "." + k + " is not a number of bytes";
      if (const auto index = dev.find("index"); index != dev.end()) {
        const bool ok = index->is_number_unsigned() ? index->get<std::uint64_t>() <= INT32_MAX
                                                    : index->is_number_integer() && index->get<std::int64_t>() >= -1 &&
                                                          index->get<std::int64_t>() <= INT32_MAX;
        if (!ok) return where + ".index is not a GPU index";
      }
      const auto events = dev.find("events");
      if (events == dev.end()) continue;
      if (!events->is_array()) return where + ".events is not a list";
      for (std::size_t k = 0; k < events->size(); ++k) {
        const json& e = (*events)[k];
        const std::string at = where + ".events[" + std::to_string(k) + "]";
        if (!e.is_object()) return at + " is not an object";
        if (const auto a = e.find("action"); a != e.end() && !a->is_string()) return at + ".action is not a word";
        if (!count(e, "size")) return at + ".size is not a number of bytes";
        if (!count(e, "t_ns")) return at + ".t_ns is not a time in ns";
      }
    }
  }
  if (const auto oom = t.find("oom"); oom != t.end() && oom->is_object()) {
    for (const char* k : {"requested", "limit", "reserved", "allocated", "largest_free"})
      if (!count(*oom, k)) return std::string("oom.") + k + " is not a number of bytes";
    if (const auto live = oom->find("live"); live != oom->end()) {
      if (!live->is_array()) return "oom.live is not a list";
      for (const auto& b : *live)
        if (!b.is_number_unsigned() && !(b.is_number_integer() && b.get<std::int64_t>() >= 0))
          return "oom.live holds something that is not a number of bytes";
    }
  }
  return "";
}

json read_memory_timeline(const fs::path& file) {
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  const unique_fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  std::string text;
  const int failed = dir ? serialization::read_whole_file(dir.get(), file.filename().string(), max_timeline_bytes, text)
                         : errno;
  if (failed == ENOENT || failed == ENOTDIR) throw std::runtime_error(file.string() + " is not there");
  if (failed == ELOOP) throw std::runtime_error(file.string() + " is a symbolic link, which isorun does not follow");
  if (failed == EINVAL) throw std::runtime_error(file.string() + " is not a regular file");
  if (failed == EFBIG)
    throw std::runtime_error(file.string() + " is larger than " + std::to_string(max_timeline_bytes >> 20) +
                             " MiB, more than a memory timeline ever is");
  if (failed) throw std::runtime_error("cannot read " + file.string() + ": " + std::strerror(failed));
  return parse_memory_timeline(text, file);
}

std::string render_memory_timeline(const json& timeline, const std::string& title) {
  std::ostringstream o;
  page_head(o, title, "");
  o << "<section id=\"timelines\"><h1>" << esc(title) << "</h1>" << timeline_svg(timeline)
    << "</section><script>document.body.setAttribute('data-ready', 'yes');</script>";
  page_tail(o, "");
  return o.str();
}

}  // namespace isorun::html
