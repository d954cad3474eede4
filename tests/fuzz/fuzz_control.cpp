// Control messages as they arrive on the socket: framing, size limits, decoding, and
// descriptors only where allowed (none are sent here).
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include <system_error>

#include "isorun/serialization/control.hpp"
#include "isorun/serialization/wire.hpp"

namespace ser = isorun::serialization;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static int sv[2] = {-1, -1};
  if (sv[0] < 0 && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  if (::send(sv[0], data, size, MSG_NOSIGNAL) != static_cast<ssize_t>(size)) return 0;  // over the socket's limit
  try {
    auto r = ser::try_receive(sv[1]);
    for (int fd : r.fds) ::close(fd);
  } catch (const ser::wire_error&) {
  } catch (const std::system_error&) {
  }
  return 0;
}
