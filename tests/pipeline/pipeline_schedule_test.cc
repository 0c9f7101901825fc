// Pipeline schedules as data: invariants over many (P, m, v) for every schedule, checked by
// simulating all stages together (no deadlock, every send matched), plus the in-flight bounds.
#include "trident/parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

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

// The lockstep plan (NCCL's point-to-point order): every stage runs its schedule's steps in
// order; every message is sent and received in the same round, at most one per round and
// direction of a pair (a stage runs one step a round), so both ends post a pair's messages in the
// same order; a step runs only in a round after its input arrived; the slots cover what the plan
// holds. A plan that received a message in another round than it was sent (the interleaved
// schedule's problem on NCCL: a pair's two ends in different orders) or dropped one fails.
TEST(LockstepPlan, EveryMessageMatchesInItsRoundInOrder) {
  int checked = 0;
  for (int P = 2; P <= 4; ++P) {
    for (int v = 1; v <= 3; ++v) {
      for (int m = P; m <= 3 * P; m += (v > 1 ? P : 1)) {
        const auto kind =
            v > 1 ? PipelineScheduleKind::kInterleaved1F1B : PipelineScheduleKind::k1F1B;
        const PipelineShape shape{P, m, v};
        std::vector<LockstepPlan> plans;
        for (int st = 0; st < P; ++st) plans.push_back(build_lockstep_plan(kind, shape, st));
        using Key = std::tuple<bool, int, int>;  // gradient, micro-batch, producer
        // (round, from, to) -> the messages in posting order, as sent and as received.
        std::map<std::tuple<int, int, int>, std::vector<Key>> sent, received;
        for (int st = 0; st < P; ++st) {
          const std::vector<PipeStep> steps = build_pipeline_schedule(kind, shape, st);
          std::vector<int> ran;
          std::map<std::tuple<bool, int, int>, int> arrived;  // (gradient, micro, chunk) -> round
          int last_round = -1;
          for (const PipeRound& r : plans[static_cast<std::size_t>(st)].rounds) {
            ASSERT_GT(r.round, last_round);
            last_round = r.round;
            if (r.step >= 0) {
              ran.push_back(r.step);
              const PipeStep& s = steps[static_cast<std::size_t>(r.step)];
              const int u = s.chunk * P + st;
              const bool fwd = s.op == PipeOp::kForward;
              if ((fwd && u > 0) || (!fwd && u < P * v - 1)) {
                const auto at = arrived.find({!fwd, s.microbatch, s.chunk});
                ASSERT_NE(at, arrived.end()) << "P=" << P << " v=" << v << " m=" << m;
                EXPECT_LT(at->second, r.round) << "a step ran before its input arrived";
              }
            }
            for (const PipeMessage& msg : r.sends)
              sent[{r.round, st, msg.peer}].push_back(
                  {msg.gradient, msg.microbatch, msg.from_virtual});
            for (const PipeMessage& msg : r.recvs) {
              received[{r.round, msg.peer, st}].push_back(
                  {msg.gradient, msg.microbatch, msg.from_virtual});
              arrived[{msg.gradient, msg.microbatch, msg.chunk}] = r.round;
            }
          }
          std::vector<int> all(steps.size());
          for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
          EXPECT_EQ(ran, all) << "stage " << st << ": its schedule's steps, in order";
          const std::vector<int> slots = activation_slots_per_chunk(kind, shape, st);
          const std::vector<int> in_flight = max_in_flight_per_chunk(steps, v);
          for (int c = 0; c < v; ++c) {
            EXPECT_GE(slots[static_cast<std::size_t>(c)], in_flight[static_cast<std::size_t>(c)]);
            if (v > 1) {  // the executor runs in lockstep only with virtual stages
              EXPECT_GE(
                  slots[static_cast<std::size_t>(c)],
                  plans[static_cast<std::size_t>(st)].slots_per_chunk[static_cast<std::size_t>(c)]);
            }
          }
        }
        EXPECT_EQ(sent, received) << "P=" << P << " v=" << v << " m=" << m;
        for (const auto& [where, list] : sent) EXPECT_EQ(list.size(), 1u);
        // Every virtual-stage boundary carries one activation and one gradient per micro-batch.
        std::size_t messages = 0;
        for (const auto& [where, list] : sent) messages += list.size();
        EXPECT_EQ(messages, static_cast<std::size_t>(2 * m * (P * v - 1)));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace trident::parallel
