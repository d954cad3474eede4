#pragma once
// The floors of what a standby call does between two processes, measured beside it: a round trip
// through a pipe, one passing a fresh memfd with SCM_RIGHTS that the other side maps, writes and
// unmaps before it answers, and a futex wake in shared memory each way. Each peer is a process of
// its own (forked, then only system calls, with only its own descriptors), asleep in its wait
// before each round trip. Make the peers before anything else: a fork copies the whole process.
// The kernel keeps such a pair on one CPU (each wakes the other on the waker's CPU), so these are
// same-CPU wake-ups; `pipe_across` pins the two ends to two CPUs, each wake-up then that of an
// idle CPU, as a sleeping worker's was before the caller handed it its CPU (cpu_handoff.hpp).
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <span>

#include "isorun/serialization/control.hpp"

namespace isorun::bench {

class ipc_peer {
 public:
  enum kind_t { pipe_trip, memfd_trip, futex_trip, pipe_across };

  explicit ipc_peer(kind_t kind) : kind_{kind} {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    ::sched_getaffinity(0, sizeof allowed, &allowed);
    for (int cpu = 0, found = 0; cpu < CPU_SETSIZE && found < 2; ++cpu)
      if (CPU_ISSET(cpu, &allowed)) cpus_[found++] = cpu;
    words_ = static_cast<std::atomic<std::uint32_t>*>(
        ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (words_ == MAP_FAILED || ::pipe2(to_, O_CLOEXEC) != 0 || ::pipe2(from_, O_CLOEXEC) != 0 ||
        ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sock_) != 0)
      std::abort();
    new (&words_[0]) std::atomic<std::uint32_t>(0);
    new (&words_[1]) std::atomic<std::uint32_t>(0);
    pid_ = ::fork();
    if (pid_ < 0) std::abort();
    if (pid_ == 0) serve();
  }

  ipc_peer(const ipc_peer&) = delete;
  ipc_peer& operator=(const ipc_peer&) = delete;
  ~ipc_peer() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    for (int fd : {to_[0], to_[1], from_[0], from_[1], sock_[0], sock_[1]}) ::close(fd);
    ::munmap(words_, 4096);
  }

  /// @brief Whether this floor can be measured here (`pipe_across` needs two CPUs).
  [[nodiscard]] bool available() const noexcept { return kind_ != pipe_across || cpus_[1] >= 0; }

  /// One round trip, in milliseconds.
  double round_trip_ms() {
    cpu_set_t had;
    if (kind_ == pipe_across) {  // this end on the first CPU, the peer on the second (untimed)
      ::sched_getaffinity(0, sizeof had, &had);
      pin(cpus_[0]);
    }
    const auto t0 = std::chrono::steady_clock::now();
    char c = 1;
    switch (kind_) {
      case pipe_trip:
      case pipe_across:
        if (::write(to_[1], &c, 1) != 1 || ::read(from_[0], &c, 1) != 1) std::abort();
        break;
      case memfd_trip: {
        const int fd = static_cast<int>(::syscall(SYS_memfd_create, "isorun-floor", MFD_CLOEXEC));
        if (fd < 0 || ::ftruncate(fd, 4096) != 0) std::abort();
        send_fd(fd);
        ::close(fd);
        if (::read(sock_[0], &c, 1) != 1) std::abort();
        break;
      }
      case futex_trip: {
        const std::uint32_t seq = ++sent_;
        words_[0].store(seq, std::memory_order_release);
        futex(&words_[0], FUTEX_WAKE, 1);
        while (words_[1].load(std::memory_order_acquire) != seq) futex(&words_[1], FUTEX_WAIT, seq - 1);
        break;
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (kind_ == pipe_across) ::sched_setaffinity(0, sizeof had, &had);
    return std::chrono::duration<double, std::milli>(t1 - t0).count();
  }

 private:
  static void pin(int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ::sched_setaffinity(0, sizeof one, &one);
  }
  static long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value) {
    return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, nullptr, nullptr, 0);
  }
  void send_fd(int fd) {
    const char byte = 1;
    if (serialization::send_with_fds(sock_[0], std::as_bytes(std::span(&byte, 1)), std::span(&fd, 1)) != 1)
      std::abort();
  }
  [[noreturn]] void serve() {
    // Only its own descriptors: a copy of the parent's others (a worker's socket, a pidfd) held
    // here would change what the parent's calls see (a hang-up that never comes).
    const int keep[] = {to_[0], from_[1], sock_[1]};
    for (int fd = 3; fd < 4096; ++fd)
      if (std::find(std::begin(keep), std::end(keep), fd) == std::end(keep)) ::close(fd);
    if (kind_ == pipe_across && cpus_[1] >= 0) pin(cpus_[1]);
    char c;
    for (std::uint32_t seen = 0;;) {
      switch (kind_) {
        case pipe_trip:
        case pipe_across:
          if (::read(to_[0], &c, 1) != 1 || ::write(from_[1], &c, 1) != 1) ::_exit(0);
          break;
        case memfd_trip: {
          iovec iov{&c, 1};
          alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
          msghdr msg{};
          msg.msg_iov = &iov;
          msg.msg_iovlen = 1;
          msg.msg_control = control;
          msg.msg_controllen = sizeof control;
          if (::recvmsg(sock_[1], &msg, MSG_CMSG_CLOEXEC) != 1) ::_exit(0);
          int fd;
          std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof fd);
          void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          if (p == MAP_FAILED) ::_exit(1);
          static_cast<char*>(p)[0] = 1;
          ::munmap(p, 4096);
          ::close(fd);
          if (::write(sock_[1], &c, 1) != 1) ::_exit(0);
          break;
        }
        case futex_trip:
          while (words_[0].load(std::memory_order_acquire) == seen) futex(&words_[0], FUTEX_WAIT, seen);
          seen = words_[0].load(std::memory_order_acquire);
          words_[1].store(seen, std::memory_order_release);
          futex(&words_[1], FUTEX_WAKE, 1);
          break;
      }
    }
  }

  kind_t kind_;
  int cpus_[2] = {-1, -1};  // the first two CPUs this process may run on
  pid_t pid_ = -1;
  int to_[2] = {-1, -1}, from_[2] = {-1, -1}, sock_[2] = {-1, -1};
  std::atomic<std::uint32_t>* words_ = nullptr;
  std::uint32_t sent_ = 0;
};

}  // namespace isorun::bench
