// Helpers shared by the kernel benchmarks: fast reproducible fills, medians, and a meter of the CPU
// time other processes used during a measurement (this machine is shared, so every result is
// printed with the foreign load it was measured under).
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "trident/core/timer.h"

namespace trident::bench {

// Uniform values in [-1, 1) from a 64-bit xorshift: fast enough for hundreds of MB.
inline void fill_uniform(float* x, std::int64_t n, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
  }
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Average number of cores busy with *other* processes between start() and stop(): busy time of
// all CPUs from /proc/stat minus this process's own CPU time, divided by wall time.
class ForeignLoad {
 public:
  void start() {
    busy0_ = busy_s();
    self0_ = self_s();
    timer_.reset();
  }
  double stop() const {
    const double wall = timer_.elapsed_s();
    if (wall <= 0.0) return 0.0;
    const double foreign = (busy_s() - busy0_) - (self_s() - self0_);
    return std::max(0.0, foreign / wall);
  }

 private:
  static double busy_s() {
    std::ifstream f("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    return (user + nice + system + irq + softirq + steal) /
           static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  static double self_s() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  }
  double busy0_ = 0, self0_ = 0;
  core::Timer timer_;
};

// Waits until other processes use less than `max_cores` for a whole `window_s` sample, or until
// `timeout_s` has passed. Returns the foreign load of the last sample.
inline double wait_for_idle(double max_cores = 0.15, double window_s = 0.5,
                            double timeout_s = 120.0) {
  core::Timer waited;
  double last = 0.0;
  do {
    ForeignLoad load;
    load.start();
    const core::Timer window;
    while (window.elapsed_s() < window_s) usleep(20000);
    last = load.stop();
    if (last < max_cores) return last;
  } while (waited.elapsed_s() < timeout_s);
  return last;
}

}  // namespace trident::bench
