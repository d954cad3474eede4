// A forked worker maps, while it waits, the pages of its file mappings its parent had mapped
// (warm_pages.hpp): on a real file mapping, read back through /proc/self/pagemap in real forks.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "isorun/worker/warm_pages.hpp"

namespace {

constexpr std::size_t pages = 128;

// How many of the first `n` pages at `at` are mapped in this process.
std::size_t present(const std::byte* at, std::size_t n, std::size_t page) {
  const int pagemap = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  std::vector<std::uint64_t> entries(n);
  const auto read = ::pread(pagemap, entries.data(), n * 8,
                            static_cast<off_t>(reinterpret_cast<std::uintptr_t>(at) / page * 8));
  ::close(pagemap);
  std::size_t count = 0;
  for (std::size_t i = 0; read == static_cast<ssize_t>(n * 8) && i < n; ++i) count += entries[i] >> 63;
  return count;
}

// A file of `pages` pages mapped read-only, as a library is; kept until destroyed (a deleted
// file's mapping is not warmed).
struct mapped_file {
  std::string path = "/tmp/isorun-warm-pages-XXXXXX";
  std::byte* at = nullptr;
  std::size_t size = 0;

  explicit mapped_file(std::size_t page) : size(pages * page) {
    const int fd = ::mkstemp(path.data());
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
    at = static_cast<std::byte*>(::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0));
    ::close(fd);
    REQUIRE(at != MAP_FAILED);
  }
  ~mapped_file() {
    ::munmap(at, size);
    ::unlink(path.c_str());
  }
};

struct counts {
  std::size_t touched, untouched;  // of the two files' pages, mapped in the child
};

// Forks a child that waits on a pipe (with a byte in it if `call_waiting`) as a worker waits
// for its assignment, then counts what it has mapped of each file.
counts child_counts(const mapped_file& touched, const mapped_file& untouched, std::size_t page, bool call_waiting) {
  int fds[2], back[2];
  REQUIRE(::pipe(fds) == 0);
  REQUIRE(::pipe(back) == 0);
  if (call_waiting) REQUIRE(::write(fds[1], "a", 1) == 1);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    isorun::worker::warm_pages_while_waiting(fds[0]);
    const counts c{present(touched.at, pages, page), present(untouched.at, pages, page)};
    ::_exit(::write(back[1], &c, sizeof c) == sizeof c ? 0 : 1);
  }
  ::close(back[1]);
  counts c{};
  const auto got = ::read(back[0], &c, sizeof c);
  for (const int fd : {fds[0], fds[1], back[0]}) ::close(fd);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0 && got == sizeof c));
  return c;
}

}  // namespace

TEST_CASE("a forked worker maps, while it waits, the pages of files its parent had mapped, and no others",
          "[warm-pages]") {
  ::unsetenv("ISORUN_WARM_PAGES");
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  struct forget {  // at the end: nothing noted of mappings about to go
    ~forget() {
      ::setenv("ISORUN_WARM_PAGES", "0", 1);
      isorun::worker::note_pages_to_warm();
      ::unsetenv("ISORUN_WARM_PAGES");
    }
  } forget;
  mapped_file touched(page), untouched(page);
  volatile std::byte sink{};
  for (std::size_t i = 0; i < pages; ++i) sink = touched.at[i * page];  // as a zygote's code, run
  (void)sink;
  REQUIRE(present(touched.at, pages, page) == pages);

  SECTION("noted: a waiting worker maps them; one whose call is there already maps nothing") {
    isorun::worker::note_pages_to_warm();
    const counts waited = child_counts(touched, untouched, page, false);
    CHECK(waited.touched == pages);
    CHECK(waited.untouched == 0);  // nothing read in that the parent had not
    const counts called = child_counts(touched, untouched, page, true);
    CHECK(called.touched == 0);  // (fork itself maps none of a file's pages)
    CHECK(called.untouched == 0);
  }
  SECTION("ISORUN_WARM_PAGES=0: nothing is noted, nothing mapped") {
    ::setenv("ISORUN_WARM_PAGES", "0", 1);
    isorun::worker::note_pages_to_warm();
    ::unsetenv("ISORUN_WARM_PAGES");
    CHECK(child_counts(touched, untouched, page, false).touched == 0);
  }
}
