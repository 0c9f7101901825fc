// ParamGradBuffers: the rank's parameter and gradient storage for one ZeRO stage, allocated
// exactly as buffer_sizes() states (optim/model_state.h). Flat FP32 in the FlatLayout; shards
// are ranges of the ShardPlan. Which buffers exist follows from the policy:
//
//   weights:   full (stages 0-2)              or master shard + gathered rest + 2 layer slots (3;
//              --offload-params nvme: the master shard is on disk, optim/offload.h)
//   gradients: full (stages 0-1)              or shard + whole rest + 1 layer slot + rs piece (2-3)
//   --bf16:    a BF16 copy of all weights     or of the rest + 2 layer slots (3)
//
// It holds storage and answers "where is ..."; the parts that move data (grad_sync, zero3_gather,
// distributed_optimizer) hold pointers into it.
#pragma once

#include <cstdint>

#include "trident/core/arena.h"
#include "trident/core/bf16.h"
#include "trident/optim/flat_layout.h"
#include "trident/optim/model_state.h"
#include "trident/optim/zero_policy.h"
#include "trident/parallel/shard_plan.h"

namespace trident::optim {

// A rank's view of one buffer over a flat range: element `range.begin` is at data[0].
template <class T>
struct FlatSpan {
  T* data = nullptr;
  Range range;
};

class ParamGradBuffers {
 public:
  // The buffers are allocated from `memory` (the host's, or a device's: kernels::memory_for).
  ParamGradBuffers(const FlatLayout& layout, const parallel::ShardPlan& plan, ZeroPolicy policy,
                   int dp_rank, bool bf16, bool offload_params = false,
                   core::MemoryResource& memory = core::host_memory());
  ParamGradBuffers(const ParamGradBuffers&) = delete;
  ParamGradBuffers& operator=(const ParamGradBuffers&) = delete;

  const FlatLayout& layout() const { return layout_; }
  // Where the buffers live; the optimizer state beside them comes from it too.
  core::MemoryResource& memory_resource() const { return *memory_; }
  const parallel::ShardPlan& plan() const { return plan_; }
  const BufferSizes& sizes() const { return sizes_; }
  ZeroPolicy policy() const { return policy_; }
  Range shard() const { return plan_.shard(dp_rank_); }
  int dp_rank() const { return dp_rank_; }

  // Weights.
  float* full_params() const { return full_params_; }  // (numel_padded) stages 0-2, else null
  float* master() const { return master_; }            // (shard) stage 3 in memory, else null
  float* rest_params() const { return rest_params_; }  // (rest) stage 3
  float* param_slot(int s) const { return param_slots_[s]; }  // (max unit) stage 3
  // The FP32 weights this rank updates, over `range` (its shard, or everything at stage 0).
  FlatSpan<float> master_weights(Range range) const;

  // Gradients.
  float* full_grads() const { return full_grads_; }  // (numel_padded) stages 0-1
  float* grad_shard() const { return grad_shard_; }  // (shard) stages 2-3
  float* rest_grads() const { return rest_grads_; }  // (rest) stages 2-3
  float* grad_slot() const { return grad_slot_; }    // (max unit) stages 2-3
  float* rs_piece() const { return rs_piece_; }      // (<= shard) stages 2-3
  // Where the whole (not yet data-parallel reduced) gradient of non-layer flat index `flat` is.
  float* rest_grad_at(std::int64_t flat) const;

  // --bf16 copies (null without --bf16).
  core::bf16* bf16_params() const { return bf16_params_; }  // (numel) 0-2, (rest) 3
  core::bf16* bf16_slot(int s) const { return bf16_slots_[s]; }

  // Bytes as allocated (equals memory_report(sizes(), ...)), with the update rule's
  // `state_arrays` arrays of sizes().state (which the distributed optimizer allocates).
  MemoryReport memory(int state_arrays) const;

 private:
  const FlatLayout& layout_;
  parallel::ShardPlan plan_;
  ZeroPolicy policy_;
  int dp_rank_ = 0;
  BufferSizes sizes_;
  core::MemoryResource* memory_;
  core::Arena params_arena_, grads_arena_, staging_arena_, bf16_arena_;
  float* full_params_ = nullptr;
  float* master_ = nullptr;
  float* rest_params_ = nullptr;
  float* param_slots_[2] = {nullptr, nullptr};
  float* full_grads_ = nullptr;
  float* grad_shard_ = nullptr;
  float* rest_grads_ = nullptr;
  float* grad_slot_ = nullptr;
  float* rs_piece_ = nullptr;
  core::bf16* bf16_params_ = nullptr;
  core::bf16* bf16_slots_[2] = {nullptr, nullptr};
};

}  // namespace trident::optim
