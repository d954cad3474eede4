// A worker that misbehaves on purpose, selected by BAD_WORKER_MODE. It speaks just enough of
// the protocol to get each kind of garbage past the earlier checks.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "isorun/serialization/codec.hpp"
#include "isorun/serialization/control.hpp"
#include "isorun/serialization/request.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "isorun/serialization/wire.hpp"

namespace ser = isorun::serialization;

int main() {
  const char* m = std::getenv("BAD_WORKER_MODE");
  const std::string mode = m ? m : "valid";
  const int ctl = ser::control_fd;

  if (mode == "garbage_control") {
    const char junk[] = "definitely not a control message";
    ::send(ctl, junk, sizeof junk, 0);
    return 0;
  }
  if (mode == "oversized_control") {
    std::vector<char> big(100 * 1024, 'x');
    ::send(ctl, big.data(), big.size(), 0);
    return 0;
  }

  // The assignment: the device as an environment to apply, and the segments' descriptors.
  ser::receive_result assigned = ser::receive_message(ctl, true);
  if (!assigned.message || !std::holds_alternative<ser::assign_message>(*assigned.message)) return 70;
  for (const auto& e : std::get<ser::assign_message>(*assigned.message).env) ::putenv(::strdup(e.c_str()));
  const int result_fd = assigned.fds[std::get<ser::assign_message>(*assigned.message).request.empty() ? 1 : 0];

  ser::done_message done;
  done.pid = ::getpid();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) done.visible_devices = v;
  if (const char* v = std::getenv("CUDA_DEVICE_ORDER")) done.device_order = v;
  if (mode == "wrong_devices") done.visible_devices = "GPU-not-the-assigned-one";
  if (mode == "wrong_pid") done.pid = 1;
  if (mode == "exit_without_result") return 0;

  // A valid binary payload: a std::string "ok".
  const std::string value = "ok";
  const std::uint64_t n = ser::encoded_size(value);
  if (mode.rfind("inline_", 0) == 0) {  // the result in `done` itself, as a worker sends a small one
    std::string bytes(ser::header_size + n, '\0');
    auto* at = reinterpret_cast<std::byte*>(bytes.data());
    std::uint64_t sum = ser::encode_into(at + ser::header_size, n, value);
    if (mode == "inline_corrupt_checksum") sum ^= 1;
    ser::write_header(at, ser::result_magic, ser::encoding::binary, mode == "inline_oversize_claim" ? n + 1 : n, sum);
    if (mode == "inline_streamed_magic")
      ser::write_header(at, ser::streamed_result_magic, ser::encoding::binary, n, sum);
    done.inline_result = bytes;
    ser::send_message(ctl, done);
    return 0;
  }
  ser::shm_file out{result_fd};
  out.reserve(ser::header_size + n);
  auto map = ser::mapping::map(out.fd(), ser::header_size + n, ser::mapping::access::read_write, false);
  std::uint64_t sum = ser::encode_into(map.data() + ser::header_size, n, value);
  std::uint64_t magic = ser::result_magic, size = n;
  auto enc = ser::encoding::binary;
  if (mode == "corrupt_checksum") sum ^= 1;
  if (mode == "bad_magic") magic = 0x1234;
  if (mode == "oversize_claim") size = 1ULL << 50;
  if (mode == "wrong_encoding") enc = ser::encoding::json;
  ser::write_header(map.data(), magic, enc, size, sum);
  if (mode == "garbage_payload") {
    // Checksum is right, content is not a string: a length prefix far beyond the payload.
    std::uint64_t huge = 1ULL << 60;
    std::memcpy(map.data() + ser::header_size, &huge, sizeof huge);
    ser::write_header(map.data(), magic, enc, size, ser::checksum({map.data() + ser::header_size, n}));
  }
  out.release();

  ser::send_message(ctl, done);
  if (mode == "crash_after_done") std::abort();
  return 0;
}
