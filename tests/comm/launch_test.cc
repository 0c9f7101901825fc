// The thread plan: OpenMP threads per rank from the host's cores and ranks, and the error when a
// requested thread count oversubscribes the host.
#include "trident/comm/launch.h"

#include <gtest/gtest.h>

#include "trident/comm/self_communicator.h"

namespace trident::comm {
namespace {

HostPlacement host(int ranks, int cores, int allowed) {
  return {.host = "node7",
          .local_rank = 1,
          .ranks_on_host = ranks,
          .host_cores = cores,
          .allowed_cpus = allowed};
}

TEST(ThreadPlan, UnsetSplitsTheCoresOverTheRanks) {
  EXPECT_EQ(plan_threads(host(1, 16, 16), 0).threads, 16);
  EXPECT_EQ(plan_threads(host(4, 16, 16), 0).threads, 4);
  EXPECT_EQ(plan_threads(host(3, 16, 16), 0).threads, 5);
  EXPECT_EQ(plan_threads(host(4, 16, 2), 0).threads, 2);  // bound to 2 CPUs (srun --cpu-bind)
  const ThreadPlan p = plan_threads(host(4, 2, 2), 0);    // more ranks than cores: 1 thread each
  EXPECT_EQ(p.threads, 1);
  EXPECT_TRUE(p.oversubscribed);
  EXPECT_NE(p.text.find("host node7: 4 ranks x 1 OpenMP thread = 4 threads on 2 cores"),
            std::string::npos)
      << p.text;
}

TEST(ThreadPlan, RequestedThreadsThatOversubscribeAreAnErrorWithThePlan) {
  EXPECT_EQ(plan_threads(host(4, 16, 16), 4).threads, 4);
  EXPECT_FALSE(plan_threads(host(4, 16, 16), 4).oversubscribed);
  EXPECT_EQ(plan_threads(host(4, 2, 2), 1).threads, 1);  // allowed: ranks share cores
  try {
    plan_threads(host(4, 16, 16), 8);
    FAIL() << "8 threads x 4 ranks on 16 cores accepted";
  } catch (const core::InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("CPU threads oversubscribed: host node7: 4 ranks x 8 OpenMP threads = 32 "
                     "threads on 16 cores"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("Set OMP_NUM_THREADS=4"), std::string::npos) << m;
  }
  EXPECT_THROW(plan_threads(host(1, 16, 4), 8), core::InvalidArgument);  // more than its CPUs
}

TEST(HostPlacement, OneRankIsAloneOnItsHost) {
  SelfCommunicator self;
  const HostPlacement p = host_placement(self);
  EXPECT_EQ(p.local_rank, 0);
  EXPECT_EQ(p.ranks_on_host, 1);
  EXPECT_GE(p.host_cores, 1);
  EXPECT_GE(p.allowed_cpus, 1);
  EXPECT_FALSE(p.host.empty());
}

}  // namespace
}  // namespace trident::comm
