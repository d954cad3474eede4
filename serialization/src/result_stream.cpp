#include "isorun/serialization/result_stream.hpp"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <system_error>

#include "isorun/serialization/control.hpp"
#include "isorun/serialization/machine.hpp"
#include "isorun/serialization/segment_pool.hpp"
#include "parallel.hpp"

namespace isorun::serialization {
namespace {

using counter = std::atomic_ref<std::uint32_t>;
static_assert(counter::is_always_lock_free);

// The ring's counters are shared between processes, so these are shared (not private) futexes.
// A wait ends after `ms` at the latest: a side whose peer is gone finds out from the caller, which
// checks its own stop condition between waits.
void futex_wait(std::uint32_t* word, std::uint32_t expected, long ms) noexcept {
  timespec t{ms / 1000, (ms % 1000) * 1'000'000};
  ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &t, nullptr, 0);
}

void futex_wake(std::uint32_t* word) noexcept {
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

constexpr long wait_ms = 20;

// ISORUN_STREAM_THREADS="READERS,HASHERS" overrides the thread counts below (for tuning on a
// machine; 0 keeps the default).
unsigned threads_from_env(int which, unsigned fallback) {
  const char* v = std::getenv("ISORUN_STREAM_THREADS");
  if (!v) return fallback;
  unsigned readers = 0, hashers = 0;
  if (std::sscanf(v, "%u,%u", &readers, &hashers) < 1) return fallback;
  const unsigned chosen = which == 0 ? readers : hashers;
  return chosen ? std::min(chosen, 64u) : fallback;
}

bool tracing() { return std::getenv("ISORUN_STREAM_TRACE") != nullptr; }

ring_control& control_of(std::byte* ring) noexcept { return *reinterpret_cast<ring_control*>(ring); }
std::byte* slot_of(std::byte* ring, std::uint64_t k) noexcept {
  return ring + ring_control_bytes + (k % ring_slots) * ring_slot_bytes;
}
std::uint64_t chunks_in(std::uint64_t bytes) noexcept { return (bytes + checksum_chunk - 1) / checksum_chunk; }

// Publishes slots [0, k] (in order: `filled` covers only slots whose hashes are stored) and wakes
// the supervisor's threads that wait for slot k. The slot's word changes after `filled`, so a
// reader that read the word before finding `filled` short sees it change and does not sleep.
void publish(ring_control& ctl, std::uint64_t k) noexcept {
  counter(ctl.filled).store(static_cast<std::uint32_t>(k + 1), std::memory_order_release);
  std::uint32_t& word = ctl.published[k % ring_slots];
  counter(word).fetch_add(1, std::memory_order_release);
  futex_wake(&word);
}

std::uint64_t combine(std::span<const std::uint64_t> hashes) noexcept {
  // serialization::checksum: one chunk is its own hash, more are hashed once more.
  return hashes.size() == 1 ? hashes.front() : XXH3_64bits(hashes.data(), hashes.size() * sizeof(std::uint64_t));
}

// Memory the supervisor receives streams into: anonymous, private to this process, kept for the
// next stream once its result is dropped (a fresh GiB costs a page fault and a zero-fill per
// page; a kept one is resident), up to 4 buffers and an eighth of physical memory (8 GiB at most).
class private_memory {
 public:
  static private_memory& instance() {
    static auto* pool = new private_memory;  // never destroyed: results may outlive statics
    return *pool;
  }

  // `reused`: whether the memory was kept from an earlier stream (resident) or is new.
  std::shared_ptr<std::byte> acquire(std::uint64_t bytes, bool& reused) {
    reused = false;
    const std::uint64_t size = round_up(bytes);
    void* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto best = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if (it->second >= size && (best == idle_.end() || it->second < best->second)) best = it;
      if (best != idle_.end()) {
        // A kept block is reused whole (a smaller stream uses a prefix) and goes back whole.
        void* const block = best->first;
        const std::uint64_t block_size = best->second;
        idle_.erase(best);
        reused = true;
        return {static_cast<std::byte*>(block), [this, block_size](std::byte* q) { release(q, block_size); }};
      }
    }
    p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, size, MADV_HUGEPAGE);  // where transparent huge pages are enabled: 512x fewer faults
    return {static_cast<std::byte*>(p), [this, size](std::byte* q) { release(q, size); }};
  }

 private:
  static std::uint64_t round_up(std::uint64_t n) { return (n + (2ULL << 20) - 1) & ~((2ULL << 20) - 1); }

