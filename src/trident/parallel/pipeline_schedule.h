// Pipeline schedules as data: for each stage, the ordered list of forward and backward steps
// (micro-batch, model chunk) it runs in one iteration. One executor (train/pipeline.cc) runs any
// of them; tests check their invariants by simulating every stage together.
//
//   GPipe (all forward, all backward), 1F1B (PipeDream-flush: warm-up forwards, steady one
//   forward / one backward, cool-down backwards; at most P - stage activations in flight) and
//   interleaved 1F1B (Megatron: each rank holds v chunks, virtual stage = chunk * P + stage;
//   bubble (P - 1) / (v m) instead of (P - 1) / m; needs m to be a multiple of P).
#pragma once

#include <cstdint>
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
// executor allocates for each chunk (train/pipeline.cc) and the planner counts.
std::vector<int> max_in_flight_per_chunk(const std::vector<PipeStep>& steps, int num_chunks);

// Simulates all stages executing their schedules with blocking receives and non-blocking sends
// (the executor's semantics) and returns "" when every step ran, or a description of the
// deadlock or the broken dependency. Also checks that every (micro-batch, chunk) gets exactly one
// forward and one backward per stage, backward after forward.
std::string simulate_pipeline(PipelineScheduleKind kind, const PipelineShape& shape);

}  // namespace trident::parallel
