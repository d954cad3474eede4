// The live report's server: one thread, one poll() loop over the listening socket, the folder's
// inotify watch, a wake-up eventfd and the connections. A connection carries one request (the
// response closes it), so no request ever waits behind another; a long poll is a connection held
// until the journal changes, the sweep ends or a while has passed.
#include "isorun/sweep/report_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/random.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <linux/openat2.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <sstream>

#include "isorun/runner/errors.hpp"
#include "isorun/runner/printable.hpp"
#include "isorun/runner/unique_fd.hpp"
#include "isorun/sweep/html_report.hpp"
#include "isorun/sweep/report_model.hpp"

namespace isorun::sweep {
namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t max_head = std::size_t{16} << 10;  // a request's line and headers; a browser's are ~1 KiB
constexpr std::size_t max_connections = 128;             // past it, new ones wait in the listen queue
constexpr auto hold = std::chrono::seconds(25);
constexpr auto silence = std::chrono::seconds(30);  // a connection neither read nor written this long is closed // a
                                                    // long poll is answered "nothing new" after this
constexpr auto flush_at_stop = std::chrono::seconds(2);  // for the last words to slow readers
constexpr auto linger = std::chrono::seconds(1);         // an answered connection's, for the client to close

// The files whose change is news: what the report is drawn from.
constexpr const char* watched[] = {"sweep.json", "results.jsonl", "reports.jsonl"};

struct connection {
  unique_fd fd;
  std::string peer;
  std::string in;   // the request's head, as far as it came
  std::string out;  // the response's head (and body, unless it comes from `file`)
  std::size_t sent = 0;
  unique_fd file;  // a served file's body, sent after `out`
  off_t file_at = 0, file_end = 0;
  bool waiting = false;  // a long poll, held for news
  std::string since;
  bool head_only = false;
  bool draining = false;  // answered and shut for writing: what the client still sends is read away
  clock::time_point until;
  clock::time_point moved = clock::now();  // when it last read or wrote a byte
};

std::string status_line(int code) {
  switch (code) {
    case 200: return "200 OK";
    case 204: return "204 No Content";
    case 400: return "400 Bad Request";
    case 403: return "403 Forbidden";
    case 404: return "404 Not Found";
    case 405: return "405 Method Not Allowed";
    case 431: return "431 Request Header Fields Too Large";
    default: return "500 Internal Server Error";
  }
}

// A response's head for a body of `length` bytes, `extra` being header lines each ending in \r\n.
// Nothing is cached (the page changes), nothing sniffed or framed; one request per connection.
std::string response_head(int code, const std::string& type, std::uint64_t length, const std::string& extra = {}) {
  std::string r = "HTTP/1.1 " + status_line(code) + "\r\n";
  if (!type.empty()) r += "Content-Type: " + type + "\r\n";
  return r + "Content-Length: " + std::to_string(length) +
         "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n"
         "Referrer-Policy: no-referrer\r\nConnection: close\r\n" +
         extra + "\r\n";
}

// A whole response; with head_only (a HEAD request), its head.
std::string response(int code, const std::string& type, const std::string& body, const std::string& extra = {},
                     bool head_only = false) {
  return response_head(code, type, body.size(), extra) + (head_only ? std::string() : body);
}

std::string text_response(int code, const std::string& message, const std::string& extra = {}) {
  return response(code, "text/plain; charset=utf-8", message + "\n", extra);
}

// %XX escapes decoded; nullopt for a bad escape or a NUL.
std::optional<std::string> percent_decoded(std::string_view s) {
  std::string o;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      o += s[i];
      continue;
    }
    if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(s[i + 2])))
      return std::nullopt;
    o += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
    i += 2;
  }
  if (o.find('\0') != std::string::npos) return std::nullopt;
  return o;
}