  void release(std::byte* p, std::uint64_t size) noexcept {
    {
      std::lock_guard lock(mutex_);
      std::uint64_t idle = 0;
      for (const auto& b : idle_) idle += b.second;
      if (idle_.size() < 4 && idle + size <= limit_) {
        idle_.emplace_back(p, size);
        return;
      }
    }
    ::munmap(p, size);
  }

  std::mutex mutex_;
  std::vector<std::pair<void*, std::uint64_t>> idle_;
  const std::uint64_t limit_ = std::min<std::uint64_t>(8ULL << 30, physical_memory() / 8);
};

}  // namespace

void reset_ring(std::byte* ring) noexcept { std::memset(ring, 0, sizeof(ring_control)); }

namespace {

// One stream's slots as the writer fills them: the wait for a free slot, the fill, and the
// time each took, for ISORUN_STREAM_TRACE.
struct slot_filler {
  std::byte* ring;
  std::uint64_t total;
  const stream_writer::fill_fn& fill;
  std::int64_t fill_ns = 0, full_ns = 0;

  // Slot k % ring_slots is free once the supervisor has copied out use k - ring_slots.
  void wait_free(std::uint64_t k) {
    ring_control& ctl = control_of(ring);
    const std::int64_t t0 = monotonic_ns();
    for (std::uint32_t freed; k >= (freed = counter(ctl.freed).load(std::memory_order_acquire)) + ring_slots;)
      futex_wait(&ctl.freed, freed, wait_ms);
    full_ns += monotonic_ns() - t0;
  }

  void fill_slot(std::uint64_t k) {
    const std::int64_t t0 = monotonic_ns();
    const std::uint64_t offset = k * ring_slot_bytes;
    fill(slot_of(ring, k), offset, std::min(ring_slot_bytes, total - offset));
    fill_ns += monotonic_ns() - t0;
  }

  // `hashing`: who hashed the chunks.
  void trace(std::uint64_t slots, const std::string& hashing) const {
    if (tracing())
      std::fprintf(stderr, "isorun stream: worker: %llu slots, %s; filling %.2f ms, waiting for free slots %.2f ms\n",
                   static_cast<unsigned long long>(slots), hashing.c_str(), static_cast<double>(fill_ns) / 1e6,
                   static_cast<double>(full_ns) / 1e6);
  }
};

// With the hashes known beforehand: each slot is published as soon as it is filled.
std::uint64_t write_hashed(slot_filler& filler, std::uint64_t slots, std::span<const std::uint64_t> chunk_hashes) {
  ring_control& ctl = control_of(filler.ring);
  const std::uint64_t chunks = chunk_hashes.size();
  for (std::uint64_t k = 0; k < slots; ++k) {
    filler.wait_free(k);
    filler.fill_slot(k);
    for (std::uint64_t c = k * ring_chunks_per_slot; c < std::min(chunks, (k + 1) * ring_chunks_per_slot); ++c)
      std::atomic_ref<std::uint64_t>(ctl.chunk_hash[k % ring_slots][c % ring_chunks_per_slot])
          .store(chunk_hashes[c], std::memory_order_relaxed);
    publish(ctl, k);
  }
  filler.trace(slots, "chunks hashed on the device");
  return combine(chunk_hashes);
}

// Without them: the caller fills while `helpers` threads hash what it filled before, each slot
// published once hashed.
std::uint64_t write_hashing(slot_filler& filler, std::uint64_t slots, std::uint64_t chunks, unsigned helpers) {
  ring_control& ctl = control_of(filler.ring);
  const std::uint64_t total = filler.total;
  std::vector<std::uint64_t> hashes(chunks);
  std::mutex mutex;
  std::condition_variable landed_cv;
  std::uint64_t landed = 0;     // slots `fill` has written
  std::uint64_t published = 0;  // slots hashed and published, in order
  bool failed = false;
  std::uint32_t left[ring_slots] = {};  // per ring slot: chunks of its current use still to hash
  bool hashed[ring_slots] = {};
  std::atomic<std::uint64_t> next{0};

  // The hashers: chunk by chunk, in order of arrival; the last chunk of a slot publishes every
  // slot that is complete up to it, so `filled` only ever covers hashed slots.
  auto hasher = [&] {
    for (std::uint64_t c; (c = next++) < chunks;) {
      const std::uint64_t k = c / ring_chunks_per_slot;
      {
        std::unique_lock lock(mutex);
        landed_cv.wait(lock, [&] { return landed > k || failed; });
        if (failed) return;
      }
      const std::uint64_t at = (c % ring_chunks_per_slot) * checksum_chunk;
      const std::uint64_t n = std::min(checksum_chunk, total - c * checksum_chunk);
      const std::uint64_t h = XXH3_64bits(slot_of(filler.ring, k) + at, n);
      hashes[c] = h;
      std::atomic_ref<std::uint64_t>(ctl.chunk_hash[k % ring_slots][c % ring_chunks_per_slot])
          .store(h, std::memory_order_relaxed);
      std::lock_guard lock(mutex);
      if (--left[k % ring_slots] == 0) hashed[k % ring_slots] = true;
      while (published < slots && hashed[published % ring_slots]) {
        hashed[published % ring_slots] = false;
        publish(ctl, published++);
      }
    }
  };
  std::vector<std::thread> threads;
  auto stop_hashers = [&] {
    {
      std::lock_guard lock(mutex);
      failed = true;
    }
    landed_cv.notify_all();
    for (auto& t : threads) t.join();
  };
  try {
    for (unsigned i = 0; i < helpers; ++i) threads.emplace_back(hasher);
    for (std::uint64_t k = 0; k < slots; ++k) {
      filler.wait_free(k);  // its use before is hashed, published and copied out: its count can restart
      {
        std::lock_guard lock(mutex);
        left[k % ring_slots] = static_cast<std::uint32_t>(
            chunks_in(std::min(ring_slot_bytes, total - k * ring_slot_bytes)));
      }
      filler.fill_slot(k);
      {
        std::lock_guard lock(mutex);
        landed = k + 1;
      }
      landed_cv.notify_all();
    }
  } catch (...) {
    stop_hashers();
    throw;
  }
  for (auto& t : threads) t.join();
  filler.trace(slots, std::to_string(helpers) + " hashers");
  return combine(hashes);
}

}  // namespace

