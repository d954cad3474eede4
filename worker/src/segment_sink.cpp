#include "isorun/worker/segment_sink.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "isorun/serialization/control.hpp"
#include "isorun/serialization/wire.hpp"

namespace isorun::worker {
namespace ser = isorun::serialization;

namespace {
segment_sink* installed_sink = nullptr;  // the one install_blob_placement() made, for the fork handlers
}  // namespace

segment_sink::segment_sink(ser::shm_file file, std::uint64_t max_result, ser::shm_file ring, int stream_event)
    : file_{std::move(file)},
      max_result_{max_result},
      owner_pid_{::getpid()},
      ring_{std::move(ring)},
      stream_event_{stream_event} {}

segment_sink::~segment_sink() {
  take_premapped(true);
  if (stream_event_ >= 0) ::close(stream_event_);
}

void segment_sink::premap_in_background(std::uint64_t expected) {
  std::lock_guard lock(mutex_);
  const std::uint64_t size = std::min(file_.size(), ser::header_size + expected);
  if (expected < premap_threshold || size < premap_threshold || premapper_.joinable()) return;
  try {
    premapper_ = std::thread([this, size] {
      try {
        premapped_ = ser::mapping::map(file_.fd(), size, ser::mapping::access::read_write, false);
        // Faulted in piece by piece: a MAP_POPULATE of the whole holds the address-space lock
        // throughout, so any mmap or munmap of the task's, or of a small result's, would wait
        // for the whole GiB. MADV_POPULATE_READ (Linux 5.14; as fast as MAP_POPULATE) leaves a
        // shared segment's pages writable as they are; without it they fault in when written.
        constexpr std::uint64_t piece = 4ULL << 20;
        for (std::uint64_t at = 0; at < size && !stop_premap_.load(std::memory_order_relaxed); at += piece)
          if (::madvise(premapped_.data() + at, std::min(piece, size - at), MADV_POPULATE_READ) != 0) break;
      } catch (...) {  // area_locked() maps it itself
      }
    });
  } catch (...) {  // no thread: area_locked() maps it itself
  }
}

std::byte* segment_sink::claim_area(std::uint64_t size) {
  std::lock_guard lock(mutex_);
  return claim_locked(size, nullptr);
}

std::byte* segment_sink::reserve(std::uint64_t size, const std::byte* blob_bytes) {
  run_end_ns_ = ser::monotonic_ns();
  std::lock_guard lock(mutex_);
  // A small result with nothing of the task's in the segment (no output_blob, no placed blob):
  // written here and sent in `done`, the segment left untouched.
  if (!claimed_ && !placed_ && size <= max_result_ && ser::header_size + size <= ser::inline_limit) {
    // A mapping still being made ahead (for a large result, as the last was) is not needed: its
    // making stops after the piece in progress, as for a small result in the segment.
    if (ser::mapping ahead = take_premapped(true); ahead.size() > map_.size()) map_ = std::move(ahead);
    inline_.assign(ser::header_size + size, '\0');
    inlined_ = claimed_ = true;
    return reinterpret_cast<std::byte*>(inline_.data()) + ser::header_size;
  }
  inlined_ = false;
  return claim_locked(size, blob_bytes);
}

void segment_sink::commit(std::uint64_t size, std::uint64_t checksum, ser::encoding enc) {
  std::lock_guard lock(mutex_);
  ser::write_header(inlined_ ? reinterpret_cast<std::byte*>(inline_.data()) : map_.data(), ser::result_magic, enc, size,
                    checksum);
  committed_ = true;
  committed_ns_ = ser::monotonic_ns();
}

std::string segment_sink::take_inline_result() {
  std::lock_guard lock(mutex_);
  return inlined_ && committed_ ? std::move(inline_) : std::string{};
}

void segment_sink::commit_streamed(std::uint64_t blob_size) {
  if (!streamed_ || stream_total_ != sizeof(std::uint64_t) + blob_size)
    throw std::logic_error("a streamed blob returned without its stream (return what device_result() returned)");
  run_end_ns_ = ser::monotonic_ns();
  std::lock_guard lock(mutex_);
  claim_locked(0, nullptr);  // the header alone
  ser::write_header(map_.data(), ser::streamed_result_magic, ser::encoding::binary, stream_total_, stream_checksum_);
  committed_ns_ = ser::monotonic_ns();
}

std::span<std::byte> segment_sink::slots(std::uint64_t total) {
  const auto all = writer().slots();
  const std::uint64_t page = 4096;
  return all.first(std::min<std::uint64_t>(all.size(), (total + page - 1) / page * page));
}

void segment_sink::write(std::uint64_t total, const fill_fn& fill, std::span<const std::uint64_t> chunk_hashes) {
  if (streamed_) throw std::logic_error("device_result() was already called: a task has one result");
  if (total > max_result_)
    throw result_too_large("result of " + std::to_string(total) + " bytes exceeds the limit of " +
                           std::to_string(max_result_) + " bytes (--max-result)");
  stream_checksum_ = writer().write(total, fill, chunk_hashes);
  stream_total_ = total;
  streamed_ = true;
}

bool segment_sink::install_blob_placement() noexcept {
  // Without the fork handlers a child could write the worker's result: then nothing is placed.
  if (installed_sink || ::pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child) != 0) return false;
  installed_sink = this;
  ser::set_blob_placement(this);
  return true;
}