// A file's path inside OUT as a request names it, or "" if it could name anything else: no
// empty, "." or ".." component (the kernel's RESOLVE_BENEATH is the second line of defence).
std::string inside_path(const std::string& path) {
  std::string rel = path.substr(1);
  std::size_t at = 0;
  while (true) {
    const auto slash = rel.find('/', at);
    const std::string_view part = std::string_view(rel).substr(at, slash - at);
    if (part.empty() || part == "." || part == "..") return {};
    if (slash == std::string::npos) return rel;
    at = slash + 1;
  }
}

// 128 random bits as hex: the URL's token, as Jupyter's, so that another user of the machine who
// finds the port cannot read the folder.
std::string random_token() {
  unsigned char bytes[16];
  if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes))
    throw internal_error(std::string("report server: getrandom: ") + std::strerror(errno));
  std::string hex;
  for (const unsigned char b : bytes) {
    hex += "0123456789abcdef"[b >> 4];
    hex += "0123456789abcdef"[b & 15];
  }
  return hex;
}

// The token a request shows: ?token= in its query, or the cookie `name` the first page set.
std::string shown_token(const std::string& query, const std::string& cookies, const std::string& name) {
  const std::pair<std::string_view, std::string> sources[] = {{query, "token="}, {cookies, name + "="}};
  for (const auto& [source, key] : sources) {
    std::size_t at = 0;
    while (at < source.size()) {
      const auto end = std::min(source.find_first_of("&;", at), source.size());
      std::string_view part = source.substr(at, end - at);
      part.remove_prefix(std::min(part.find_first_not_of(' '), part.size()));
      if (part.starts_with(key)) return std::string(part.substr(key.size()));
      at = end + 1;
    }
  }
  return {};
}

// Whether `shown` is the token, in a time that does not tell how much of it was right.
bool same_token(const std::string& shown, const std::string& token) {
  unsigned char differ = shown.size() != token.size();
  for (std::size_t i = 0; i < token.size(); ++i)
    differ |= static_cast<unsigned char>(i < shown.size() ? shown[i] ^ token[i] : 1);
  return differ == 0;
}

std::string content_type(const std::string& name) {
  const std::string ext = fs::path(name).extension().string();
  if (ext == ".html") return "text/html; charset=utf-8";
  if (ext == ".csv") return "text/csv; charset=utf-8";
  if (ext == ".json") return "application/json";
  if (ext == ".svg") return "image/svg+xml";
  if (ext == ".png") return "image/png";
  if (ext == ".jsonl" || ext == ".log" || ext == ".txt" || ext == ".err" || ext == ".yaml" || ext == ".yml")
    return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

// The value of header `name` (lower case) in a request head, "" if absent.
std::string header(const std::string& head, std::string_view name) {
  std::istringstream in(head);
  std::string line;
  std::getline(in, line);  // the request line
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) break;  // the end of the head: what follows is a body
    const auto colon = line.find(':');
    if (colon != name.size()) continue;
    std::string key = line.substr(0, colon);
    std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
    if (key != name) continue;
    const auto v = line.find_first_not_of(" \t", colon + 1);
    if (v == std::string::npos) return {};
    return line.substr(v, line.find_last_not_of(" \t") + 1 - v);
  }
  return {};
}

