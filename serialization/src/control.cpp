#include "isorun/serialization/control.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <system_error>
#include <vector>

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>

#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::serialization {
namespace {
constexpr std::uint32_t control_magic = 0x4352'5349;  // "ISRC"

struct frame {
  std::uint32_t magic;
  std::uint32_t kind;  // variant index + 1
};
}  // namespace

void send_message(int fd, const control_message& message) {
  std::vector<std::byte> buf(sizeof(frame));
  std::visit(
      [&](const auto& m) {
        const std::uint64_t n = encoded_size(m);
        if (n > max_control_message - sizeof(frame)) throw wire_error("control message too large to send");
        buf.resize(sizeof(frame) + n);
        encode_into(buf.data() + sizeof(frame), n, m);
      },
      message);
  const frame f{control_magic, static_cast<std::uint32_t>(message.index() + 1)};
  std::memcpy(buf.data(), &f, sizeof f);
  for (;;) {
    ssize_t n = ::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL);
    if (n >= 0) return;
    if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "sending control message");
  }
}

receive_result try_receive(int fd) {
  std::vector<std::byte> buf(max_control_message);
  ssize_t n;
  do {
    n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT | MSG_TRUNC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    if (errno == ECONNRESET) return {std::nullopt, true};
    throw std::system_error(errno, std::generic_category(), "receiving control message");
  }
  if (n == 0) return {std::nullopt, true};
  if (static_cast<std::size_t>(n) > buf.size())
    throw wire_error("control message of " + std::to_string(n) + " bytes exceeds the " +
                     std::to_string(max_control_message) + "-byte limit");
  if (static_cast<std::size_t>(n) < sizeof(frame)) throw wire_error("control message truncated");
  frame f;
  std::memcpy(&f, buf.data(), sizeof f);
  if (f.magic != control_magic) throw wire_error("control message has a wrong magic number");
  std::span<const std::byte> body{buf.data() + sizeof f, static_cast<std::size_t>(n) - sizeof f};
  receive_result r;
  switch (f.kind) {
    case 1: {
      hello_message m;
      decode(body, nullptr, m);
      r.message = m;
      break;
    }
    case 2: {
      done_message m;
      decode(body, nullptr, m);
      r.message = m;
      break;
    }
    default:
      throw wire_error("control message of unknown kind " + std::to_string(f.kind));
  }
  return r;
}

}  // namespace isorun::serialization
