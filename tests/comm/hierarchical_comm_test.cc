// HierarchicalCommunicator on thread worlds whose ranks are given host names: the three-stage
// all_reduce (reduce-scatter in the host, all-reduce across, all-gather in the host) and every
// other operation must give what the flat group gives, over the whole count sweep; uneven hosts
// fall back to the flat all_reduce.
#include <gtest/gtest.h>

#include <string>

#include "collective_checks.h"
#include "trident/comm/hierarchical_communicator.h"
#include "trident/comm/thread_communicator.h"

namespace trident::comm {
namespace {

using namespace trident::comm::testing;

struct Hosts {
  int world;
  int per_host;  // rank r lives on host r / per_host
};

class Hierarchical : public ::testing::TestWithParam<Hosts> {};

TEST_P(Hierarchical, EveryOperationMatchesTheFlatGroup) {
  const Hosts h = GetParam();
  run_on_threads(
      h.world,
      [&](Communicator& world) {
        auto dp = HierarchicalCommunicator::create(world.split(0, world.rank(), "dp-flat"), "dp",
                                                   "h" + std::to_string(world.rank() / h.per_host));
        const bool even = h.world % h.per_host == 0;
        EXPECT_EQ(dp->hierarchical(), even && h.per_host > 1 && h.world > h.per_host);
        if (dp->hierarchical()) {
          EXPECT_EQ(dp->members_per_host(), h.per_host);
          EXPECT_EQ(dp->hosts(), h.world / h.per_host);
        }
        EXPECT_EQ(dp->name(), "dp");
        EXPECT_EQ(dp->rank(), world.rank());
        check_everything(*dp);
      },
      WaitPolicy{.timeout_s = 30.0});
}

INSTANTIATE_TEST_SUITE_P(HostLayouts, Hierarchical,
                         ::testing::Values(Hosts{4, 2}, Hosts{6, 2}, Hosts{6, 3}, Hosts{8, 4},
                                           Hosts{3, 2} /* uneven: flat */,
                                           Hosts{4, 4} /* one host: flat */),
                         [](const auto& p) {
                           return std::to_string(p.param.world) + "ranks_" +
                                  std::to_string(p.param.per_host) + "perhost";
                         });

}  // namespace
}  // namespace trident::comm