// fork() takes the sink's lock first, so the child's copy of the sink is in a state some thread
// left it in, and has room to record a move without allocating.
void segment_sink::before_fork() noexcept {
  if (!installed_sink) return;
  installed_sink->mutex_.lock();
  try {
    installed_sink->evicted_.reserve(installed_sink->evicted_.size() + 1);
  } catch (...) {  // the child's move then fails alike and is skipped
  }
}

void segment_sink::after_fork_in_parent() noexcept {
  if (installed_sink) installed_sink->mutex_.unlock();
}

// In the child: a placed blob would share the segment's pages with the worker, so the child's
// writes would change the worker's blob, and so its result. Moved to private pages like any
// evicted blob, it is a copy, as fork() promises. (posix_spawn and vfork run no fork handlers.)
void segment_sink::after_fork_in_child() noexcept {
  if (!installed_sink) return;
  segment_sink& s = *installed_sink;
  if (s.placed_ && s.evicted_.capacity() > s.evicted_.size()) try {
      s.evict_locked();
    } catch (...) {  // out of memory: the child shares the pages, as it shares output_blob's
    }
  s.mutex_.unlock();
}

std::byte* segment_sink::place(std::size_t size) noexcept {
  std::lock_guard lock(mutex_);
  // Not in a process the task forked: its copy of this sink would place a blob of its own in the
  // segment the worker's result goes to, which it shares.
  if (claimed_ || placed_ || ::getpid() != owner_pid_) return nullptr;
  try {
    const std::uint64_t payload = placed_offset_ + size;
    if (payload > max_result_ || ser::header_size + payload > file_.size()) return nullptr;
    // What the payload holds besides the blob (a pickle after it, say) must fit the mapping the
    // blob lies in, which cannot grow once the blob is there. The mapping made ahead (as large
    // as the last result, faulted in) serves if it leaves a page after the blob; else all of the
    // segment is mapped.
    if (ser::mapping ahead = take_premapped(false); ahead.size() > map_.size()) map_ = std::move(ahead);
    const std::uint64_t whole = std::min(file_.size() - ser::header_size, max_result_);
    const std::uint64_t with_a_page = std::min(whole, payload + 4096);
    placed_ = area_locked(map_.size() >= ser::header_size + with_a_page ? with_a_page : whole) + placed_offset_;
    placed_size_ = size;
    return placed_;
  } catch (...) {  // cannot map it: pages of its own
    return nullptr;
  }
}

bool segment_sink::take_back(std::byte* data) noexcept {
  std::lock_guard lock(mutex_);
  if (data == placed_) {
    placed_ = nullptr;  // the area is free again; its bytes are the segment's, nothing to free
    return true;
  }
  const auto it = std::find_if(evicted_.begin(), evicted_.end(), [&](const evicted& e) { return e.data == data; });
  if (it == evicted_.end()) return false;
  evicted_.erase(it);  // unmaps its private pages
  return true;
}

