// The result ring on its own, on the CPU: a payload streamed from a writer process (exec'd, as
// a worker is, so no page of the receiver is shared copy-on-write) through the ring into the
// receiver's private memory, checksummed on both sides. Prints the time from the start signal
// to the validated payload, and the receiver's voluntary context switches (how often its copying
// threads slept and were woken).
//   bench_stream [--mib N] [--reps R] [--hashed-before]
//   --hashed-before: the writer's chunk hashes are known beforehand (as when a device computed
//   them), so it publishes each slot as soon as it is filled, with no hasher threads.
//   ISORUN_STREAM_THREADS=READERS,HASHERS sets the thread counts (e.g. 8,1 to see a herd).
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "isorun/serialization/result_stream.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "isorun/serialization/shm_segment.hpp"
#include "stats.hpp"

extern char** environ;

namespace {
namespace ser = isorun::serialization;
constexpr std::uint64_t MiB = 1ULL << 20;
constexpr int ring_fd = 3, event_fd = 4;  // where the writer finds them

std::byte byte_at(std::uint64_t i) { return static_cast<std::byte>(i >> 20); }  // one value per MiB

void fill(std::byte* dst, std::uint64_t offset, std::uint64_t n) {
  for (std::uint64_t done = 0; done < n;) {  // a memset per MiB of the payload
    const std::uint64_t at = offset + done, m = std::min(n - done, MiB - at % MiB);
    std::memset(dst + done, std::to_integer<int>(byte_at(at)), m);
    done += m;
  }
}

int writer(std::uint64_t total, bool hashed_before) {
  const auto ring = ser::mapping::map(ring_fd, ser::ring_bytes, ser::mapping::access::read_write, false);
  std::vector<std::uint64_t> hashes;
  if (hashed_before) {
    std::vector<std::byte> chunk(ser::checksum_chunk);
    for (std::uint64_t at = 0; at < total; at += ser::checksum_chunk) {
      const std::uint64_t n = std::min(ser::checksum_chunk, total - at);
      fill(chunk.data(), at, n);
      hashes.push_back(XXH3_64bits(chunk.data(), n));
    }
  }
  ser::stream_writer(ring.data(), event_fd).write(total, fill, hashes);
  return 0;
}

struct sample {
  double ms;
  long switches;
};

sample one_stream(const char* self, std::uint64_t total, bool hashed_before) {
  auto ring = ser::segment_pool::rings().acquire(ser::ring_bytes);
  ser::reset_ring(ring->writable(ser::ring_bytes, false));
  const int event = ::eventfd(0, EFD_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, ring->fd(), ring_fd);  // dup2 clears close-on-exec
  posix_spawn_file_actions_adddup2(&fa, event, event_fd);
  const std::string size = std::to_string(total);
  std::vector<char*> argv = {const_cast<char*>(self), const_cast<char*>("--writer"), const_cast<char*>(size.c_str()),
                             const_cast<char*>(hashed_before ? "1" : "0"), nullptr};
  pid_t pid = 0;
  if (::posix_spawn(&pid, self, &fa, nullptr, argv.data(), environ) != 0) std::exit(1);
  posix_spawn_file_actions_destroy(&fa);
  std::uint64_t started = 0;
  if (::read(event, &started, sizeof started) != sizeof started) std::exit(1);
  rusage r0{}, r1{};
  ::getrusage(RUSAGE_SELF, &r0);
  const auto t0 = std::chrono::steady_clock::now();
  {
    ser::stream_reader reader(ring, 1ULL << 40);
    int status = 0;
    ::waitpid(pid, &status, 0);
    reader.stop_waiting();
    const auto got = reader.finish();
    if (status != 0 || got.payload.size() != total || got.payload[total - 1] != byte_at(total - 1)) {
      std::fprintf(stderr, "bench_stream: the stream came back wrong\n");
      std::exit(1);
    }
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ::getrusage(RUSAGE_SELF, &r1);  // the receiving threads are joined: their counts are in
  ::close(event);
  return {ms, r1.ru_nvcsw - r0.ru_nvcsw};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--writer") return writer(std::stoull(argv[2]), argv[3][0] == '1');
  std::uint64_t mib = 1024;
  int reps = 7;
  bool hashed_before = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) mib = std::stoull(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--hashed-before") hashed_before = true;
    else {
      std::fprintf(stderr, "usage: bench_stream [--mib N] [--reps R] [--hashed-before]\n");
      return 2;
    }
  }
  const char* threads = std::getenv("ISORUN_STREAM_THREADS");
  std::printf("result ring, %llu MiB from an exec'd writer (%s), threads %s, %ld cores\n",
              static_cast<unsigned long long>(mib),
              hashed_before ? "chunk hashes known beforehand" : "hashed by the writer's CPU",
              threads ? threads : "default", ::sysconf(_SC_NPROCESSORS_ONLN));
  one_stream(argv[0], mib * MiB, hashed_before);  // the ring's pages and the receiving memory, made once
  std::vector<double> ms, switches;
  for (int i = 0; i < reps; ++i) {
    const sample s = one_stream(argv[0], mib * MiB, hashed_before);
    ms.push_back(s.ms);
    switches.push_back(static_cast<double>(s.switches));
  }
  using isorun::bench::show;
  using isorun::bench::summarize;
  const auto t = summarize(ms);
  std::printf("  start -> validated      %s   (%.2f GB/s)\n", show(t, "ms").c_str(),
              static_cast<double>(mib * MiB) / (t.median * 1e6));
  std::printf("  receiver's sleeps       %s\n", show(summarize(switches), "voluntary switches").c_str());
  return 0;
}
