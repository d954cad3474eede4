#pragma once
/// @file control.hpp
/// Control messages between supervisor and worker over a SOCK_SEQPACKET socket pair: small,
/// framed, validated. Bulk data never travels here; it goes through shared memory, whose
/// descriptors travel with the assignment. The order of the messages: protocol.hpp.

#include <sys/types.h>

#include <time.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "isorun/internal_api.hpp"
#include "isorun/serialization/cpu_handoff.hpp"
#include "isorun/serialization/protocol.hpp"

namespace isorun::serialization {

/// Largest control message either side accepts.
inline constexpr std::size_t max_control_message = 64 * 1024;

/// @brief CLOCK_MONOTONIC in nanoseconds: system-wide, so worker and supervisor timestamps in
///        these messages compare directly.
inline std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// A request or a result (header and payload) at most this large travels in the control message
/// itself, not through a segment: copied once, it needs no mapping, growing or seal on either
/// side, and no descriptor. Larger ones go through shared memory.
inline constexpr std::size_t inline_limit = std::size_t{16} << 10;  // 16 KiB

/// @brief A request or result carried in a message, copied to memory aligned as a mapped
///        segment is (64 bytes; the payload follows a 64-byte header), so that what decodes in
///        place from a segment decodes in place from the copy too.
inline std::shared_ptr<std::byte> aligned_copy(std::string_view bytes) {
  constexpr std::align_val_t alignment{64};
  std::shared_ptr<std::byte> copy(static_cast<std::byte*>(::operator new(bytes.size(), alignment)),
                                  [](std::byte* p) { ::operator delete(p, alignment); });
  std::memcpy(copy.get(), bytes.data(), bytes.size());
  return copy;
}

/// Sent by the supervisor to give a launched worker its task. Carries the request itself when
/// small, and as SCM_RIGHTS the request segment's descriptor (when the request is not carried),
/// the result segment's, with `stdout_attached` the file the task's stdout
/// goes to (so a worker launched ahead of its task can still write its own log file), and with
/// `stream_attached` a result ring and the eventfd that announces a stream (result_stream.hpp).
struct assign_message {
  std::uint32_t protocol = protocol_version;
  /// "KEY=VALUE" the worker sets before anything else (the device assignment, protocol.hpp's
  /// env::gpu / env::mem_limit / env::visible_devices / env::device_order, and the job's own).
  std::vector<std::string> env;
  bool stdout_attached = false;  ///< a descriptor follows the segments': the worker's new stdout
  bool stream_attached = false;  ///< two descriptors come last: a result ring, its start eventfd
  /// The request segment's bytes (header, payload) when they fit inline_limit; empty when the
  /// request segment's descriptor comes first instead.
  std::string request;
  /// The worker's CPU affinity, to restore before anything else: narrowed to the supervisor's
  /// CPU for its wake-up (cpu_handoff.hpp). Empty: left as it was.
  cpu_mask cpus;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(protocol, env, stdout_attached, stream_attached, request, cpus);
  }
};

/// @brief Descriptors `a` carries: the request segment unless the request is carried, the result
///        segment, its stdout and its result ring when attached.
inline std::size_t assign_fds(const assign_message& a) {
  return (a.request.empty() ? 2 : 1) + (a.stdout_attached ? 1 : 0) + (a.stream_attached ? 2 : 0);
}

/// How a task ended inside the worker.
enum class task_status : std::uint8_t {
  ok = 0,
  task_error = 1,
  out_of_memory = 2,
  result_too_large = 3,  ///< the result exceeds the supervisor's --max-result; it was not written
};

