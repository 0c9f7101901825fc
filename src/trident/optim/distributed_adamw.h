// The distributed optimizer: AdamW (optim/adamw_optimizer.h) on the range of the flat buffers
// this rank updates — everything at ZeRO stage 0, its shard at stages 1-3 — with the Adam moments
// kept only for that range; at stages 1-2 the updated shards are then all-gathered into every
// rank's whole weights (stage 3 keeps only the master shard; stage 0 updated everything).
// With --offload-optimizer nvme the moments live in files (optim/offload.h), with
// --offload-params nvme the master shard (ZeRO-3) too, and the update streams them chunk by chunk
// through the store's window; the arithmetic, element by element, is the same.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "trident/comm/communicator.h"
#include "trident/core/arena.h"
#include "trident/core/exec_context.h"
#include "trident/optim/adamw_optimizer.h"
#include "trident/optim/comm_counters.h"
#include "trident/optim/offload.h"
#include "trident/optim/param_buffers.h"

namespace trident::optim {

class DistributedAdamW {
 public:
  DistributedAdamW(ParamGradBuffers& buffers, comm::Communicator& dp, CommCounters& counters,
                   const AdamWConfig& cfg, OffloadStore* store = nullptr, int param_array = -1,
                   int moment_array = -1);
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
  std::int64_t bytes() const { return moments_.capacity(); }  // resident (0 when offloaded)

 private:
  Range stored() const;
  // AdamW on elements [lo, hi) of updated_range() (offsets into it); p, m and v address
  // element lo.
  void update(const core::ExecContext& ctx, double lr, std::int64_t step, float grad_scale,
              const float* grads, std::int64_t lo, std::int64_t hi, float* p, float* m, float* v);

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
};

}  // namespace trident::optim
