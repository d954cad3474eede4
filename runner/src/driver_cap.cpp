#include "isorun/runner/driver_cap.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "isorun/preload/cap_region.hpp"
#include "isorun/runner/errors.hpp"
#include "isorun/runner/process.hpp"
#include "isorun/runner/units.hpp"

namespace isorun::runner {
namespace {
constexpr std::size_t ledger_bytes = preload::cap_ledger::bytes_for(preload::default_slot_capacity);
}

std::string beside_library(const char* name, const char* without_it) {
  Dl_info info{};
  if (!::dladdr(reinterpret_cast<void*>(&self_executable), &info) || !info.dli_fname)
    throw internal_error(std::string("cannot locate libisorun.so, next to which ") + name + " is");
  const auto path = std::filesystem::path(info.dli_fname).parent_path() / name;
  if (!std::filesystem::exists(path))
    throw internal_error(path.string() + " is missing, so " + without_it + "; reinstall isorun");
  return path.string();
}

driver_cap::driver_cap(std::uint64_t limit)
    : terms_{serialization::shm_file::create(sizeof(preload::cap_terms))},
      ledger_file_{serialization::shm_file::create(ledger_bytes)},
      limit_{limit} {
  const preload::cap_terms terms{preload::terms_magic, limit, preload::default_slot_capacity};
  if (::pwrite(terms_.fd(), &terms, sizeof terms, 0) != static_cast<ssize_t>(sizeof terms) || !terms_.seal())
    throw internal_error(std::string("cannot write the cap's terms: ") + std::strerror(errno));
  // The command's processes write the ledger, but none may resize it: cut short, it would fault
  // in this process when the report reads it.
  if (::fcntl(ledger_file_.fd(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw internal_error(std::string("cannot seal the cap's ledger: ") + std::strerror(errno));
  void* p = ::mmap(nullptr, ledger_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ledger_file_.fd(), 0);
  if (p == MAP_FAILED) throw internal_error(std::string("cannot map the cap's ledger: ") + std::strerror(errno));
  ledger_ = static_cast<preload::cap_ledger*>(p);  // zero-filled by the kernel: every count 0
  ledger_->magic = preload::ledger_magic;
}

driver_cap::~driver_cap() { ::munmap(ledger_, ledger_bytes); }

std::vector<std::string> driver_cap::variables() const {
  const std::string proc = "/proc/" + std::to_string(::getpid()) + "/fd/";
  return {std::string(preload::region_env) + "=" + proc + std::to_string(ledger_file_.fd()),
          std::string(preload::terms_env) + "=" + proc + std::to_string(terms_.fd())};
}

std::string driver_cap::library() {
  return beside_library(preload::library_name, "--mem-limit cannot be enforced on the CUDA driver API");
}

bool driver_cap::refused() const noexcept { return refusals() > 0 || ledger_->slotless.load() > 0; }
std::uint64_t driver_cap::refusals() const noexcept { return ledger_->refusals(); }
std::uint64_t driver_cap::largest_refused() const noexcept { return ledger_->largest_refused(); }
std::uint64_t driver_cap::peak() const noexcept { return ledger_->peak(); }

std::string driver_cap::report(const std::string& what, const std::string& option, std::size_t gpus) const {
  const std::uint64_t refused = ledger_->refusals(), slotless = ledger_->slotless.load();
  const std::string no_slot =
      slotless ? std::to_string(slotless) + " process" + (slotless == 1 ? "" : "es") + " found all " +
                     std::to_string(preload::default_slot_capacity) +
                     " of the cap's process slots taken, so their CUDA allocations were refused"
               : "";
  if (!refused) return no_slot.empty() ? "" : what + ": " + no_slot;
  const std::uint64_t processes = ledger_->processes.load();
  std::string where;
  if (gpus > 1)
    for (std::size_t d = 0; d < std::min(gpus, preload::max_devices); ++d)
      if (const auto n = ledger_->devices[d].refusals.load())
        where += std::string(where.empty() ? " (" : ", ") + std::to_string(n) + " on device " + std::to_string(d);
  if (!where.empty()) where += ")";
  return what + " reached its " + option + " of " + format_size(limit_) + (gpus > 1 ? " per GPU" : "") + ": " +
         std::to_string(refused) + " allocation" + (refused == 1 ? "" : "s") + " refused" + where + " (the largest " +
         format_size(ledger_->largest_refused()) + "), peak " + format_size(ledger_->peak()) +
         (gpus > 1 ? " on one GPU" : "") + " in " + std::to_string(processes) + " process" +
         (processes == 1 ? "" : "es") + " with CUDA" + (no_slot.empty() ? "" : "; " + no_slot);
}

}  // namespace isorun::runner
