// dist-mpi tier: ParallelContext on real processes for every layout of the world (at np 4 this
// includes tp=2 x pp=2, the layout with all three groups non-trivial but dp).
#include <gtest/gtest.h>

#include "context_checks.h"
#include "trident/comm/mpi_communicator.h"

namespace trident::parallel {
namespace {

std::unique_ptr<comm::MpiCommunicator> make_world() {
  int argc = 0;
  char** argv = nullptr;
  comm::MpiRuntime runtime(argc, argv);  // MPI is up already (mpi_test_main): only queries it
  return comm::MpiCommunicator::world(runtime, comm::WaitPolicy{.timeout_s = 30.0});
}

TEST(ParallelContextMpi, EveryLayoutMatchesItsArithmetic) {
  auto world = make_world();
  ASSERT_GE(world->size(), 2) << "run with mpirun -np 2 or more";
  for (const ParallelLayout& layout : testing::layouts_for(world->size())) {
    SCOPED_TRACE(::testing::Message() << layout);
    testing::check_context(*world, layout);
  }
}

TEST(ParallelContextMpi, Tp2Pp2GroupsAtNp4) {
  auto world = make_world();
  ASSERT_EQ(world->size(), 4) << "run with mpirun -np 4 (the np 2 run filters this test out)";
  ParallelContext par(*world, ParallelLayout::from_world_size(4, 2, 2));
  const int r = world->rank();
  const std::vector<std::vector<int>> tp = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> pp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  EXPECT_EQ(par.tp().group().global_ranks, tp[static_cast<std::size_t>(r)]);
  EXPECT_EQ(par.pp().group().global_ranks, pp[static_cast<std::size_t>(r)]);
  EXPECT_EQ(par.dp().group().global_ranks, (std::vector<int>{r}));
  EXPECT_EQ(par.embedding().group().global_ranks, pp[static_cast<std::size_t>(r)]);
}

}  // namespace
}  // namespace trident::parallel
