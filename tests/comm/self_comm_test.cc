// SelfCommunicator (a group of one): every collective is the identity, in place or copying.
#include <gtest/gtest.h>

#include "collective_checks.h"
#include "trident/comm/self_communicator.h"

namespace trident::comm {
namespace {

TEST(SelfCommunicator, EveryCollectiveOverTheSweep) {
  SelfCommunicator c("world", 3);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.global_rank(), 3);
  testing::check_everything(c);
}

TEST(SelfCommunicator, PointToPointHasNoPeer) {
  SelfCommunicator c;
  float x = 1;
  EXPECT_THROW(c.send(&x, 1, Datatype::kF32, 0), core::InvalidArgument);
  EXPECT_THROW(c.recv(&x, 1, Datatype::kF32, 1), core::InvalidArgument);
}

TEST(SelfCommunicator, SplitKeepsNameAndGlobalRank) {
  SelfCommunicator c("world", 5);
  c.set_step(9);
  std::unique_ptr<Communicator> tp = c.split(0, 0, "tp");
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->name(), "tp");
  EXPECT_EQ(tp->global_rank(), 5);
  EXPECT_EQ(tp->step(), 9);
  EXPECT_EQ(c.split(Communicator::kNoColor, 0, "none"), nullptr);
}

TEST(Describe, NamesOperationGroupRanksPeerAndStep) {
  const GroupInfo g{.name = "pp", .global_ranks = {3, 7}};
  EXPECT_EQ(describe(g, 0,
                     {.kind = OpKind::kSend,
                      .count = 5,
                      .dtype = Datatype::kBF16,
                      .op = ReduceOp::kSum,
                      .peer = 1,
                      .tag = 2,
                      .step = 100}),
            "send(count=5, bf16, tag 2) to peer 1 (global 7) on group 'pp' (global ranks [3, 7]; "
            "this rank: 0 = global 3) at step 100");
  EXPECT_EQ(describe(g, 1,
                     {.kind = OpKind::kReduceScatter,
                      .count = 9,
                      .dtype = Datatype::kF64,
                      .op = ReduceOp::kMax}),
            "reduce_scatter(count=9, f64, max) on group 'pp' (global ranks [3, 7]; this rank: 1 = "
            "global 7) before the first step");
  GroupInfo big{.name = "dp", .global_ranks = {}};
  for (int r = 0; r < 64; ++r) big.global_ranks.push_back(2 * r);
  const std::string d = describe(big, 0, {.kind = OpKind::kBarrier});
  EXPECT_NE(d.find("[0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, ..., 126] (64 ranks)"),
            std::string::npos)
      << d;
}

}  // namespace
}  // namespace trident::comm
