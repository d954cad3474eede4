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
  const int result_fd = assigned.fds[1];

  ser::hello_message hello;
  hello.pid = ::getpid();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) hello.visible_devices = v;
  if (const char* v = std::getenv("CUDA_DEVICE_ORDER")) hello.device_order = v;
  if (mode == "wrong_devices") hello.visible_devices = "GPU-not-the-assigned-one";
  if (mode == "wrong_pid") hello.pid = 1;
  ser::send_message(ctl, hello);
  if (mode == "exit_without_result") return 0;

  // A valid binary payload: a std::string "ok".
  const std::string value = "ok";
  const std::uint64_t n = ser::encoded_size(value);
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

  ser::done_message done;
  ser::send_message(ctl, done);
  if (mode == "crash_after_done") std::abort();
  return 0;
}
