#include "trident/plan/comm_calibration.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "trident/core/error.h"

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
    CommCosts c;
    c.bytes = sizes;
    for (const std::int64_t bytes : sizes) {
      const std::int64_t count = bytes / 4;  // FP32 elements of the whole buffer
      const std::int64_t block = std::max<std::int64_t>(count / n, 1);
      std::vector<float> buf(static_cast<std::size_t>(std::max(count, block * n)), 1.0f);
      std::vector<float> part(static_cast<std::size_t>(block), 1.0f);
      // p2p: ranks paired (0,1), (2,3), ... inside the group, one message each way per call; a
      // rank without a partner (odd n) joins the barriers only.
      const int peer = (r % 2 == 0) ? r + 1 : r - 1;
      const bool paired = peer < n;
      const std::vector<std::function<void()>> ops = {
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
      std::vector<std::vector<double>> t(ops.size());
      for (int p = 0; p < passes; ++p) {  // interleaved, so a slow moment hits every op
        for (std::size_t o = 0; o < ops.size(); ++o)
          t[o].push_back(time_batch(world, ops[o], target_s));
      }
      c.all_reduce_s.push_back(median(t[0]));
      c.reduce_scatter_s.push_back(median(t[1]));
      c.all_gather_s.push_back(median(t[2]));
      c.p2p_s.push_back(median(t[3]) / 2);  // one message of the round trip
    }
    out[comm_key(W, n)] = std::move(c);
  }
  return out;
}

}  // namespace trident::plan