std::uint64_t stream_writer::write(std::uint64_t total, const fill_fn& fill,
                                   std::span<const std::uint64_t> chunk_hashes) {
  ring_control& ctl = control_of(ring_);
  const std::uint64_t slots = (total + ring_slot_bytes - 1) / ring_slot_bytes;
  const std::uint64_t chunks = chunks_in(total);
  const bool hashed_before = !chunk_hashes.empty();
  if (hashed_before && chunk_hashes.size() != chunks)
    throw std::invalid_argument("stream_writer: " + std::to_string(chunk_hashes.size()) + " chunk hashes for " +
                                std::to_string(chunks) + " chunks");
  // Without hashes from the device, the caller fills while these hash what it filled before. A
  // quarter of the cores hash faster than a device copies; the rest are left to the supervisor,
  // which copies.
  const unsigned helpers = hashed_before
                               ? 0u
                               : static_cast<unsigned>(std::min<std::uint64_t>(
                                     chunks, threads_from_env(1, std::clamp(detail::threads_for(total) / 4, 1u, 8u))));
  std::atomic_ref<std::uint32_t>(ctl.writer_threads).store(1 + helpers, std::memory_order_relaxed);
  std::atomic_ref<std::uint64_t>(ctl.total).store(total, std::memory_order_release);
  const std::uint64_t one = 1;
  if (::write(start_event_, &one, sizeof one) != sizeof one)
    throw std::system_error(errno, std::generic_category(), "signalling the start of a result stream");

  slot_filler filler{ring_, total, fill};
  return hashed_before ? write_hashed(filler, slots, chunk_hashes) : write_hashing(filler, slots, chunks, helpers);
}

