// The sizes of every buffer the data-parallel optimizer keeps, as pure functions of the layout,
// the ZeRO stage and dp (no allocation): ParamGradBuffers and DistributedOptimizer allocate exactly
// these, the start-up log and `trident plan` report them.
#pragma once

#include <cstdint>

#include "trident/optim/flat_layout.h"
#include "trident/optim/zero_policy.h"
#include "trident/parallel/shard_plan.h"

namespace trident::optim {

// Shards start on a cache line: 16 FP32 elements.
inline constexpr std::int64_t kShardAlign = 16;

// Elements of each buffer; 0 where the stage keeps none.
struct BufferSizes {
  std::int64_t full_params = 0;       // stages 0-2: the whole (padded) weights
  std::int64_t master = 0;            // stage 3: this rank's shard of the FP32 weights (0 when
                                      // --offload-params nvme keeps it on disk)
  std::int64_t master_offloaded = 0;  // stage 3 with --offload-params nvme: the shard, on disk
  std::int64_t rest_params = 0;       // stage 3: embedding/head weights gathered for an iteration
  std::int64_t full_grads = 0;        // stages 0-1: the whole (padded) gradient
  std::int64_t grad_shard = 0;        // stages 2-3: this rank's shard of the gradient
  std::int64_t rest_grads = 0;   // stages 2-3: embedding/head gradients, whole for an iteration
  std::int64_t grad_slot = 0;    // stages 2-3: one layer's gradient (the largest layer)
  std::int64_t rs_piece = 0;     // stages 2-3: the received piece of a reduce-scatter (the
                                 // largest layer or rest range, at most a shard)
  std::int64_t param_slot = 0;   // stage 3: each of the two layer-weight staging buffers
  std::int64_t state = 0;        // each of the update rule's state arrays (AdamW: 2, Lion: 1)
  std::int64_t bf16_params = 0;  // --bf16: the matmuls' copies (all weights; stage 3 the rest)
  std::int64_t bf16_slot = 0;    // --bf16, stage 3: each of the two staged layers' copies
};

BufferSizes buffer_sizes(const FlatLayout& layout, const parallel::ShardPlan& plan,
                         ZeroPolicy policy, bool bf16, bool offload_params = false);

struct MemoryReport {
  // Model states kept across iterations (what the ZeRO formulas count), bytes.
  std::int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  // Staging: stages 2-3 keep the non-layer (embedding and head) gradients, and in stage 3 their
  // parameters, whole for an iteration, plus one layer-gradient buffer, the received
  // reduce-scatter piece and two layer-parameter buffers.
  std::int64_t staging_bytes = 0;
  // --offload-optimizer nvme: the state arrays' bytes on disk (optimizer_bytes is then the window).
  std::int64_t offloaded_bytes = 0;
  // The ZeRO paper's formulas for this rank's psi parameters (FP32 training: 4 bytes of weights,
  // 4 of gradients, 4 per state array per parameter, K = 8 with Adam's two moments): stage 0
  // (8 + K) psi, 1 8 psi + K psi/dp, 2 4 psi + (4 + K) psi/dp, 3 (8 + K) psi/dp.
  std::int64_t predicted_param_bytes = 0, predicted_grad_bytes = 0, predicted_optimizer_bytes = 0;

  std::int64_t model_state_bytes() const { return param_bytes + grad_bytes + optimizer_bytes; }
};

// Bytes of each category for these sizes (Arena footprints, as allocated), with `state_arrays`
// arrays of the update rule (optim::state_array_count).
MemoryReport memory_report(const BufferSizes& sizes, ZeroPolicy policy, std::int64_t numel, int dp,
                           int state_arrays);

// Everything at once, from the layout: what one rank of a run with this stage and dp keeps.
MemoryReport model_state_memory(const FlatLayout& layout, int stage, int dp, bool bf16,
                                int state_arrays, bool offload_params = false);

}  // namespace trident::optim
