// Bus bandwidth of all-reduce, reduce-scatter and all-gather per message size, through trident's
// MpiCommunicator (non-blocking MPI + the timed polling wait) and through plain blocking MPI, so
// the cost of the timeout machinery is visible; and reduce_scatter_v with the uneven splits ZeRO's
// buckets produce. Run: mpirun -np 2 trident_comm_bench [max_mib=64]
// [min_kib=1] (sizes min_kib KiB, x4, ..., up to max_mib MiB).
//
// busbw (nccl-tests convention): all_reduce 2(n-1)/n x bytes / t; reduce_scatter and all_gather
// (n-1)/n x bytes / t, where bytes is the full (n-block) buffer. t is the slowest rank's mean.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "trident/comm/mpi_communicator.h"
#include "trident/comm/runtime.h"

namespace {

using namespace trident::comm;
using Clock = std::chrono::steady_clock;

constexpr double kTargetSeconds = 0.1;  // per (operation, size, pass)
constexpr int kPasses = 3;

// Mean seconds per call on the slowest rank. The iteration count comes from a timed first call
// and is agreed by all ranks (max), so every rank runs the same number of collectives.
double time_op(MPI_Comm comm, const std::function<void()>& op) {
  op();  // warm-up
  op();
  MPI_Barrier(comm);
  Clock::time_point t0 = Clock::now();
  op();
  double one = std::chrono::duration<double>(Clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, comm);
  const int iters = std::clamp(static_cast<int>(kTargetSeconds / std::max(one, 1e-7)), 3, 20000);
  MPI_Barrier(comm);
  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
  return t;
}

std::string human(std::int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime runtime(argc, argv);
  const std::int64_t max_mib = argc > 1 ? std::atoll(argv[1]) : 64;
  const std::int64_t min_kib = argc > 2 ? std::atoll(argv[2]) : 1;
  std::unique_ptr<MpiCommunicator> world = MpiCommunicator::world(runtime);
  // The same group with a wait that only polls (never yields or sleeps): isolates what the
  // backoff costs.
  std::unique_ptr<Communicator> spin = world->split(0, world->rank(), "world-spin");
  spin->set_wait_policy(
      WaitPolicy{.timeout_s = 300, .spin_s = 1e9, .yield_s = 1e9, .max_sleep_s = 1e-3});
  const MPI_Comm comm = world->mpi_comm();
  const int n = world->size();
  const double ar_factor = 2.0 * (n - 1) / n, rs_factor = static_cast<double>(n - 1) / n;

  if (world->rank() == 0) {
    std::printf(
        "trident_comm_bench: %d ranks, f32, busbw in GB/s (time per call in us); best of "
        "%d interleaved passes\n",
        n, kPasses);
    std::printf(
        "| bytes | all_reduce MPI | MPI_Iallreduce+Wait | all_reduce trident |"
        " all_reduce trident spin | reduce_scatter MPI | reduce_scatter trident |"
        " reduce_scatter_v trident, one owner | reduce_scatter_v trident, two owners |"
        " all_gather MPI | all_gather trident |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (std::int64_t bytes = min_kib << 10; bytes <= (max_mib << 20); bytes *= 4) {
    const std::int64_t count = bytes / 4;                             // whole buffer, f32
    const std::int64_t block = std::max<std::int64_t>(count / n, 1);  // one rank's block
    std::vector<float> buf(static_cast<std::size_t>(count), 0.0f);
    std::vector<float> full(static_cast<std::size_t>(block * n), 0.0f);
    std::vector<float> part(static_cast<std::size_t>(block), 0.0f);
    const double b = static_cast<double>(count * 4);
    const double full_bytes = static_cast<double>(block * n * 4);
    const int icount = static_cast<int>(count), iblock = static_cast<int>(block);
    std::vector<std::int64_t> one_owner(static_cast<std::size_t>(n), 0), two_owners = one_owner;
    one_owner[0] = block * n;
    two_owners[0] = block * n / 2;
    two_owners[1] = block * n - two_owners[0];
    const int me = world->rank();
    std::vector<float> part_v(static_cast<std::size_t>(std::max<std::int64_t>(
        std::max(one_owner[static_cast<std::size_t>(me)], two_owners[static_cast<std::size_t>(me)]),
        1)));

    struct Op {
      double factor;
      double bytes;
      std::function<void()> run;
      double best = 1e30;
    };
    std::vector<Op> ops = {
        {ar_factor, b,
         [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), icount, MPI_FLOAT, MPI_SUM, comm); }},
        {ar_factor, b,
         [&] {
           MPI_Request r;
           MPI_Iallreduce(MPI_IN_PLACE, buf.data(), icount, MPI_FLOAT, MPI_SUM, comm, &r);
           MPI_Wait(&r, MPI_STATUS_IGNORE);
         }},
        {ar_factor, b,
         [&] { world->all_reduce(buf.data(), count, Datatype::kF32, ReduceOp::kSum); }},
        {ar_factor, b,
         [&] { spin->all_reduce(buf.data(), count, Datatype::kF32, ReduceOp::kSum); }},
        {rs_factor, full_bytes,
         [&] {
           MPI_Reduce_scatter_block(full.data(), part.data(), iblock, MPI_FLOAT, MPI_SUM, comm);
         }},
        {rs_factor, full_bytes,
         [&] {
           world->reduce_scatter(full.data(), part.data(), block, Datatype::kF32, ReduceOp::kSum);
         }},
        // ZeRO's calls: reduce_scatter_v with the shard plan's split of one bucket, which mostly
        // lies inside one rank's shard (all of it to rank 0), or across a shard boundary (half to
        // rank 0, half to rank 1). Bus bandwidth counted as for equal blocks, for comparison.
        {rs_factor, full_bytes,
         [&] {
           world->reduce_scatter_v(full.data(), part_v.data(), one_owner, Datatype::kF32,
                                   ReduceOp::kSum);
         }},
        {rs_factor, full_bytes,
         [&] {
           world->reduce_scatter_v(full.data(), part_v.data(), two_owners, Datatype::kF32,
                                   ReduceOp::kSum);
         }},
        {rs_factor, full_bytes,
         [&] {
           MPI_Allgather(part.data(), iblock, MPI_FLOAT, full.data(), iblock, MPI_FLOAT, comm);
         }},
        {rs_factor, full_bytes,
         [&] { world->all_gather(part.data(), full.data(), block, Datatype::kF32); }},
    };
    for (int pass = 0; pass < kPasses; ++pass) {
      for (Op& op : ops) op.best = std::min(op.best, time_op(comm, op.run));
    }
    if (world->rank() == 0) {
      std::printf("| %s |", human(bytes).c_str());
      for (const Op& op : ops) {
        std::printf(" %.2f (%.0f) |", op.factor * op.bytes / op.best / 1e9, op.best * 1e6);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
