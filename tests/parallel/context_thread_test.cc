// ParallelContext on thread worlds of 1..8 ranks, for every (tp, pp) that divides the world.
#include <gtest/gtest.h>

#include "context_checks.h"
#include "trident/comm/thread_communicator.h"

namespace trident::parallel {
namespace {

class ContextOnThreads : public ::testing::TestWithParam<int> {};

TEST_P(ContextOnThreads, EveryLayoutMatchesItsArithmetic) {
  for (const ParallelLayout& layout : testing::layouts_for(GetParam())) {
    SCOPED_TRACE(::testing::Message() << layout);
    comm::run_on_threads(
        GetParam(), [&](comm::Communicator& world) { testing::check_context(world, layout); },
        comm::WaitPolicy{.timeout_s = 30.0});
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ContextOnThreads, ::testing::Range(1, 9),
                         [](const auto& p) { return "world" + std::to_string(p.param); });

TEST(ParallelContext, WorldSizeMustMatchTheLayout) {
  comm::run_on_threads(
      6,
      [](comm::Communicator& world) {
        try {
          ParallelContext par(world, ParallelLayout{.tp_size = 2, .dp_size = 2, .pp_size = 1});
          ADD_FAILURE() << "no exception";
        } catch (const core::InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("layout tp=2 dp=2 pp=1 needs 4 ranks but the world "
                                               "has 6"),
                    std::string::npos)
              << e.what();
        }
      },
      comm::WaitPolicy{.timeout_s = 30.0});
}

TEST(ParallelContext, CoordsStringAndTimeout) {
  comm::run_on_threads(
      8,
      [](comm::Communicator& world) {
        ParallelContext par(world, ParallelLayout::from_world_size(8, 2, 2));
        if (world.rank() == 5) {
          EXPECT_EQ(par.coords_string(), "r5 tp1 dp0 pp1");
        }
        par.set_timeout(3.5);
        EXPECT_EQ(par.dp().wait_policy().timeout_s, 3.5);
        EXPECT_EQ(par.world().wait_policy().timeout_s, 3.5);
      },
      comm::WaitPolicy{.timeout_s = 30.0});
}

}  // namespace
}  // namespace trident::parallel
