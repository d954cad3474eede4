#include "isorun/serialization/control.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>
#include <system_error>
#include <vector>

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::serialization {
namespace {
constexpr std::uint32_t control_magic = 0x4352'5349;  // "ISRC"

struct frame {
  std::uint32_t magic;
  std::uint32_t kind;  // variant index + 1
};

// The most descriptors a receiver makes room for; a message with more is rejected whole.
constexpr std::size_t max_fds = 5;  // the most an assignment carries

template <class M>
M decoded(std::span<const std::byte> body) {
  M m;
  decode(body, nullptr, m);
  return m;
}
}  // namespace

ssize_t send_with_fds(int fd, std::span<const std::byte> bytes, std::span<const int> fds) {
  if (fds.size() > max_fds) {
    errno = EINVAL;
    return -1;
  }
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  while ((n = ::sendmsg(fd, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  return n;
}

ssize_t receive_with_fds(int fd, std::span<std::byte> bytes, std::span<int> fds, std::size_t& nfds, int flags,
                         int* msg_flags) {
  iovec iov{bytes.data(), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = ::recvmsg(fd, &msg, flags | MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  nfds = 0;
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
      if (nfds < fds.size()) fds[nfds++] = received;
      else ::close(received);
    }
  }
  if (msg_flags) *msg_flags = msg.msg_flags;
  return n;
}

void send_message(int fd, const control_message& message, std::span<const int> fds) {
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

  if (fds.size() > max_fds) throw wire_error("too many descriptors for one control message");
  if (send_with_fds(fd, buf, fds) < 0)
    throw std::system_error(errno, std::generic_category(), "sending control message");
}

receive_result receive_message(int fd, bool wait) {
  // Not zeroed: most messages are a few hundred bytes, and zeroing the whole would touch 16 pages.
  const std::unique_ptr<std::byte[]> buf(new std::byte[max_control_message]);
  int fds[max_fds];
  std::size_t nfds = 0;
  int flags = 0;
  ssize_t n;
  for (bool reset_seen = false;;) {
    n = receive_with_fds(fd, {buf.get(), max_control_message}, fds, nfds, (wait ? 0 : MSG_DONTWAIT) | MSG_TRUNC,
                         &flags);
    if (n >= 0) break;
    // A peer that closed its end with messages unread (a worker that died before reading its
    // assignment) leaves one ECONNRESET, reported ahead of what it sent before: read on.
    if (errno == ECONNRESET && !reset_seen) {
      reset_seen = true;
      continue;
    }
    break;
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    if (errno == ECONNRESET) return {std::nullopt, true, {}};
    throw std::system_error(errno, std::generic_category(), "receiving control message");
  }
  // Take ownership of any descriptors first, so every rejection below closes them.
  receive_result r;
  r.fds.assign(fds, fds + nfds);
  if (n == 0) {
    for (int d : r.fds) ::close(d);
    return {std::nullopt, true, {}};
  }
  struct close_unless_kept {
    receive_result& r;
    bool keep = false;
    ~close_unless_kept() {
      if (keep) return;
      for (int d : r.fds) ::close(d);
      r.fds.clear();
    }
  } guard{r};

  if (flags & MSG_CTRUNC) throw wire_error("control message carried more descriptors than any message may");
  if (static_cast<std::size_t>(n) > max_control_message)
    throw wire_error("control message of " + std::to_string(n) + " bytes exceeds the " +
                     std::to_string(max_control_message) + "-byte limit");
  if (static_cast<std::size_t>(n) < sizeof(frame)) throw wire_error("control message truncated");
  frame f;
  std::memcpy(&f, buf.get(), sizeof f);
  if (f.magic != control_magic) throw wire_error("control message has a wrong magic number");
  std::span<const std::byte> body{buf.get() + sizeof f, static_cast<std::size_t>(n) - sizeof f};
  switch (f.kind) {
    case 1: r.message = decoded<done_message>(body); break;
    case 2:
      r.message = decoded<assign_message>(body);
      if (const auto want = assign_fds(std::get<assign_message>(*r.message)); r.fds.size() != want)
        throw wire_error("assignment carried " + std::to_string(r.fds.size()) + " descriptors, not " +
                         std::to_string(want));
      break;
    default: throw wire_error("control message of unknown kind " + std::to_string(f.kind));
  }
  if (f.kind != 2 && !r.fds.empty()) throw wire_error("control message carried descriptors it should not");
  guard.keep = true;
  return r;
}

}  // namespace isorun::serialization