stream_reader::stream_reader(std::shared_ptr<pooled_segment> ring, std::uint64_t max_payload)
    : ring_{std::move(ring)}, mapped_{ring_->writable(ring_bytes, false)} {  // the mapping it already has
  total_ = std::atomic_ref<std::uint64_t>(control_of(mapped_).total).load(std::memory_order_acquire);  // read once
  if (total_ == 0) throw wire_error("a result stream of 0 bytes");
  if (total_ > max_payload)
    throw wire_error("streamed result of " + std::to_string(total_) + " bytes exceeds the limit of " +
                     std::to_string(max_payload) + " bytes");
  chunks_ = chunks_in(total_);
  started_ns_ = monotonic_ns();
  memory_ = private_memory::instance().acquire(total_, memory_reused_);
  hashes_.resize(chunks_);
  copied_in_slot_.assign(ring_slots, 0);
  // The cores the worker's device copy (and its hashers, unless the device hashed) leave.
  const unsigned cores = detail::threads_for(total_);
  const unsigned writer = std::clamp(
      std::atomic_ref<std::uint32_t>(control_of(mapped_).writer_threads).load(std::memory_order_relaxed), 1u, cores);
  const unsigned n = static_cast<unsigned>(
      std::min<std::uint64_t>(chunks_, threads_from_env(0, cores <= 2 ? cores : std::max(2u, cores - writer))));
  threads_count_ = n;
  try {
    for (unsigned i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
  } catch (...) {  // fewer threads than wanted still finish the stream
    if (threads_.empty()) throw;
  }
}

stream_reader::~stream_reader() {
  stop_waiting();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

bool stream_reader::wait_filled(std::uint32_t slot) {
  ring_control& ctl = control_of(mapped_);
  std::uint32_t* word = &ctl.published[slot % ring_slots];
  const std::int64_t t0 = monotonic_ns();
  for (;;) {
    const std::uint32_t seen = counter(*word).load(std::memory_order_acquire);  // before `filled`: see publish()
    if (counter(ctl.filled).load(std::memory_order_acquire) > slot) {
      waited_ns_ += monotonic_ns() - t0;
      return true;
    }
    if (stop_waiting_.load()) return false;
    futex_wait(word, seen, wait_ms);
  }
}

void stream_reader::stop_waiting() noexcept {
  stop_waiting_ = true;
  // Changing every slot's word wakes a thread that is about to sleep on it, too.
  for (std::uint32_t& word : control_of(mapped_).published) {
    counter(word).fetch_add(1, std::memory_order_release);
    futex_wake(&word);
  }
}

void stream_reader::run() {
  ring_control& ctl = control_of(mapped_);
  constexpr std::uint64_t piece = 256 * 1024;  // copied, then hashed while still in the cache
  XXH3_state_t* state = XXH3_createState();
  if (!state) return;
  for (std::uint64_t c; (c = next_chunk_++) < chunks_;) {
    const std::uint64_t k = c / ring_chunks_per_slot;
    if (!wait_filled(static_cast<std::uint32_t>(k))) break;
    const std::uint64_t at = c * checksum_chunk, n = std::min(checksum_chunk, total_ - at);
    const std::byte* src = slot_of(mapped_, k) + (c % ring_chunks_per_slot) * checksum_chunk;
    std::byte* dst = memory_.get() + at;
    XXH3_64bits_reset(state);
    for (std::uint64_t off = 0; off < n; off += piece) {
      const std::uint64_t m = std::min(piece, n - off);
      std::memcpy(dst + off, src + off, m);
      XXH3_64bits_update(state, dst + off, m);
    }
    hashes_[c] = XXH3_64bits_digest(state);
    const std::uint64_t theirs = std::atomic_ref<std::uint64_t>(
                                     ctl.chunk_hash[k % ring_slots][c % ring_chunks_per_slot])
                                     .load(std::memory_order_relaxed);
    std::lock_guard lock(mutex_);
    if (hashes_[c] != theirs && error_.empty())
      error_ = "chunk " + std::to_string(c) + " of the streamed result differs from what the worker hashed";
    if (++done_chunks_ == chunks_) whole_ns_ = monotonic_ns();
    // Free slots in order, once all their chunks are copied: the worker refills them. (The
    // count is this side's own; the shared word only tells the worker.)
    ++copied_in_slot_[k % ring_slots];
    bool woke = false;
    while (freed_ * ring_slot_bytes < total_ &&
           copied_in_slot_[freed_ % ring_slots] ==
               chunks_in(std::min(ring_slot_bytes, total_ - freed_ * ring_slot_bytes))) {
      copied_in_slot_[freed_ % ring_slots] = 0;
      ++freed_;
      counter(ctl.freed).store(static_cast<std::uint32_t>(freed_), std::memory_order_release);
      woke = true;
    }
    if (woke) futex_wake(&ctl.freed);
  }
  XXH3_freeState(state);
}

stream_reader::received stream_reader::finish() {
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  std::lock_guard lock(mutex_);
  if (!error_.empty()) throw wire_error(error_);
  if (done_chunks_ != chunks_)
    throw wire_error("the result stream ended after " +
                     std::to_string(std::min(total_, done_chunks_ * checksum_chunk)) + " of " + std::to_string(total_) +
                     " bytes");
  if (tracing())  // the supervisor's side of the worker's trace
    std::fprintf(stderr,
                 "isorun stream: supervisor: %llu bytes into %s memory on %u threads, whole %.2f ms after it began "
                 "(%.2f ms waiting for slots, per thread)\n",
                 static_cast<unsigned long long>(total_), memory_reused_ ? "kept" : "new", threads_count_,
                 static_cast<double>(whole_ns_ - started_ns_) / 1e6,
                 static_cast<double>(waited_ns_.load()) / 1e6 / std::max(1u, threads_count_));
  std::shared_ptr<const void> owner = memory_;
  return {std::span<const std::byte>(memory_.get(), total_), std::move(owner), combine(hashes_)};
}

}  // namespace isorun::serialization
