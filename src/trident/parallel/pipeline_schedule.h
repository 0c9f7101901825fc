// Pipeline schedules as data: for each stage, the ordered list of forward and backward steps
// (micro-batch, model chunk) it runs in one iteration. One executor (parallel/pipeline_executor.cc)
// runs any of them; tests check their invariants by simulating every stage together.
//
//   GPipe (all forward, all backward), 1F1B (PipeDream-flush: warm-up forwards, steady one
//   forward / one backward, cool-down backwards; at most P - stage activations in flight) and
//   interleaved 1F1B (Megatron: each rank holds v chunks, virtual stage = chunk * P + stage;
//   bubble (P - 1) / (v m) instead of (P - 1) / m; needs m to be a multiple of P).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trident::parallel {

enum class PipeOp : std::uint8_t { kForward, kBackward };

struct PipeStep {
  PipeOp op = PipeOp::kForward;
  int microbatch = 0;
  int chunk = 0;
  friend bool operator==(const PipeStep&, const PipeStep&) = default;
};

enum class PipelineScheduleKind : std::uint8_t { kGPipe, k1F1B, kInterleaved1F1B };
PipelineScheduleKind parse_pipeline_schedule(const std::string& name);  // gpipe, 1f1b, interleaved
const char* pipeline_schedule_name(PipelineScheduleKind kind);

struct PipelineShape {
  int num_stages = 1;        // P
  int num_microbatches = 1;  // m
  int num_chunks = 1;        // v (virtual stages per rank); > 1 only for interleaved
};

// The steps of `stage` (0 .. P-1). Throws InvalidArgument for impossible shapes (interleaved
// with m not a multiple of P, chunks < 1, ...).
std::vector<PipeStep> build_pipeline_schedule(PipelineScheduleKind kind, const PipelineShape& shape,
                                              int stage);

// Largest number of micro-batch activations held at once by `steps` (forwards whose backward has
// not run yet), counting each (micro-batch, chunk) pair.
int max_in_flight(const std::vector<PipeStep>& steps);
// The same per model chunk (0 .. num_chunks - 1), at least 1 each: the activation slots the
// executor allocates for each chunk (parallel/pipeline_executor.cc) and the planner counts.
std::vector<int> max_in_flight_per_chunk(const std::vector<PipeStep>& steps, int num_chunks);

// Simulates all stages executing their schedules with blocking receives and non-blocking sends
// (the executor's semantics) and returns "" when every step ran, or a description of the
// deadlock or the broken dependency. Also checks that every (micro-batch, chunk) gets exactly one
// forward and one backward per stage, backward after forward.
std::string simulate_pipeline(PipelineScheduleKind kind, const PipelineShape& shape);

// The lockstep form of a schedule, for communicators that match a pair's messages by posting
// order and block a send until its receive is posted (NCCL): the stages advance in rounds; in
// each round every stage runs its next step if that step's input has arrived, and then the
// messages the round produced (activations to the next virtual stage, gradients to the previous)
// are exchanged in one batch. Every message is sent and received in the same round, and a round
// carries at most one message per direction of a pair (a stage runs one step a round), so both
// ends post a pair's messages in the same order, the exchange cannot deadlock, and the order of
// a stage's steps is its schedule's. The interleaved schedule needs it on NCCL: its two
// directions of a pair carry activations and gradients of different virtual stages in orders the
// two ranks would post differently (tags sort them out on MPI). Megatron's interleaved schedule
// batches each step's sends and receives the same way (send_forward_backward_recv_...).
struct PipeMessage {
  bool gradient = false;  // false: an activation to the next virtual stage
  int microbatch = 0;
  int from_virtual = 0;  // the virtual stage that produced it
  int peer = 0;          // the other stage
  int chunk = 0;         // this stage's chunk it leaves or enters
  friend bool operator==(const PipeMessage&, const PipeMessage&) = default;
};
struct PipeRound {
  int round = 0;                          // the round's number, the same on every stage
  int step = -1;                          // index of this stage's step run in the round, or -1
  std::vector<PipeMessage> sends, recvs;  // in posting order (peer, kind, micro-batch, producer)
};
struct LockstepPlan {
  std::vector<PipeRound> rounds;  // only the rounds in which this stage does something
  // Per chunk, the most (micro-batch, chunk) activations held at once: from the round their
  // input is received (or their forward runs, on virtual stage 0) to the end of the round of
  // their backward (its gradient is sent from the slot).
  std::vector<int> slots_per_chunk;
};
LockstepPlan build_lockstep_plan(PipelineScheduleKind kind, const PipelineShape& shape, int stage);

// What a stage runs by: its schedule; its lockstep plan where it runs in lockstep (virtual stages
// over more than one stage: parallel/pipeline_executor.cc); and the activation slots the executor
// allocates per chunk: max_in_flight_per_chunk of the schedule, or more where the lockstep plan
// holds more.
struct StagePlan {
  std::vector<PipeStep> schedule;
  std::optional<LockstepPlan> lockstep;
  std::vector<int> slots_per_chunk;
};
StagePlan plan_stage(PipelineScheduleKind kind, const PipelineShape& shape, int stage);

// plan_stage's slots_per_chunk: what trident plan counts.
std::vector<int> activation_slots_per_chunk(PipelineScheduleKind kind, const PipelineShape& shape,
                                            int stage);

}  // namespace trident::parallel
