// The AdamW step over the flat FP32 buffers (the AdamW update rule's arithmetic,
// optim/update_rule.h): master parameters, gradients and the two Adam moments share the
// ParamTable's layout, so a ZeRO shard is just a range [begin, end) of it. Weight decay follows the
// table (none on biases and LayerNorm parameters). Also the global gradient norm and clipping,
// which every rule shares.
#pragma once

#include <cstdint>
#include <vector>

#include "trident/core/exec_context.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/elementwise.h"
#include "trident/model/param_table.h"
#include "trident/optim/optimizer_config.h"
#include "trident/optim/update_rule.h"

namespace trident::optim {

// Views of the optimizer's buffers for one range of the flat layout. Each pointer addresses
// element `range.begin` of its buffer.
struct AdamWShard {
  FlatRange range;
  float* params = nullptr;
  const float* grads = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};

// One AdamW step on every parameter element inside shard.range. `step` is 1-based (bias
// correction); grad_scale multiplies gradients first (clipping coefficient).
void adamw_step(const core::ExecContext& ctx, const model::ParamTable& table,
                const OptimizerConfig& cfg, double lr, std::int64_t step, float grad_scale,
                const AdamWShard& shard);

// This rank's share of the squared global gradient norm over the elements of `range` (offsets
// into the flat buffer; grads points at element range.begin): every parameter element counts
// once across the whole job, so tensor-parallel duplicates (replicated LayerNorms, row-parallel
// biases, position embeddings) count only on tp rank 0 and `shared` copies (the tied embedding on
// the last pipeline stage) not at all. Sum the shares over the model-parallel ranks (and the
// data-parallel ranks when each holds a disjoint gradient shard) for the squared norm.
double grad_norm_squared_share(const core::ExecContext& ctx, const model::ParamTable& table,
                               FlatRange range, const float* grads, int tp_rank);
// The ranges that share sums, appended to `out` (grad_norm_squared_share is their sum_squares):
// a caller with several tables sums them all at once (one host read on a device).
void append_grad_norm_ranges(const core::ExecContext& ctx, const model::ParamTable& table,
                             FlatRange range, const float* grads, int tp_rank,
                             std::vector<kernels::SumSquaresViews>& out);

// Clipping coefficient from the global gradient norm, as Megatron / torch.nn.utils: scale by
// clip / (norm + 1e-6) when that is < 1, else 1.
float clip_coefficient(double grad_norm, double clip_grad);

}  // namespace trident::optim
