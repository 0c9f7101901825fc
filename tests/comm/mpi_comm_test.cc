// dist-mpi tier: the collective checks on MpiCommunicator with real processes (mpirun -np 2 and
// -np 4), the chunked-message path, MPI errors surfacing as CommError, and the timeout: a rank
// that does not join makes the others fail within the timeout with a message naming everything.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "trident/comm/mpi_communicator.h"

namespace trident::comm {
namespace {

using namespace trident::comm::testing;
using Clock = std::chrono::steady_clock;

// MPI is already initialized by mpi_test_main; this runtime only queries it.
std::unique_ptr<MpiCommunicator> make_world() {
  int argc = 0;
  char** argv = nullptr;
  MpiRuntime runtime(argc, argv);
  return MpiCommunicator::world(runtime, WaitPolicy{.timeout_s = 30.0});
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(MpiCommunicator, WorldMatchesMpi) {
  auto world = make_world();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_GE(size, 2) << "run with mpirun -np 2 or more";
  EXPECT_EQ(world->rank(), rank);
  EXPECT_EQ(world->size(), size);
  EXPECT_EQ(world->name(), "world");
  for (int r = 0; r < size; ++r)
    EXPECT_EQ(world->group().global_ranks[static_cast<std::size_t>(r)], r);
}

TEST(MpiCommunicator, AllReduce) {
  auto world = make_world();
  for (std::int64_t n : sweep_counts(world->size())) check_all_reduce(*world, n);
}

TEST(MpiCommunicator, ReduceScatter) {
  auto world = make_world();
  for (std::int64_t n : sweep_counts(world->size())) check_reduce_scatter(*world, n);
  for (std::int64_t base : {0, 1, 5, 1000}) check_reduce_scatter_v(*world, base);
}

TEST(MpiCommunicator, AllGather) {
  auto world = make_world();
  for (std::int64_t n : sweep_counts(world->size())) check_all_gather(*world, n);
  for (std::int64_t base : {0, 1, 5, 1000}) check_all_gather_v(*world, base);
  for (std::int64_t base : {0, 1, 5, 1000}) check_all_to_all_v(*world, base);
}

TEST(MpiCommunicator, Broadcast) {
  auto world = make_world();
  for (std::int64_t n : sweep_counts(world->size())) check_broadcast(*world, n);
}

TEST(MpiCommunicator, PointToPoint) {
  auto world = make_world();
  for (std::int64_t n : sweep_counts(world->size())) check_p2p(*world, n);
}

TEST(MpiCommunicator, NonBlockingBuckets) {
  auto world = make_world();
  for (std::int64_t n : sweep_counts(world->size())) check_nonblocking_buckets(*world, n);
}

TEST(MpiCommunicator, SplitAndBarrier) {
  auto world = make_world();
  check_split(*world);
  world->barrier();
}

// Messages above max_message_elems go as several MPI messages; 7 makes 10000 elements 1429 of
// them, and sizes around 7 hit the boundaries.
TEST(MpiCommunicator, ChunkedMessages) {
  auto world = make_world();
  world->set_max_message_elems(7);
  for (std::int64_t n : {0, 1, 6, 7, 8, 14, 15, 10000}) {
    check_all_reduce_typed<float>(*world, n);
    check_broadcast(*world, n);
    check_p2p(*world, n);
  }
  // Inherited by split.
  std::unique_ptr<Communicator> sub = world->split(0, world->rank(), "sub");
  EXPECT_EQ(static_cast<MpiCommunicator&>(*sub).max_message_elems(), 7);
  check_all_reduce_typed<double>(*sub, 100);
}

TEST(MpiCommunicator, MessageSizeMismatchIsACommError) {
  auto world = make_world();
  const int r = world->rank();
  // Shorter than posted: our count check. Longer: MPI's truncation error, converted.
  for (int longer : {0, 1}) {
    if (r > 1) continue;
    std::vector<float> x(r == 0 ? 5 + 4 * longer : 5);
    std::string error;
    try {
      if (r == 0) {
        world->send(std::span<float>(x.data(), longer ? 9 : 3), 1, 9);
      } else {
        world->recv(std::span<float>(x), 0, 9);
      }
    } catch (const core::CommError& e) {
      error = e.what();
    }
    if (r == 1) {
      EXPECT_NE(error.find("recv(count=5, f32, tag 9) from peer 0 (global 0)"), std::string::npos)
          << error;
      EXPECT_NE(error.find(longer ? "MPI_ERR_TRUNCATE" : "received 3 elements, expected 5"),
                std::string::npos)
          << error;
    } else {
      EXPECT_EQ(error, "");
    }
  }
  world->barrier();
}

// The last rank joins 2.5 s late; the timeout is 1 s. Every other rank must throw CommError after
// about 1 s naming the collective, the group, its global ranks and the step, and the hang report
// (asked over the side channel) names the late rank as the culprit. The late rank then
// joins; the early ranks' abandoned operation is still posted in MPI (collectives cannot be
// cancelled), so it completes, and the buffers are kept alive until then.
TEST(MpiCommunicator, TimeoutNamesCollectiveGroupRanksAndStep) {
  auto world = make_world();
  std::unique_ptr<Communicator> dp = world->split(0, world->rank(), "dp");
  const int late = dp->size() - 1;
  dp->set_timeout(1.0);
  dp->set_step(1234);
  std::vector<float> x(16, static_cast<float>(dp->rank()));
  std::string error;
  double waited = 0;
  if (dp->rank() == late) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    dp->set_timeout(30.0);
  }
  const Clock::time_point t0 = Clock::now();
  try {
    dp->all_reduce(std::span<float>(x), ReduceOp::kSum);
  } catch (const core::CommError& e) {
    error = e.what();
  }
  waited = seconds_since(t0);
  if (dp->rank() != late) {
    std::string ranks = "[0";
    for (int q = 1; q < dp->size(); ++q) ranks += ", " + std::to_string(q);
    ranks += "]";
    EXPECT_NE(error.find("all_reduce(count=16, f32, sum) on group 'dp' (global ranks " + ranks),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("at step 1234"), std::string::npos) << error;
    EXPECT_NE(error.find("timed out after 1 s"), std::string::npos) << error;
    // The hang report (side channel): the late rank, busy outside any operation, is the culprit.
    EXPECT_NE(error.find(core::str("hang report: culprit: rank ", dp->group().global_ranks[late],
                                   " (host ")),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("not waiting in any operation (computing)"), std::string::npos) << error;
    EXPECT_NE(error.find(core::str("NOT reached by rank ", dp->group().global_ranks[late])),
              std::string::npos)
        << error;
    // The error itself shows the timeout fired before the late rank arrived (2.5 s): had the
    // operation completed there would be none. No upper bound on the time: a loaded machine
    // delays the report by seconds.
    EXPECT_GE(waited, 1.0);
  } else {
    EXPECT_EQ(error, "");
    const int n = dp->size();
    EXPECT_EQ(x[0], static_cast<float>(n * (n - 1) / 2));
  }
  world->barrier();  // drives the abandoned operations to completion; x stays alive until here
}

TEST(MpiCommunicator, RecvTimeoutNamesPeer) {
  auto world = make_world();
  std::unique_ptr<Communicator> pp = world->split(0, world->rank(), "pp");
  pp->set_step(5);
  std::vector<std::int64_t> x(4, -1);
  if (pp->rank() == 0) {
    pp->set_timeout(0.5);
    std::string error;
    try {
      pp->recv(std::span<std::int64_t>(x), 1, 2);
    } catch (const core::CommError& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("recv(count=4, i64, tag 2) from peer 1 (global 1) on group 'pp'"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("at step 5"), std::string::npos) << error;
  } else if (pp->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    pp->send(std::span<std::int64_t>(x), 0, 2);  // matched by the abandoned receive
  }
  world->barrier();
}

}  // namespace
}  // namespace trident::comm
