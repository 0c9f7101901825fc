// The distributed optimizer: AdamW (optim/adamw_optimizer.h) on the range of the flat buffers
// this rank updates — everything at ZeRO stage 0, its shard at stages 1-3 — with the Adam moments
// kept only for that range; at stages 1-2 the updated shards are then all-gathered into every
// rank's whole weights (stage 3 keeps only the master shard; stage 0 updated everything).
// With --offload-optimizer nvme the moments live in files (optim/offload.h), with
// --offload-params nvme the master shard (ZeRO-3) too, and the update streams them chunk by chunk
// through the store's window; the arithmetic, element by element, is the same.
//
// On a GPU, --offload-optimizer cpu keeps the moments in pinned host memory and nvme in the
// files, and the update runs on the host (ZeRO-Offload): chunk by chunk, the gradient and the
// master weights of the chunk come down to pinned buffers, the CPU's AdamW updates them with the
// moments, and the weights go back up; the next chunk's copies run while the CPU updates this
// one (two sets of buffers). The GPU keeps the weights and gradients, not the moments.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/arena.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/memory.h"
#include "trident/optim/adamw_optimizer.h"
#include "trident/optim/comm_counters.h"
#include "trident/optim/offload.h"
#include "trident/optim/param_buffers.h"

namespace trident::optim {

class DistributedAdamW {
 public:
  // `ctx`: where the buffers live (a CUDA context: the update runs on the host, with the moments
  // in host memory, when `offload` is cpu or nvme; its pinned staging buffers, four, share
  // `window_bytes`, --offload-window-mib).
  DistributedAdamW(ParamGradBuffers& buffers, comm::Communicator& dp, CommCounters& counters,
                   const AdamWConfig& cfg, OffloadStore* store = nullptr, int param_array = -1,
                   int moment_array = -1, const core::ExecContext& ctx = {},
                   OffloadDevice offload = OffloadDevice::kNone,
                   std::int64_t window_bytes = 48ll << 20);
  DistributedAdamW(const DistributedAdamW&) = delete;
  DistributedAdamW& operator=(const DistributedAdamW&) = delete;

  // The flat range this rank updates (and whose moments it keeps).
  Range updated_range() const { return range_; }
  // One step on updated_range(): grads holds that range's reduced gradient; grad_scale
  // multiplies it first (unscale and clip). `step` is 1-based. Then rebuilds the whole weights
  // where the policy keeps them whole but updates a shard.
  void step(const core::ExecContext& ctx, double lr, std::int64_t step, float grad_scale,
            const float* grads);
  const AdamWConfig& config() const { return cfg_; }

  // The moments this rank keeps, over updated_range() clipped to the unpadded numel (offloaded:
  // the shared mappings of their files; call release_pages() after reading or writing them).
  FlatSpan<float> exp_avg() const { return {m_, stored()}; }
  FlatSpan<float> exp_avg_sq() const { return {v_, stored()}; }
  // The update rule's state arrays by name (a checkpoint's tensor names, the offload files'),
  // in this order.
  static constexpr const char* kStateArrays[] = {"exp_avg", "exp_avg_sq"};
  struct StateArray {
    const char* name;
    FlatSpan<float> span;
  };
  std::vector<StateArray> state() const {
    return {{kStateArrays[0], exp_avg()}, {kStateArrays[1], exp_avg_sq()}};
  }
  std::int64_t bytes() const { return moments_.capacity(); }  // resident (0 when offloaded)
  // The moments are in host memory while the weights are on a GPU (the update runs on the host).
  bool updates_on_host() const { return on_host_; }

 private:
  Range stored() const;
  // AdamW on elements [lo, hi) of updated_range() (offsets into it); p, m and v address
  // element lo.
  // grads, p, m and v address element lo.
  void update(const core::ExecContext& ctx, double lr, std::int64_t step, float grad_scale,
              const float* grads, std::int64_t lo, std::int64_t hi, float* p, float* m, float* v);
  // The update on the host of a GPU's weights and gradients (device_grads: the range's).
  void step_on_host(const core::ExecContext& ctx, double lr, std::int64_t step, float grad_scale,
                    const float* device_grads);

  ParamGradBuffers& buf_;
  comm::Communicator& dp_;
  CommCounters& counters_;
  AdamWConfig cfg_;
  Range range_;
  core::Arena moments_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  OffloadStore* store_ = nullptr;  // owned by the composition
  int param_array_ = -1, moment_array_ = -1;
  bool on_host_ = false;
  kernels::HostBuffer host_moments_;  // --offload-optimizer cpu on a GPU: m then v, pinned
  // Pinned staging of the host update: [set][0: gradients, 1: weights], stage_elements_ each.
  std::int64_t stage_elements_ = 0;
  kernels::HostBuffer stage_[2][2];
};

}  // namespace trident::optim
