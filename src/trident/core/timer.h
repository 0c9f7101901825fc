// Wall-clock timer (steady clock).
#pragma once

#include <chrono>

namespace trident::core {

class Timer {
 public:
  Timer() : start_(Clock::now()) {}
  void reset() { start_ = Clock::now(); }
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double elapsed_ms() const { return elapsed_s() * 1e3; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

}  // namespace trident::core
