#pragma once
/// @file report_server.hpp
/// A sweep folder's report served over HTTP and kept live while the sweep runs: `isorun report
/// OUT --serve` and `isorun sweep --serve`. The page asks for news with a long poll (GET
/// /live?since=GENERATION, held while a sweep holds the folder's lock, answered with the new page
/// as soon as the journal changes) and swaps it in without a reload. Read-only: GET and HEAD of
/// the page and of the regular files inside OUT, nothing else; bound to 127.0.0.1 by default and
/// then answering only requests addressed to the loopback (no DNS rebinding); every request shows
/// the token of the URL it prints, as Jupyter's do.

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace isorun::sweep {

class report_server {
 public:
  struct settings {
    std::string bind = "127.0.0.1";  ///< the address to listen on: an IPv4 or IPv6 literal
    int port = 0;                    ///< 0: a free one, which url() names
    /// Served beside a sweep, for as long as it runs: the pages are told it runs, wherever the
    /// folder's lock cannot be seen (/proc/locks misses some network file systems' locks).
    bool beside_sweep = false;
    /// Told of each request, as a development server logs it: `PEER "REQUEST LINE" STATUS`, the
    /// status "held" for a long poll that waits for news. Called on serve()'s thread.
    std::function<void(const std::string& line)> on_request;
  };

  /// @brief Listens at once, so that url() is known, and a port in use said, before anything
  ///        else starts (a sweep makes its folder after).
  /// @throws usage_error (a bad address; a port in use or not allowed), internal_error.
  explicit report_server(const settings& how);
  ~report_server();
  report_server(const report_server&) = delete;
  report_server& operator=(const report_server&) = delete;

  /// @brief Where a browser finds the page: http://ADDRESS:PORT/?token=TOKEN. The token (128
  ///        random bits, set as a cookie by the page) is what every request must show: another
  ///        user of the machine who finds the port cannot read the folder.
  [[nodiscard]] const std::string& url() const noexcept;

  /// @brief Serves the report of the sweep folder `out` until stop(). Pages waiting for news are
  ///        then sent the last state, marked as the server's last word, before it returns.
  /// @throws usage_error if `out` cannot be opened, internal_error.
  void serve(const std::filesystem::path& out);

  /// @brief Makes serve() return (at once if it has not begun). Async-signal-safe; any thread.
  void stop() noexcept;

 private:
  struct state;
  std::unique_ptr<state> s_;
};

}  // namespace isorun::sweep