bool segment_sink::holds(const std::byte* data) noexcept {
  std::lock_guard lock(mutex_);
  return data && data == placed_;
}

void segment_sink::unmap_result() {
  std::lock_guard lock(mutex_);
  map_ = {};
}

void segment_sink::close() {
  take_premapped(true);
  std::lock_guard lock(mutex_);
  map_ = {};
  if (file_.valid() &&
      !inlined_) {  // (a result sent in `done` left it as the supervisor gave it: it may pool it again)
    try {
      file_.seal();  // refused (false) where the task still maps it writable: the supervisor then waits for the exit
    } catch (const std::exception&) {
    }
  }
  file_ = {};
}

// The area goes to a result, or to output_blob, for good. A placed blob stays where it is only if
// it is that result's (`blob_bytes`) and the payload fits the mapping it lies in: the encoder then
// finds its bytes in place and only checksums them. Otherwise it is moved out of the way first
// (mapping the segment anew for a larger payload would move it).
std::byte* segment_sink::claim_locked(std::uint64_t size, const std::byte* blob_bytes) {
  if (placed_ && (blob_bytes != placed_ || ser::header_size + size > map_.size())) evict_locked();
  claimed_ = true;
  return area_locked(size);
}

// Maps the segment for a payload of `size` bytes; an existing large enough mapping is kept,
// so bytes a task wrote in place (output_blob, a placed blob) stay where the encoder expects them.
std::byte* segment_sink::area_locked(std::uint64_t size) {
  if (size > max_result_)
    throw result_too_large("result of " + std::to_string(size) + " bytes exceeds the limit of " +
                           std::to_string(max_result_) + " bytes (--max-result)");
  // A large result waits for the whole mapping made ahead; a small one (after a large one: the
  // pool hands out its largest segment first) stops it after the piece in progress.
  if (ser::mapping ahead = take_premapped(ser::header_size + size < premap_threshold); ahead.size() > map_.size())
    map_ = std::move(ahead);
  if (map_.size() < ser::header_size + size) {
    file_.reserve(ser::header_size + size);
    map_ = ser::mapping::map(file_.fd(), ser::header_size + size, ser::mapping::access::read_write, true);
  }
  return map_.data() + ser::header_size;
}

// The placed blob is alive and the area is wanted for something else. Its bytes are copied into
// fresh private pages which mremap then puts in place of the whole mapping, atomically: the blob
// keeps its address and its bytes, and the segment is no longer reachable through that range
// (the range is the blob's now, unmapped when it is freed). The next area_locked() maps the
// segment anew. The whole mapping moves, not just the blob's pages: the blob shares its first
// page with the segment's header.
void segment_sink::evict_locked() {
  evicted_.reserve(evicted_.size() + 1);  // nothing may fail once the pages are swapped
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t length = (map_.size() + page - 1) / page * page;
  void* fresh = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (fresh == MAP_FAILED) throw std::bad_alloc();
  std::memcpy(static_cast<std::byte*>(fresh) + (placed_ - map_.data()), placed_, placed_size_);
  if (::mremap(fresh, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, map_.data()) == MAP_FAILED) {
    ::munmap(fresh, length);
    throw std::bad_alloc();
  }
  evicted_.push_back({placed_, std::move(map_)});
  map_ = {};
  placed_ = nullptr;
}

ser::mapping segment_sink::take_premapped(bool stop) {
  if (!premapper_.joinable()) return {};
  if (stop) stop_premap_ = true;
  premapper_.join();
  return std::move(premapped_);
}

// The ring, mapped on first use, without faulting it in: a payload smaller than the ring
// touches (and page-locks) only its part.
ser::stream_writer& segment_sink::writer() {
  if (!ring_.valid()) throw std::logic_error("no result ring was attached");
  if (!writer_) {
    ring_map_ = ser::mapping::map(ring_.fd(), ser::ring_bytes, ser::mapping::access::read_write, false);
    writer_.emplace(ring_map_.data(), stream_event_);
  }
  return *writer_;
}

}  // namespace isorun::worker
