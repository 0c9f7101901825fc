// Pipeline schedules as data: invariants over many (P, m, v) for every schedule, checked by
// simulating all stages together (no deadlock, every send matched), plus the in-flight bounds.
#include "trident/parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include "trident/core/error.h"

namespace trident::parallel {
namespace {

TEST(PipelineSchedule, OneF1BMatchesTheTextbookOrder) {
  // P = 4, m = 6, stage 1: warm-up 2 forwards, then 1F1B, then 2 backwards.
  const auto s = build_pipeline_schedule(PipelineScheduleKind::k1F1B, {4, 6, 1}, 1);
  const std::vector<PipeStep> expected = {
      {PipeOp::kForward, 0, 0},  {PipeOp::kForward, 1, 0},  {PipeOp::kForward, 2, 0},
      {PipeOp::kBackward, 0, 0}, {PipeOp::kForward, 3, 0},  {PipeOp::kBackward, 1, 0},
      {PipeOp::kForward, 4, 0},  {PipeOp::kBackward, 2, 0}, {PipeOp::kForward, 5, 0},
      {PipeOp::kBackward, 3, 0}, {PipeOp::kBackward, 4, 0}, {PipeOp::kBackward, 5, 0}};
  EXPECT_EQ(s, expected);
}

TEST(PipelineSchedule, InterleavedChunkOrder) {
  // P = 2, v = 2, m = 4, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards:
  // micro 0,1 of chunk 0, then micro 0,1 of chunk 1.
  const auto s = build_pipeline_schedule(PipelineScheduleKind::kInterleaved1F1B, {2, 4, 2}, 0);
  ASSERT_GE(s.size(), 5u);
  EXPECT_EQ(s[0], (PipeStep{PipeOp::kForward, 0, 0}));
  EXPECT_EQ(s[1], (PipeStep{PipeOp::kForward, 1, 0}));
  EXPECT_EQ(s[2], (PipeStep{PipeOp::kForward, 0, 1}));
  EXPECT_EQ(s[3], (PipeStep{PipeOp::kForward, 1, 1}));
  EXPECT_EQ(s[4], (PipeStep{PipeOp::kForward, 2, 0}));
  EXPECT_EQ(s[5], (PipeStep{PipeOp::kBackward, 0, 1}));  // backward starts with the last chunk
}

TEST(PipelineSchedule, InvariantsHoldForManyShapes) {
  int checked = 0;
  for (int P = 1; P <= 8; ++P) {
    for (int m = 1; m <= 3 * P + 2; ++m) {
      for (auto kind : {PipelineScheduleKind::kGPipe, PipelineScheduleKind::k1F1B}) {
        const PipelineShape shape{P, m, 1};
        ASSERT_EQ(simulate_pipeline(kind, shape), "")
            << pipeline_schedule_name(kind) << " P=" << P << " m=" << m;
        for (int st = 0; st < P; ++st) {
          const int live = max_in_flight(build_pipeline_schedule(kind, shape, st));
          if (kind == PipelineScheduleKind::k1F1B) {
            EXPECT_LE(live, std::min(P - st, m)) << "1F1B P=" << P << " m=" << m << " stage " << st;
          } else {
            EXPECT_EQ(live, m);
          }
        }
        ++checked;
      }
      for (int v = 2; v <= 4 && m % P == 0; ++v) {
        const PipelineShape shape{P, m, v};
        ASSERT_EQ(simulate_pipeline(PipelineScheduleKind::kInterleaved1F1B, shape), "")
            << "interleaved P=" << P << " m=" << m << " v=" << v;
        for (int st = 0; st < P; ++st) {
          const int live = max_in_flight(
              build_pipeline_schedule(PipelineScheduleKind::kInterleaved1F1B, shape, st));
          // Megatron's warm-up bound: (P - st - 1) * 2 + (v - 1) * P + 1 chunks in flight.
          EXPECT_LE(live, std::min((P - st - 1) * 2 + (v - 1) * P + 1, m * v));
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 200);
}

TEST(PipelineSchedule, BadShapesAreRejected) {
  EXPECT_THROW(build_pipeline_schedule(PipelineScheduleKind::kInterleaved1F1B, {4, 6, 2}, 0),
               core::InvalidArgument);
  EXPECT_THROW(build_pipeline_schedule(PipelineScheduleKind::k1F1B, {4, 6, 2}, 0),
               core::InvalidArgument);
  EXPECT_THROW(build_pipeline_schedule(PipelineScheduleKind::k1F1B, {4, 6, 1}, 4),
               core::InvalidArgument);
  EXPECT_THROW(parse_pipeline_schedule("zigzag"), core::InvalidArgument);
}

}  // namespace
}  // namespace trident::parallel
