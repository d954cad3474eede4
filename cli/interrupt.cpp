#include "interrupt.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <utility>

namespace isorun::cli {
namespace {

constexpr int handled[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

std::atomic<stop_function> target{nullptr};
std::atomic<const std::string*> notices[2] = {nullptr, nullptr};
std::atomic<int> received{0};   // signals caught
std::atomic<int> delivered{0};  // of them, handed to the target
std::atomic<int> last_signal{0};
std::atomic<int> extra{0};  // also_catch()'s signal, 0: none

// Hands each caught signal to the target exactly once, whichever of the handler and hand_to()
// (maybe on two threads at once) gets there first. Async-signal-safe: atomics only.
void deliver() noexcept {
  const stop_function stop = target.load();
  if (!stop) return;
  for (int d = delivered.load(); d < received.load();)
    if (delivered.compare_exchange_weak(d, d + 1)) stop(last_signal.load());
}

void on_signal(int sig) {
  last_signal = sig;
  const int n = received.fetch_add(1);
  if (const std::string* notice = notices[n == 0 ? 0 : 1].load(); notice && !notice->empty()) {
    [[maybe_unused]] auto w = ::write(STDERR_FILENO, notice->data(), notice->size());  // async-signal-safe
  }
  deliver();
}

void install(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;  // whatever the main thread was blocked in goes on; the stop wakes it
  sigemptyset(&sa.sa_mask);
  for (int sig : handled) ::sigaction(sig, &sa, nullptr);
  if (const int more = extra.load()) ::sigaction(more, &sa, nullptr);
}

}  // namespace

interrupt_scope::interrupt_scope(std::string first_notice, std::string second_notice)
    : first_(std::move(first_notice)), second_(std::move(second_notice)) {
  assert(!target.load() && !notices[0].load() && "one interrupt_scope at a time");
  received = 0;
  delivered = 0;
  notices[0] = &first_;
  notices[1] = &second_;
  install(on_signal);
}

interrupt_scope::interrupt_scope(stop_function stop, std::string first_notice, std::string second_notice)
    : interrupt_scope(std::move(first_notice), std::move(second_notice)) {
  hand_to(stop);
}

void interrupt_scope::hand_to(stop_function stop) noexcept {
  target = stop;
  deliver();
}

void interrupt_scope::also_catch(int signal) const noexcept {
  extra = signal;
  install(on_signal);
}

interrupt_scope::~interrupt_scope() {
  install(SIG_DFL);
  extra = 0;
  target = nullptr;
  notices[0] = nullptr;
  notices[1] = nullptr;
}

}  // namespace isorun::cli
