// Example task library, loaded by `isorun` from <prefix>/lib/isorun/tasks.
//   isorun --cpu hello name=world
//   isorun --cpu sum_squares n=1000000
#include <unistd.h>

#include <cmath>
#include <string>

#include "isorun/isorun.hpp"

namespace {

struct greeting_args {
  std::string name = "world";
  int repeat = 1;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(CEREAL_NVP(name), CEREAL_NVP(repeat));
  }
};

struct greeting {
  std::string message;
  long pid = 0;
  std::string device;  // "cpu" or the assigned GPU's UUID

  template <class Archive>
  void serialize(Archive& ar) {
    ar(CEREAL_NVP(message), CEREAL_NVP(pid), CEREAL_NVP(device));
  }
};

greeting hello(const greeting_args& a) {
  greeting g;
  for (int i = 0; i < a.repeat; ++i) g.message += (i ? " " : "") + std::string("hello, ") + a.name;
  g.pid = static_cast<long>(::getpid());
  const auto& w = isorun::this_worker();
  g.device = w.has_gpu() ? w.device_uuid() : "cpu";
  return g;
}

double sum_squares(std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 1; i <= n; ++i) s += static_cast<double>(i) * static_cast<double>(i);
  return s;
}

}  // namespace

ISORUN_TASK(hello);
ISORUN_TASK(sum_squares);
