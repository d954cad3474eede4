// Starts isolated tasks while this user may start no process (RLIMIT_NPROC 0), then again once
// the limit is lifted. Run it as an unprivileged user: root is exempt from that limit. It
// prints what happened, one "key: value" per line, for the test to check:
//   refused: the error of the call made under the limit ("" if it was not refused)
//   fds: descriptors open before and after that call
//   children: whether a child (a zombie) was left ("none" or a pid)
//   after: the result of the call made once the limit is lifted
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "isorun/isorun.hpp"
#include "isorun/serialization/segment_pool.hpp"

namespace {

int square(int x) { return x * x; }
ISORUN_TASK(square);

int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n - 1;  // the DIR's own
}

}  // namespace

int main(int argc, char** argv) {
  isorun::init(argc, argv);
  rlimit old{};
  ::getrlimit(RLIMIT_NPROC, &old);
  const int before = open_fds();
  rlimit none = old;
  none.rlim_cur = 0;  // (an unprivileged process may lower its soft limit and raise it again)
  if (::setrlimit(RLIMIT_NPROC, &none) != 0) return 3;
  std::string refused;
  try {
    std::printf("started: %d\n", isorun::isolated(square)(3));
  } catch (const isorun::error& e) {
    refused = e.what();
  }
  ::setrlimit(RLIMIT_NPROC, &old);
  isorun::serialization::segment_pool::instance().clear();  // idle pooled segments hold descriptors
  std::printf("refused: %s\nfds: %d %d\n", refused.c_str(), before, open_fds());
  const pid_t left = ::waitpid(-1, nullptr, WNOHANG);
  std::printf("children: %s\n", left > 0 ? std::to_string(left).c_str() : "none");
  std::printf("after: %d\n", isorun::isolated(square)(4));
  return 0;
}
