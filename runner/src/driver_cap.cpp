#include "isorun/runner/driver_cap.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <map>
#include <nlohmann/json.hpp>

#include "isorun/preload/cap_region.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/units.hpp"
#include "read_text.hpp"

namespace isorun::runner {
using json = nlohmann::json;

namespace {

// The file the program's own code was mapped from, by /proc/self/maps: the program even where
// /proc/self/exe is the dynamic loader, run by hand (`ld.so isorun ...`).
std::filesystem::path file_of_this_code() {
  const auto here = reinterpret_cast<std::uintptr_t>(&file_of_this_code);
  std::istringstream maps(detail::read_text("/proc/self/maps"));
  for (std::string line; std::getline(maps, line);) {
    // START-END PERMS OFFSET DEV INODE PATH: the path is the rest of the line after the fifth
    // field and the spaces that pad it (a path may hold spaces itself), less the " (deleted)"
    // the kernel adds to a file since removed.
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode;
    fields >> range >> perms >> offset >> dev >> inode;
    std::string path;
    if (fields) {
      std::getline(fields, path);
      path.erase(0, path.find_first_not_of(' '));
    }
    if (constexpr std::string_view deleted = " (deleted)"; path.ends_with(deleted))
      path.resize(path.size() - deleted.size());
    const auto dash = range.find('-');
    if (dash == std::string::npos || path.empty()) continue;
    if (std::stoull(range.substr(0, dash), nullptr, 16) <= here &&
        here < std::stoull(range.substr(dash + 1), nullptr, 16))
      return path;
  }
  return self_executable();
}

}  // namespace

std::string beside_library(const char* name, const char* without_it) {
  Dl_info info{};
  link_map* object = nullptr;
  if (!::dladdr1(reinterpret_cast<void*>(&self_executable), &info, reinterpret_cast<void**>(&object),
                 RTLD_DL_LINKMAP) ||
      !info.dli_fname || !object)
    throw internal_error(std::string("cannot locate libisorun.so, next to which ") + name + " is");
  namespace fs = std::filesystem;
  fs::path path = fs::path(info.dli_fname).parent_path() / name;
  // The loader's list starts with the main program. Found there, the library is linked into the
  // program itself: `isorun`, the command's front end (cli/CMakeLists.txt), installed in the
  // folder of programs. /proc/self/exe names it, unless the loader was run by hand.
  if (object == _r_debug.r_map) {
    path = (fs::path(self_executable()).parent_path() / ISORUN_LIBDIR_FROM_BINDIR / name).lexically_normal();
    if (!fs::exists(path))
      path = (file_of_this_code().parent_path() / ISORUN_LIBDIR_FROM_BINDIR / name).lexically_normal();
  }
  if (!fs::exists(path)) throw internal_error(path.string() + " is missing, so " + without_it + "; reinstall isorun");
  return path.string();
}

driver_cap::driver_cap(std::uint64_t limit, std::uint64_t events)
    : terms_{serialization::shm_file::create(sizeof(preload::cap_terms))},
      ledger_file_{
          serialization::shm_file::create(preload::cap_ledger::bytes_for(preload::default_slot_capacity, events))},
      limit_{limit},
      events_{events},
      ledger_bytes_{preload::cap_ledger::bytes_for(preload::default_slot_capacity, events)} {
  const preload::cap_terms terms{preload::terms_magic, limit, preload::default_slot_capacity, events};
  if (::pwrite(terms_.fd(), &terms, sizeof terms, 0) != static_cast<ssize_t>(sizeof terms) || !terms_.seal())
    throw internal_error(std::string("cannot write the cap's terms: ") + std::strerror(errno));
  // The command's processes write the ledger, but none may resize it: cut short, it would fault
  // in this process when the report reads it.
  if (::fcntl(ledger_file_.fd(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw internal_error(std::string("cannot seal the cap's ledger: ") + std::strerror(errno));
  void* p = ::mmap(nullptr, ledger_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, ledger_file_.fd(), 0);
  if (p == MAP_FAILED) throw internal_error(std::string("cannot map the cap's ledger: ") + std::strerror(errno));
  ledger_ = static_cast<preload::cap_ledger*>(p);  // zero-filled by the kernel: every count 0
  ledger_->magic = preload::ledger_magic;
}

driver_cap::~driver_cap() { ::munmap(ledger_, ledger_bytes_); }

std::vector<std::string> driver_cap::variables() const {
  const std::string proc = "/proc/" + std::to_string(::getpid()) + "/fd/";
  return {std::string(preload::region_env) + "=" + proc + std::to_string(ledger_file_.fd()),
          std::string(preload::terms_env) + "=" + proc + std::to_string(terms_.fd())};
}

std::string driver_cap::library() {
  return beside_library(preload::library_name, "--mem-limit cannot be enforced on the CUDA driver API");
}

bool driver_cap::refused() const noexcept { return refusals() > 0 || ledger_->slotless.load() > 0; }
std::uint64_t driver_cap::refusals() const noexcept { return ledger_->refusals(); }
std::uint64_t driver_cap::largest_refused() const noexcept { return ledger_->largest_refused(); }
std::uint64_t driver_cap::peak() const noexcept { return ledger_->peak(); }

std::string driver_cap::report(const std::string& what, const std::string& option, std::size_t gpus) const {
  const std::uint64_t refused = ledger_->refusals(), slotless = ledger_->slotless.load();
  const std::string no_slot = slotless ? std::to_string(slotless) + " process" + (slotless == 1 ? "" : "es") +
                                             " found all " + std::to_string(preload::default_slot_capacity) +
                                             " of the cap's process slots taken, so their CUDA allocations were refused"
                                       : "";
  if (!refused) return no_slot.empty() ? "" : what + ": " + no_slot;
  const std::uint64_t processes = ledger_->processes.load();
  std::string where;
  if (gpus > 1)
    for (std::size_t d = 0; d < std::min(gpus, preload::max_devices); ++d)
      if (const auto n = ledger_->devices[d].refusals.load())
        where += std::string(where.empty() ? " (" : ", ") + std::to_string(n) + " on device " + std::to_string(d);
  if (!where.empty()) where += ")";
  return what + " reached its " + option + " of " + format_size(limit_) + (gpus > 1 ? " per GPU" : "") + ": " +
         std::to_string(refused) + " allocation" + (refused == 1 ? "" : "s") + " refused" + where + " (the largest " +
         format_size(ledger_->largest_refused()) + "), peak " + format_size(ledger_->peak()) +
         (gpus > 1 ? " on one GPU" : "") + " in " + std::to_string(processes) + " process" +
         (processes == 1 ? "" : "es") + " with CUDA" + (no_slot.empty() ? "" : "; " + no_slot);
}

std::string driver_cap::memory_timeline(std::int64_t start_ns, std::int64_t end_ns,
                                        const std::vector<int>& gpu_indices) const {
  using preload::memory_event;
  const std::size_t devices = std::min(gpu_indices.size(), preload::max_devices);
  std::vector<json> events(devices, json::array());
  // The ring's events in order, each one read whole (its number before and after the fields).
  const preload::event_ring ring = ledger_->ring(preload::default_slot_capacity, events_);
  const std::uint64_t next = ledger_->events_next.load(), first = next > events_ ? next - events_ : 0;
  // What each process held on each device, for the last refusal: the one nearest the failure
  // (a program that backs off and asks for less meets earlier ones on its way).
  std::map<std::pair<std::uint16_t, std::int32_t>, std::int64_t> held_by;
  json oom;
  for (std::uint64_t n = first; ring.at && n < next; ++n) {
    const memory_event& e = ring.at[n % events_];
    if (e.seq.load(std::memory_order_acquire) != n + 1) continue;
    const memory_event copy{{}, e.t_ns, e.bytes, e.pid, e.device, e.kind};
    // (The ring is in the writable ledger: what a process of the command wrote there is checked.)
    if (e.seq.load(std::memory_order_acquire) != n + 1 || copy.device >= devices || copy.kind < memory_event::held ||
        copy.kind > memory_event::refused)
      continue;
    const char* action = copy.kind == memory_event::held       ? "map"
                         : copy.kind == memory_event::released ? "unmap"
                                                               : "oom";
    events[copy.device].push_back({{"t_ns", copy.t_ns}, {"action", action}, {"size", copy.bytes}, {"pid", copy.pid}});
    if (copy.kind == memory_event::refused) {
      std::vector<std::pair<std::int64_t, std::int32_t>> by_size;
      std::uint64_t together = 0;
      for (const auto& [who, bytes] : held_by)
        if (const auto& [device, pid] = who; device == copy.device && bytes > 0) {
          by_size.emplace_back(bytes, pid);
          together += static_cast<std::uint64_t>(bytes);
        }
      std::sort(by_size.rbegin(), by_size.rend());
      json processes = json::array();
      for (const auto& [bytes, pid] : by_size) processes.push_back({{"pid", pid}, {"bytes", bytes}});
      oom = {{"requested", copy.bytes}, {"limit", limit_},       {"reserved", together},
             {"allocated", together},   {"largest_free", 0},     {"live", json::array()},
             {"processes", processes},  {"complete", first == 0}};  // false: the ring had moved past the oldest changes
    } else {
      held_by[{copy.device, copy.pid}] += copy.kind == memory_event::held ? static_cast<std::int64_t>(copy.bytes)
                                                                          : -static_cast<std::int64_t>(copy.bytes);
    }
  }
  // Processes that ended holding memory gave it back as they went: at the end, on the page.
  std::vector<std::uint64_t> held(devices, 0);
  for (std::size_t d = 0; d < devices; ++d) held[d] = ledger_->devices[d].used.load();
  const preload::process_slot* slots = ledger_->slots_begin();
  for (std::size_t i = 0; i < ledger_->slots_in_use(); ++i) {
    const std::int32_t pid = slots[i].pid.load();
    if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH))
      for (std::size_t d = 0; d < devices; ++d)
        if (const std::uint64_t b = slots[i].bytes[d].load()) {
          events[d].push_back({{"t_ns", end_ns}, {"action", "unmap"}, {"size", b}, {"pid", pid}});
          held[d] -= std::min(held[d], b);
        }
  }
  json t = {{"start_ns", start_ns}, {"end_ns", end_ns}, {"devices", json::array()}};
  for (std::size_t d = 0; d < devices; ++d)
    t["devices"].push_back({{"index", gpu_indices[d]}, {"cap", limit_}, {"reserved", held[d]}, {"events", events[d]}});
  if (!oom.is_null()) t["oom"] = oom;
  return t.dump();
}

}  // namespace isorun::runner