/// Sent by the worker when the task has finished: how it ended, who the worker is and what it
/// sees (checked against the assignment), and a small result itself (else the result, if any,
/// is in the result segment).
struct done_message {
  std::uint32_t protocol = protocol_version;
  std::int64_t pid = 0;
  std::string visible_devices;  ///< CUDA_VISIBLE_DEVICES as the worker sees it
  std::string device_order;     ///< CUDA_DEVICE_ORDER as the worker sees it
  task_status status = task_status::ok;
  std::string error_type;            ///< demangled exception type, for task_error / out_of_memory
  std::string message;               ///< exception message (truncated to fit a control message)
  std::uint64_t peak_allocated = 0;  ///< allocator peak, bytes (0 when unknown)
  std::uint64_t peak_reserved = 0;
  std::uint64_t run_ns = 0;          ///< time inside the task function
  std::uint64_t encode_ns = 0;       ///< time to encode the result into shared memory
  std::int64_t encode_begin_ns = 0;  ///< CLOCK_MONOTONIC when encoding began
  // Where the worker's part of the call went (CLOCK_MONOTONIC; 0 where a worker does not say).
  std::int64_t assigned_ns = 0;  ///< it had its assignment
  std::int64_t request_ns = 0;   ///< its request mapped, its task's libraries loaded
  std::int64_t sent_ns = 0;      ///< it sent this message: the result written (and let go, early)
  /// The result segment's bytes (header, payload) when they fit inline_limit; empty when
  /// the result is in the segment (or there is none).
  std::string inline_result;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(protocol, pid, visible_devices, device_order, status, error_type, message, peak_allocated, peak_reserved, run_ns,
       encode_ns, encode_begin_ns, assigned_ns, request_ns, sent_ns, inline_result);
  }
};

using control_message = std::variant<done_message, assign_message>;

/// @brief Sends `bytes` as one datagram on `fd`, with `fds` (at most 5) attached as SCM_RIGHTS
///        (the caller keeps its copies), retrying on EINTR: what every message that passes
///        descriptors between isorun's processes goes through.
/// @return sendmsg's result: the bytes sent, or -1 with errno set (EINVAL: too many descriptors).
ISORUN_INTERNAL_API ssize_t send_with_fds(int fd, std::span<const std::byte> bytes, std::span<const int> fds);

/// @brief Receives one datagram on `fd` into `bytes` and the descriptors that came with it
///        (close-on-exec) into `fds`, `nfds` of them; any beyond `fds`' room are closed. Retries
///        on EINTR: what every message that passes descriptors between isorun's processes
///        comes through (send_with_fds's counterpart).
/// @param flags recvmsg's (MSG_DONTWAIT, MSG_TRUNC); `msg_flags`, where given, gets the
///        message's (MSG_TRUNC, MSG_CTRUNC: more descriptors came than any message may carry).
/// @return recvmsg's result: the datagram's bytes, 0 at the peer's end, or -1 with errno set.
ISORUN_INTERNAL_API ssize_t receive_with_fds(int fd, std::span<std::byte> bytes, std::span<int> fds, std::size_t& nfds,
                                             int flags = 0, int* msg_flags = nullptr);

/// @brief Sends one message, with `fds` attached as SCM_RIGHTS (the caller keeps its copies);
///        retries on EINTR.
/// @throws std::system_error on a socket error (e.g. the peer is gone).
ISORUN_INTERNAL_API void send_message(int fd, const control_message& message, std::span<const int> fds = {});

/// Result of a receive.
struct receive_result {
  std::optional<control_message> message;  ///< set when a message arrived
  bool closed = false;                     ///< the peer closed its end
  /// Descriptors that came with the message (close-on-exec), owned by the receiver. Only an
  /// assign_message may carry them, exactly assign_fds of them; anything else is rejected.
  std::vector<int> fds;
};

/// @brief Receives at most one message; without `wait`, returns at once when none is queued.
/// @throws wire_error for an oversized, truncated, unknown or undecodable message, or one with
///         descriptors it should not carry (those are closed).
/// @throws std::system_error on a socket error.
ISORUN_INTERNAL_API receive_result receive_message(int fd, bool wait);

/// @brief receive_message(fd, false).
inline receive_result try_receive(int fd) { return receive_message(fd, false); }

}  // namespace isorun::serialization
