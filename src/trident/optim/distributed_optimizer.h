// The distributed optimizer: an update rule (optim/update_rule.h: AdamW, Lion) on the range of the
// flat buffers this rank updates — everything at ZeRO stage 0, its shard at stages 1-3 — with the
// rule's state arrays (AdamW's two moments, Lion's momentum) kept only for that range; at stages
// 1-2 the updated shards are then all-gathered into every rank's whole weights (stage 3 keeps only
// the master shard; stage 0 updated everything). Nothing here knows which rule runs.
// With --offload-optimizer nvme the state arrays live in files (optim/offload.h), with
// --offload-params nvme the master shard (ZeRO-3) too, and the update streams them chunk by chunk
// through the store's window; the arithmetic, element by element, is the same.
//
// On a GPU, --offload-optimizer cpu keeps the state in pinned host memory and nvme in the files,
// and the update runs on the host (ZeRO-Offload): chunk by chunk, the gradient and the master
// weights of the chunk come down to pinned buffers, the CPU's rule updates them with the state,
// and the weights go back up; the next chunk's copies run while the CPU updates this one (two
// sets of buffers). The GPU keeps the weights and gradients, not the optimizer state.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/arena.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/memory.h"
#include "trident/optim/comm_counters.h"
#include "trident/optim/offload.h"
#include "trident/optim/param_buffers.h"
#include "trident/optim/update_rule.h"

namespace trident::optim {

class DistributedOptimizer {
 public:
  // `ctx`: where the buffers live (a CUDA context: the update runs on the host, with the state
  // in host memory, when `offload` is cpu or nvme; its pinned staging buffers, four, share
  // `window_bytes`, --offload-window-mib). `state_array`: the store's first array of the rule's
  // state (they follow in the rule's order), -1 when the state is in memory.
  DistributedOptimizer(ParamGradBuffers& buffers, comm::Communicator& dp, CommCounters& counters,
                       const OptimizerConfig& cfg, OffloadStore* store = nullptr,
                       int param_array = -1, int state_array = -1,
                       const core::ExecContext& ctx = {},
                       OffloadDevice offload = OffloadDevice::kNone,
                       std::int64_t window_bytes = 48ll << 20);
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // The flat range this rank updates (and whose state it keeps).
  Range updated_range() const { return range_; }
  // One step on updated_range(): grads holds that range's reduced gradient; grad_scale
  // multiplies it first (unscale and clip). `step` is 1-based. Then rebuilds the whole weights
  // where the policy keeps them whole but updates a shard.
  void step(const core::ExecContext& ctx, double lr, std::int64_t step, float grad_scale,
            const float* grads);
  const UpdateRule& rule() const { return *rule_; }

  // The rule's state arrays by name (a checkpoint's tensor names, the offload files'), in the
  // rule's order, over updated_range() clipped to the unpadded numel (offloaded: the shared
  // mappings of their files; call release_pages() after reading or writing them).
  struct StateArray {
    const char* name;
    FlatSpan<float> span;
  };
  std::vector<StateArray> state() const;
  std::int64_t bytes() const { return state_arena_.capacity(); }  // resident (0 when offloaded)
  // The state is in host memory while the weights are on a GPU (the update runs on the host).
  bool updates_on_host() const { return on_host_; }

 private:
  Range stored() const;
  // The rule on elements [lo, hi) of updated_range() (offsets into it); grads, p and each of
  // state address element lo.
  void update(const core::ExecContext& ctx, double lr, std::int64_t step, float grad_scale,
              const float* grads, std::int64_t lo, std::int64_t hi, float* p,
              std::span<float* const> state);
  // The update on the host of a GPU's weights and gradients (device_grads: the range's).
  void step_on_host(const core::ExecContext& ctx, double lr, std::int64_t step, float grad_scale,
                    const float* device_grads);

  ParamGradBuffers& buf_;
  comm::Communicator& dp_;
  CommCounters& counters_;
  std::unique_ptr<UpdateRule> rule_;
  Range range_;
  core::Arena state_arena_;
  std::vector<float*> state_;      // each state array at updated_range().begin (one per rule name)
  OffloadStore* store_ = nullptr;  // owned by the composition
  int param_array_ = -1, state_array_ = -1;
  bool on_host_ = false;
  kernels::HostBuffer host_state_;  // --offload-optimizer cpu on a GPU: the arrays, pinned
  // Pinned staging of the host update: [set][0: gradients, 1: weights], stage_elements_ each.
  std::int64_t stage_elements_ = 0;
  kernels::HostBuffer stage_[2][2];
};

}  // namespace trident::optim