// A number for what the report is drawn from: it changes whenever one of the watched files does.
std::string generation_of(int dir) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the files' identities, sizes and times
  const auto mix = [&h](std::uint64_t v) {
    for (int k = 0; k < 8; ++k, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ULL;
  };
  for (const char* name : watched) {
    struct stat st {};
    if (::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    mix(st.st_ino), mix(static_cast<std::uint64_t>(st.st_size));
    mix(static_cast<std::uint64_t>(st.st_mtim.tv_sec)), mix(static_cast<std::uint64_t>(st.st_mtim.tv_nsec));
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

// Whether a sweep runs in the folder now: some process holds the flock on its sweep.lock. Read
// from /proc/locks, since taking the lock to test it could make a sweep starting at that moment
// fail to take it.
bool sweep_running(int dir) {
  struct stat st {};
  if (::fstatat(dir, "sweep.lock", &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
  char id[64];
  std::snprintf(id, sizeof id, "%02x:%02x:%llu", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  for (std::string line; std::getline(locks, line);) {
    std::istringstream words(line);
    std::string n, kind, mode, access, pid, file;
    if (words >> n >> kind >> mode >> access >> pid >> file && kind == "FLOCK" && file == id) return true;
  }
  return false;
}

// A file of OUT opened for reading, with no link followed and nothing outside OUT reached (no
// mount crossed either).
unique_fd open_inside(int dir, const std::string& rel) {
  open_how how{};
  how.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  return unique_fd(static_cast<int>(::syscall(SYS_openat2, dir, rel.c_str(), &how, sizeof how)));
}

}  // namespace

struct report_server::state {
  fs::path out;
  settings how;
  std::string url, port, cookie;  // cookie: the token's name, this port's (cookies are per host)
  std::string token;              // in the printed URL, then a cookie: what a request shows to be the user's
  bool loopback = false;
  clock::time_point accept_again{};  // out of descriptors: when to try accepting again
  unique_fd listener, wake, watch, dir;
  std::list<connection> connections;
  std::string generation;
  bool running = false;
  std::string page_generation, page;  // the last page rendered, for the generation it shows

  // The folder served, opened and watched for changes (by serve(): a sweep makes it after the
  // server listens).
  void open(const fs::path& folder) {
    out = folder;
    dir.reset(::open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) throw usage_error("cannot serve " + out.string() + ": " + std::strerror(errno));
    watch.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (!watch ||
        ::inotify_add_watch(watch.get(), out.c_str(),
                            IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_ONLYDIR) < 0)
      throw internal_error("report server: cannot watch " + out.string() + ": " + std::strerror(errno));
    refresh();
  }
  void refresh() {
    generation = generation_of(dir.get());
    running = how.beside_sweep || sweep_running(dir.get());
  }
  const std::string& current_page();
  void answer_news(connection& c, bool closing);
  void handle_request(connection& c);
  std::string route(connection& c, const std::string& path, const std::string& query);
  void serve_file(connection& c, const std::string& rel);
  bool host_allowed(const std::string& host) const;
  void accept_all();
  bool pump(connection& c, short events);
  void log(const connection& c, const std::string& request_line, const std::string& what) const;
};

report_server::report_server(const settings& how) : s_{std::make_unique<state>()} {
  state& s = *s_;
  s.how = how;
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (in_addr a{}; ::inet_pton(AF_INET, how.bind.c_str(), &a) == 1) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(addr);
    v4 = {
        .sin_family = AF_INET, .sin_port = htons(static_cast<std::uint16_t>(how.port)), .sin_addr = a, .sin_zero = {}};
    len = sizeof v4;
    s.loopback = (ntohl(a.s_addr) >> 24) == 127;
  } else if (in6_addr a6{}; ::inet_pton(AF_INET6, how.bind.c_str(), &a6) == 1) {
    auto& v6 = reinterpret_cast<sockaddr_in6&>(addr);
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(static_cast<std::uint16_t>(how.port));
    v6.sin6_addr = a6;
    len = sizeof v6;
    s.loopback = IN6_IS_ADDR_LOOPBACK(&a6);
  } else {
    throw usage_error("--bind " + how.bind + ": expected an IP address, e.g. 127.0.0.1 (the default) or ::1");
  }
  if (how.port < 0 || how.port > 65535) throw usage_error("--port " + std::to_string(how.port) + ": expected 0..65535");
  s.listener.reset(::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int one = 1;
  if (!s.listener || ::setsockopt(s.listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    throw internal_error(std::string("report server: socket: ") + std::strerror(errno));
  if (::bind(s.listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0)
    throw usage_error("cannot serve the report on " + how.bind + " port " + std::to_string(how.port) + ": " +
                      std::strerror(errno) +
                      (errno == EADDRINUSE ? " (give another --port, or 0 for a free one)" : ""));
  if (::listen(s.listener.get(), 64) != 0 || ::getsockname(s.listener.get(), reinterpret_cast<sockaddr*>(&addr), &len))
    throw internal_error(std::string("report server: listen: ") + std::strerror(errno));
  const int port = ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in&>(addr).sin_port
                                                   : reinterpret_cast<sockaddr_in6&>(addr).sin6_port);
  const std::string host = addr.ss_family == AF_INET6 ? "[" + how.bind + "]" : how.bind;
  s.url = "http://" + host + ":" + std::to_string(port) + "/";
  s.port = std::to_string(port);
  s.cookie = "isorun_token_" + s.port;
  s.token = random_token();
  s.url += "?token=" + s.token;
  s.wake.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!s.wake) throw internal_error(std::string("report server: eventfd: ") + std::strerror(errno));
}

report_server::~report_server() = default;

const std::string& report_server::url() const noexcept { return s_->url; }

void report_server::stop() noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(s_->wake.get(), &one, sizeof one);
}

// Browsers name a loopback server as 127.0.0.1:PORT, localhost:PORT, [::1]:PORT or its own
// address; a page from elsewhere that resolves a name of its own to it (DNS rebinding) names
// that name. (Served on every address, a machine's names are not known: the token guards it.)
bool report_server::state::host_allowed(const std::string& host) const {
  if (!loopback) return true;
  const std::string bound = how.bind.find(':') != std::string::npos ? "[" + how.bind + "]" : how.bind;
  for (const std::string& name : {std::string("127.0.0.1"), std::string("localhost"), std::string("[::1]"), bound})
    if (host == name + ":" + port) return true;
  return false;
}

const std::string& report_server::state::current_page() {
  if (page_generation != generation || page.empty()) {
    const page_options options{.live_generation = generation};
    try {
      page = render_report(load_report_data(out), options);
    } catch (const usage_error&) {  // no sweep.json and journal yet: the sweep is starting
      page = render_waiting_page(out.string(), options);
    }
    page_generation = generation;
  }
  return page;
}

// A long poll's answer: the page if it shows something newer than the poller's, else nothing new.
void report_server::state::answer_news(connection& c, bool closing) {
  const std::string extra = "X-Isorun-Running: " + std::string(running && !closing ? "1" : "0") +
                            "\r\nX-Isorun-Generation: " + generation + "\r\n" +
                            (closing ? "X-Isorun-Closing: 1\r\n" : "");
  c.out = c.since != generation ? response(200, "text/html; charset=utf-8", current_page(), extra, c.head_only)
                                : response(204, "", "", extra, c.head_only);
  c.waiting = false;
  c.moved = clock::now();  // (its silence counts from its answer)
}

void report_server::state::log(const connection& c, const std::string& request_line, const std::string& what) const {
  if (how.on_request) how.on_request(c.peer + " \"" + printable(request_line) + "\" " + what);
}

void report_server::state::serve_file(connection& c, const std::string& rel) {
  unique_fd f = rel.empty() ? unique_fd() : open_inside(dir.get(), rel);
  struct stat st {};
  if (!f || ::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    c.out = text_response(404, "not found: the server gives out the report and the regular files inside its folder");
    return;
  }
  c.out = response_head(200, content_type(rel), static_cast<std::uint64_t>(st.st_size));
  if (!c.head_only) {
    c.file = std::move(f);
    c.file_end = st.st_size;
  }
}

void report_server::state::handle_request(connection& c) {
  const std::string line = c.in.substr(0, c.in.find("\r\n"));
  std::istringstream words(line);
  std::string method, target, version;
  words >> method >> target >> version;
  const auto q = target.find('?');
  const std::string query = q == std::string::npos ? "" : target.substr(q + 1);
  const std::string token = shown_token(query, header(c.in, "cookie"), cookie);
  std::string status;
  const auto reply = [&](int code, const std::string& message, const std::string& extra = {}) {
    status = std::to_string(code);
    c.out = text_response(code, message, extra);
  };
  if (method.empty() || target.empty() || target[0] != '/' || !version.starts_with("HTTP/1.")) {
    reply(400, "bad request: expected GET /PATH HTTP/1.1");
  } else if (method != "GET" && method != "HEAD") {
    reply(405, "the report server is read-only: GET and HEAD only", "Allow: GET, HEAD\r\n");
  } else if (!host_allowed(header(c.in, "host"))) {
    reply(403, "forbidden: this server answers requests for " + how.bind + ", 127.0.0.1, localhost or [::1] only");
  } else if (!same_token(token, this->token)) {
    reply(403, "forbidden: open the address isorun printed, with its ?token=");
  } else if (const auto path = percent_decoded(target.substr(0, q)); !path) {
    reply(400, "bad request: a malformed %-escape in the path");
  } else {
    c.head_only = method == "HEAD";
    try {
      status = route(c, *path, query);
    } catch (const std::exception& e) {  // (the page could not be drawn: said, and the server goes on)
      reply(500, std::string("the report could not be drawn: ") + e.what());
    }
  }
  log(c, line, status);
}

// A GET (or HEAD) of `path` with the token shown: the page, news for it, or a file. Returns the
// status to log.
std::string report_server::state::route(connection& c, const std::string& path, const std::string& query) {
  if (path == "/") {
    refresh();
    // The token goes on as a cookie of this port's: the page's own requests carry it.
    const std::string keep = "Set-Cookie: " + cookie + "=" + token + "; Path=/; HttpOnly; SameSite=Strict\r\n";
    c.out = response(200, "text/html; charset=utf-8", current_page(), keep, c.head_only);
    return "200";
  }
  if (path == "/live") {
    refresh();
    const auto since = query.find("since=");
    c.since = since == std::string::npos ? "" : query.substr(since + 6, query.find('&', since) - since - 6);
    c.waiting = c.since == generation && running;
    c.until = clock::now() + hold;
    if (c.waiting) return "held";
    answer_news(c, false);
    return c.since == generation ? "204" : "200";
  }
  if (path == "/favicon.ico") {
    c.out = response(204, "", "", "", c.head_only);
    return "204";
  }
  serve_file(c, inside_path(path));
  return c.out.starts_with("HTTP/1.1 200") ? "200" : "404";
}

// Reads or writes what a connection is ready for; false once it is done with (to be closed).
bool report_server::state::pump(connection& c, short events) {
  if (c.waiting) return !(events & (POLLRDHUP | POLLHUP | POLLERR));  // a held poll whose reader hung up
  if (c.draining) {  // until the client closes too, or stops sending for a moment
    char buf[65536];
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (n > 0) c.until = clock::now() + linger;
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR));
  }
  if (c.out.empty()) {
    char buf[4096];
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;
    if (n > 0) c.in.append(buf, static_cast<std::size_t>(n)), c.moved = clock::now();
    const auto end = c.in.find("\r\n\r\n");
    if (end < max_head) handle_request(c);  // (npos is not)
    else if (c.in.size() > max_head) c.out = text_response(431, "request head too large");
    return true;
  }
  if (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    c.sent += static_cast<std::size_t>(n);
    c.moved = clock::now();
    if (c.sent < c.out.size()) return true;
  }
  if (c.file && c.file_at < c.file_end) {
    const ssize_t n = ::sendfile(c.fd.get(), c.file.get(), &c.file_at,
                                 static_cast<std::size_t>(c.file_end - c.file_at));
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    if (n == 0) return false;  // the file shrank under us: the response cannot be completed
    c.moved = clock::now();
    if (c.file_at < c.file_end) return true;
  }
  // All sent. Closed with bytes of the request unread (a body), the socket would be reset, and a
  // client still sending would lose the answer: so the server's side is shut, and the rest read
  // away until the client closes too (or is silent for a moment).
  ::shutdown(c.fd.get(), SHUT_WR);
  c.draining = true;
  c.until = clock::now() + linger;
  return true;
}

void report_server::state::accept_all() {
  while (connections.size() < max_connections) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    unique_fd fd(::accept4(listener.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EMFILE || errno == ENFILE) accept_again = clock::now() + std::chrono::milliseconds(100);
      return;
    }
    char text[INET6_ADDRSTRLEN] = "?";
    const void* a = peer.ss_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in&>(peer).sin_addr)
                                              : &reinterpret_cast<sockaddr_in6&>(peer).sin6_addr;
    ::inet_ntop(peer.ss_family, a, text, sizeof text);
    connections.push_back(connection{.fd = std::move(fd), .peer = text});
  }
}

void report_server::serve(const fs::path& out) {
  state& s = *s_;
  struct closing {  // however serve() ends, no connection is accepted that nobody would answer
    unique_fd& listener;
    ~closing() { listener.reset(); }
  } closing{s.listener};
  s.open(out);
  bool stopping = false;
  clock::time_point give_up{};
  std::vector<pollfd> fds;
  while (!stopping || !s.connections.empty()) {
    fds.clear();
    fds.push_back({s.wake.get(), POLLIN, 0});
    fds.push_back({s.watch.get(), POLLIN, 0});
    // (not while full, or out of descriptors for a while: a waiting connection would wake it at once)
    const bool accepting = !stopping && s.connections.size() < max_connections && clock::now() >= s.accept_again;
    fds.push_back({s.listener.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    auto wait = stopping ? give_up : clock::now() + hold;
    if (s.accept_again > clock::now()) wait = std::min(wait, s.accept_again);
    for (const auto& c : s.connections) {
      const bool writing = !c.out.empty() && (c.sent < c.out.size() || c.file_at < c.file_end);
      // (a held poll is watched for its reader hanging up, not for more bytes, which browsers never send)
      fds.push_back({c.fd.get(), static_cast<short>(c.waiting ? POLLRDHUP : writing ? POLLOUT : POLLIN), 0});
      wait = std::min(wait, c.waiting || c.draining ? c.until : c.moved + silence);
    }
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wait - clock::now()).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(ms, 0))) < 0 && errno != EINTR)
      throw internal_error(std::string("report server: poll: ") + std::strerror(errno));
    bool news = false;
    if (fds[0].revents & POLLIN) {  // stop(): the held polls get the last state, then the rest is flushed
      std::uint64_t n;
      [[maybe_unused]] const auto r = ::read(s.wake.get(), &n, sizeof n);
      stopping = true;
      give_up = clock::now() + flush_at_stop;
      s.refresh();
      for (auto& c : s.connections)
        if (c.waiting) s.answer_news(c, true);
    }
    if (fds[1].revents & POLLIN) {
      alignas(inotify_event) char buf[4096];
      while (::read(s.watch.get(), buf, sizeof buf) > 0) news = true;
    }
    if (fds[2].revents & POLLIN) s.accept_all();
    std::size_t k = 3;
    for (auto it = s.connections.begin(); it != s.connections.end(); ++k) {
      // (a connection accepted in this round has no pollfd yet: it is pumped next round)
      const bool ready = k < fds.size() && fds[k].fd == it->fd.get() && fds[k].revents != 0;
      it = !ready || s.pump(*it, fds[k].revents) ? std::next(it) : s.connections.erase(it);
    }
    if (news) s.refresh();
    const auto now = clock::now();
    for (auto& c : s.connections)
      if (c.waiting && (c.since != s.generation || !s.running || now >= c.until)) s.answer_news(c, false);
    // A client that sends no request, or reads none of its answer, does not keep its place.
    s.connections.remove_if(
        [&](const connection& c) { return c.draining ? now >= c.until : !c.waiting && now >= c.moved + silence; });
    if (stopping && now >= give_up) break;
  }
}

}  // namespace isorun::sweep
