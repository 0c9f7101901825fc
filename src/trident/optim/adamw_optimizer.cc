#include "trident/optim/adamw_optimizer.h"

#include <algorithm>

#include "trident/core/view.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/elementwise.h"

namespace trident::optim {

void adamw_step(const core::ExecContext& ctx, const model::ParamTable& table,
                const OptimizerConfig& cfg, double lr, std::int64_t step, float grad_scale,
                const AdamWShard& shard) {
  for_each_param_in(
      table, shard.range, [&](const model::ParamSpec& p, std::int64_t lo, std::int64_t hi) {
        const std::int64_t at = lo - shard.range.begin;
        kernels::adamw_update(
            ctx,
            {.lr = static_cast<float>(lr),
             .beta1 = static_cast<float>(cfg.beta1),
             .beta2 = static_cast<float>(cfg.beta2),
             .eps = static_cast<float>(cfg.eps),
             .weight_decay = p.weight_decay ? static_cast<float>(cfg.weight_decay) : 0.0f,
             .step = step,
             .grad_scale = grad_scale},
            {.param = core::view(shard.params + at, {hi - lo}, ctx.device),
             .m = core::view(shard.m + at, {hi - lo}, ctx.device),
             .v = core::view(shard.v + at, {hi - lo}, ctx.device),
             .grad = core::view(shard.grads + at, {hi - lo}, ctx.device)});
      });
}

void append_grad_norm_ranges(const core::ExecContext& ctx, const model::ParamTable& table,
                             FlatRange range, const float* grads, int tp_rank,
                             std::vector<kernels::SumSquaresViews>& out) {
  for (const model::ParamSpec& p : table.params) {
    if (p.shared || (p.tp_duplicated() && tp_rank != 0)) continue;
    // A partly replicated parameter's copies count once: on the first rank of each subgroup.
    const std::int64_t counted = tp_rank % p.tp_replicas == 0 ? p.numel : p.replicated_begin();
    const std::int64_t lo = std::max(p.offset, range.begin);
    const std::int64_t hi = std::min(p.offset + counted, range.end);
    if (lo < hi)
      out.push_back({.x = core::view(grads + (lo - range.begin), {hi - lo}, ctx.device)});
  }
}

double grad_norm_squared_share(const core::ExecContext& ctx, const model::ParamTable& table,
                               FlatRange range, const float* grads, int tp_rank) {
  std::vector<kernels::SumSquaresViews> ranges;
  append_grad_norm_ranges(ctx, table, range, grads, tp_rank, ranges);
  return kernels::sum_squares(ctx, ranges);
}

float clip_coefficient(double grad_norm, double clip_grad) {
  if (clip_grad <= 0.0) return 1.0f;
  const double coeff = clip_grad / (grad_norm + 1e-6);
  return coeff < 1.0 ? static_cast<float>(coeff) : 1.0f;
}

}  // namespace trident::optim
