// The update rule: the arithmetic of one optimizer step over a range of the flat buffers, apart
// from the distributed machinery around it (optim/distributed_optimizer.h: which range a rank
// updates, ZeRO's shards and all-gather, offload streaming, the host update of a GPU's weights).
//
// A rule names its state arrays: FP32 arrays the size of the updated range, zero at the start,
// read and written only by the rule. The distributed optimizer allocates them (in memory, pinned
// host memory or offload files), the checkpoint saves them under those names, and memory planning
// counts them (state_array_count). AdamW keeps exp_avg and exp_avg_sq, Lion exp_avg.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>

#include "trident/core/exec_context.h"
#include "trident/model/param_table.h"
#include "trident/optim/optimizer_config.h"

namespace trident::optim {

struct FlatRange {
  std::int64_t begin = 0, end = 0;  // elements of the flat buffer
};

// Views of one range of the flat layout. Each pointer addresses element `range.begin` of its
// buffer; state[k] is the rule's k-th state array.
struct RuleShard {
  FlatRange range;
  float* params = nullptr;
  const float* grads = nullptr;
  std::span<float* const> state;
};

// Calls fn(param, lo, hi) for each parameter of `table` that overlaps `range`, with [lo, hi) the
// overlap in flat offsets: what a rule's apply walks (weight decay is per parameter).
template <class Fn>
void for_each_param_in(const model::ParamTable& table, FlatRange range, Fn&& fn) {
  for (const model::ParamSpec& p : table.params) {
    const std::int64_t lo = std::max(p.offset, range.begin);
    const std::int64_t hi = std::min(p.offset + p.numel, range.end);
    if (lo < hi) fn(p, lo, hi);
  }
}

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // The state arrays' names, in order (the checkpoint's tensor names, the offload files').
  virtual std::span<const char* const> state_arrays() const = 0;
  // One step on every parameter element inside shard.range of `table`'s layout. `step` is 1-based;
  // grad_scale multiplies the gradients first (unscale and clip). Weight decay follows the table
  // (none on biases and norms).
  virtual void apply(const core::ExecContext& ctx, const model::ParamTable& table, double lr,
                     std::int64_t step, float grad_scale, const RuleShard& shard) const = 0;
};

std::unique_ptr<UpdateRule> make_update_rule(const OptimizerConfig& cfg);
// How many state arrays the rule of `kind` keeps (what memory planning multiplies by).
int state_array_count(OptimizerKind kind);

}  // namespace trident::optim
