#include "trident/plan/comm_calibration.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/core/view.h"
#include "trident/kernels/linear.h"

namespace trident::plan {

namespace {

using Clock = std::chrono::steady_clock;
using comm::Datatype;
using comm::ReduceOp;

double elapsed_s(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds per call of `op` on the slowest rank of `world`: one call to size the batch (agreed by
// every rank, so all run the same count), then a batch of at least `target_s`.
double time_batch(comm::Communicator& world, const std::function<void()>& op, double target_s) {
  op();  // warm-up: connections, libnbc's schedules
  world.barrier();
  Clock::time_point t0 = Clock::now();
  op();
  double one = elapsed_s(t0);
  world.all_reduce(&one, 1, Datatype::kF64, ReduceOp::kMax);
  const int calls = std::clamp(static_cast<int>(target_s / std::max(one, 1e-7)), 2, 10000);
  world.barrier();
  t0 = Clock::now();
  for (int i = 0; i < calls; ++i) op();
  double t = elapsed_s(t0) / calls;
  world.all_reduce(&t, 1, Datatype::kF64, ReduceOp::kMax);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The GEMM the interference is measured with: linear 256 x 256 -> 512 (67 MFLOP, about 1 ms on
// one core), on activation-like values.
class GemmLoad {
 public:
  explicit GemmLoad(int threads) : ctx_{.num_threads = threads} {
    std::mt19937 rng(11);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& v : x_) v = d(rng);
    for (float& v : w_) v = 0.02f * d(rng);
  }
  void run(int calls) {
    for (int i = 0; i < calls; ++i) {
      kernels::linear(ctx_, {.out = core::view(y_.data(), {kRows, kOut}),
                             .in = core::view(x_.data(), {kRows, kIn}),
                             .weight = core::view(w_.data(), {kOut, kIn}),
                             .bias = core::view(b_.data(), {kOut})});
    }
  }

 private:
  static constexpr std::int64_t kRows = 256, kIn = 256, kOut = 512;
  core::ExecContext ctx_;
  std::vector<float> x_ = std::vector<float>(kRows * kIn), w_ = std::vector<float>(kOut * kIn),
                     b_ = std::vector<float>(kOut, 0.0f), y_ = std::vector<float>(kRows * kOut);
};

double sum_over(comm::Communicator& c, double v) {
  c.all_reduce(&v, 1, Datatype::kF64, ReduceOp::kSum);
  return v;
}
double max_over(comm::Communicator& c, double v) {
  c.all_reduce(&v, 1, Datatype::kF64, ReduceOp::kMax);
  return v;
}

}  // namespace

std::vector<std::int64_t> comm_calibration_sizes() {
  std::vector<std::int64_t> s;
  for (std::int64_t b = 4 << 10; b <= (std::int64_t{16} << 20); b *= 4) s.push_back(b);
  return s;
}

std::map<std::string, CommCosts> calibrate_comm(comm::Communicator& world, int passes,
                                                double target_s) {
  const int W = world.size();
  TRIDENT_CHECK(W >= 2, "--calibrate-comm needs at least 2 ranks (run it under mpirun -np N)");
  TRIDENT_CHECK(passes >= 1 && target_s > 0, "calibrate_comm: passes and target must be positive");
  const std::vector<std::int64_t> sizes = comm_calibration_sizes();
  std::map<std::string, CommCosts> out;
  for (int n = 2; n <= W; ++n) {
    if (W % n != 0) continue;
    std::unique_ptr<comm::Communicator> g =
        world.split(world.rank() / n, world.rank(), "calibrate-" + std::to_string(n));
    const int r = g->rank();
    // t[size][op]: one time per pass. The passes run over all sizes in turn, so that a slow
    // moment of the machine (seconds long, here) hits one pass of a few sizes, which the median
    // drops, rather than every pass of one size.
    std::vector<std::array<std::vector<double>, 4>> t(sizes.size());
    for (int p = 0; p < passes; ++p) {
      for (std::size_t si = 0; si < sizes.size(); ++si) {
        const std::int64_t count = sizes[si] / 4;  // FP32 elements of the whole buffer
        const std::int64_t block = std::max<std::int64_t>(count / n, 1);
        std::vector<float> buf(static_cast<std::size_t>(std::max(count, block * n)), 1.0f);
        std::vector<float> part(static_cast<std::size_t>(block), 1.0f);
        // p2p: ranks paired (0,1), (2,3), ... inside the group, one message each way per call; a
        // rank without a partner (odd n) joins the barriers only.
        const int peer = (r % 2 == 0) ? r + 1 : r - 1;
        const bool paired = peer < n;
        const std::array<std::function<void()>, 4> ops = {
            [&] { g->all_reduce(buf.data(), count, Datatype::kF32, ReduceOp::kSum); },
            [&] {
              g->reduce_scatter(buf.data(), part.data(), block, Datatype::kF32, ReduceOp::kSum);
            },
            [&] { g->all_gather(part.data(), buf.data(), block, Datatype::kF32); },
            [&] {
              if (!paired) return;
              if (r % 2 == 0) {
                g->send(buf.data(), count, Datatype::kF32, peer);
                g->recv(buf.data(), count, Datatype::kF32, peer);
              } else {
                g->recv(buf.data(), count, Datatype::kF32, peer);
                g->send(buf.data(), count, Datatype::kF32, peer);
              }
            }};
        for (std::size_t o = 0; o < ops.size(); ++o)
          t[si][o].push_back(time_batch(world, ops[o], target_s));
      }
    }
    CommCosts c;
    c.bytes = sizes;
    for (std::size_t si = 0; si < sizes.size(); ++si) {
      c.all_reduce_s.push_back(median(t[si][0]));
      c.reduce_scatter_s.push_back(median(t[si][1]));
      c.all_gather_s.push_back(median(t[si][2]));
      c.p2p_s.push_back(median(t[si][3]) / 2);  // one message of the round trip
    }
    // A larger message never costs less: a size timed slower than the next one met a slow
    // moment in most passes, and takes the next size's time.
    for (auto* v : {&c.all_reduce_s, &c.reduce_scatter_s, &c.all_gather_s, &c.p2p_s}) {
      for (std::size_t si = v->size() - 1; si-- > 0;) (*v)[si] = std::min((*v)[si], (*v)[si + 1]);
    }
    out[comm_key(W, n)] = std::move(c);
  }
  return out;
}

void calibrate_interference(comm::Communicator& world, int threads, int cores,
                            std::map<std::string, CommCosts>& costs, int passes, double target_s) {
  TRIDENT_CHECK(world.size() >= 2, "calibrate_interference needs at least 2 ranks");
  TRIDENT_CHECK(passes >= 1 && target_s > 0 && threads >= 1 && cores >= 1,
                "calibrate_interference: passes, target, threads and cores must be positive");
  const int W = world.size();
  // Ranks per core: with more threads than cores each rank gets this share of one.
  const double share = std::max(1.0, static_cast<double>(W) * threads / cores);
  GemmLoad gemm(threads);
  gemm.run(2);  // warm-up: oneDNN's primitive, first touch
  // Calls per batch, agreed: about target_s of GEMMs on the slowest rank.
  Clock::time_point t0 = Clock::now();
  gemm.run(2);
  const double one = max_over(world, elapsed_s(t0) / 2);
  const int calls = std::clamp(static_cast<int>(target_s / std::max(one, 1e-6)), 8, 2000);

  // A GEMM alone (world rank 0; the others sleep, leaving the cores idle) and with every rank
  // running GEMMs at once: seconds per call. With ranks sharing cores the time-sliced share is
  // the expected part of the slowdown; corun_gemm is what comes on top.
  std::vector<double> ratios;
  for (int p = 0; p < passes; ++p) {
    world.barrier();
    double alone = 0;
    if (world.rank() == 0) {
      t0 = Clock::now();
      gemm.run(calls);
      alone = elapsed_s(t0) / calls;
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * one * calls + 0.05));
    }
    alone = sum_over(world, alone);  // rank 0's, on every rank
    world.barrier();
    t0 = Clock::now();
    gemm.run(calls);
    const double together = sum_over(world, elapsed_s(t0) / calls) / W;
    ratios.push_back(together / (alone * share));
  }
  const double corun = std::clamp(median(ratios), 0.5, 16.0);

  for (auto& [key, c] : costs) {
    const int n = std::stoi(key.substr(key.find(',') + 1));
    if (n > W || W % n != 0) continue;
    std::unique_ptr<comm::Communicator> g =
        world.split(world.rank() / n, world.rank(), "interference-" + std::to_string(n));
    std::vector<float> buf(1024, 1.0f);  // 4 KiB
    const double sync = c.all_reduce(4096);
    // Loops of `reps` GEMMs closed by the group's all-reduce: the wall time per loop (the
    // slowest group's) beyond the GEMMs' time (the ranks' mean, by the CPU-time clock with one
    // thread, over their share of a core) and the all-reduce's own time; and those GEMMs' time.
    auto wait = [&](int reps) {
      const int loops = std::max(4, calls / reps);
      g->all_reduce(buf.data(), 1024, Datatype::kF32, ReduceOp::kSum);
      world.barrier();
      double compute = 0;
      const Clock::time_point start = Clock::now();
      for (int i = 0; i < loops; ++i) {
        const double c0 = calibration_clock_s(threads);
        gemm.run(reps);
        compute += calibration_clock_s(threads) - c0;
        g->all_reduce(buf.data(), 1024, Datatype::kF32, ReduceOp::kSum);
      }
      const double wall = max_over(world, elapsed_s(start) / loops);
      const double busy = share * sum_over(world, compute / loops) / W;
      return std::pair{busy, wall - busy - sync};
    };
    std::vector<double> short_compute, long_compute, short_wait, long_wait;
    for (int p = 0; p < passes; ++p) {  // interleaved, so a slow moment hits both
      const auto [cs, es] = wait(1);
      const auto [cl, el] = wait(8);
      short_compute.push_back(cs), short_wait.push_back(es);
      long_compute.push_back(cl), long_wait.push_back(el);
    }
    // wait = sync_wait_s + sync_wait_fraction x compute, fitted to the two loops.
    const double ds = median(short_compute), dl = median(long_compute);
    const double es = median(short_wait), el = median(long_wait);
    double fraction = dl > ds ? (el - es) / (dl - ds) : 0.0;
    double per_call = es - fraction * ds;
    if (fraction < 0) fraction = 0, per_call = std::max(0.0, (es + el) / 2);
    if (per_call < 0) per_call = 0, fraction = std::max(0.0, el / dl);
    c.corun_gemm = corun;
    c.sync_wait_s = std::min(per_call, 1.0);
    c.sync_wait_fraction = std::min(fraction, 4.0);
  }
}

}  // namespace trident::plan
