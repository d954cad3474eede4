#include "isorun/serialization/protocol.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <charconv>
#include <thread>
#include <vector>

namespace isorun::serialization {

void exit_with_supervisor(int control) {
  ::prctl(PR_SET_PDEATHSIG, 0);
  std::thread([control] {
    pollfd p{control, POLLRDHUP, 0};
    for (;;) {
      if (::poll(&p, 1, -1) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
        ::kill(0, SIGKILL);
        ::_exit(137);
      }
    }
  }).detach();
}

std::string to_env(const warm_device& d) {
  return std::to_string(d.index) + ";" + (d.simulated ? "sim" : "cuda") + ";" + std::to_string(d.device_memory) + ";" +
         std::to_string(d.mem_limit) + ";" + d.uuid + ";" + d.alloc_conf;
}

std::optional<warm_device> parse_warm_device(std::string_view v) {
  std::vector<std::string_view> f;  // five fields, then the configuration (which may hold ';')
  while (f.size() < 5) {
    const auto semi = v.find(';');
    if (semi == std::string_view::npos) return std::nullopt;
    f.push_back(v.substr(0, semi));
    v.remove_prefix(semi + 1);
  }
  auto number = [](std::string_view s, auto& out) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc{} && end == s.data() + s.size();
  };
  warm_device d;
  if (!number(f[0], d.index) || d.index < 0 || (f[1] != "sim" && f[1] != "cuda") || !number(f[2], d.device_memory) ||
      !number(f[3], d.mem_limit))
    return std::nullopt;
  d.simulated = f[1] == "sim";
  d.uuid = f[4];
  d.alloc_conf = v;
  return d;
}

}  // namespace isorun::serialization
