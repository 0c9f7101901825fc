#include "trident/optim/update_rule.h"

#include <algorithm>

#include "trident/core/error.h"
#include "trident/core/view.h"
#include "trident/kernels/lion.h"
#include "trident/optim/adamw_optimizer.h"

namespace trident::optim {

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW:
      return "adam";
    case OptimizerKind::kLion:
      return "lion";
  }
  return "?";
}

OptimizerKind parse_optimizer(std::string_view name) {
  if (name == "adam" || name == "adamw") return OptimizerKind::kAdamW;
  if (name == "lion") return OptimizerKind::kLion;
  throw core::InvalidArgument(
      core::str("--optimizer ", name,
                ": trident has adam (AdamW, Megatron's adam) and lion; sgd is not built"));
}

namespace {

class AdamWRule final : public UpdateRule {
 public:
  explicit AdamWRule(const OptimizerConfig& cfg) : cfg_(cfg) {}
  std::span<const char* const> state_arrays() const override { return kNames; }
  void apply(const core::ExecContext& ctx, const model::ParamTable& table, double lr,
             std::int64_t step, float grad_scale, const RuleShard& shard) const override {
    adamw_step(ctx, table, cfg_, lr, step, grad_scale,
               {.range = shard.range,
                .params = shard.params,
                .grads = shard.grads,
                .m = shard.state[0],
                .v = shard.state[1]});
  }
  static constexpr const char* kNames[] = {"exp_avg", "exp_avg_sq"};

 private:
  OptimizerConfig cfg_;
};

// Lion: one state array, the momentum (lion-pytorch's and DeepSpeed's name, exp_avg). The step
// count plays no part (no bias correction).
class LionRule final : public UpdateRule {
 public:
  explicit LionRule(const OptimizerConfig& cfg) : cfg_(cfg) {}
  std::span<const char* const> state_arrays() const override { return kNames; }
  void apply(const core::ExecContext& ctx, const model::ParamTable& table, double lr,
             std::int64_t /*step*/, float grad_scale, const RuleShard& shard) const override {
    for_each_param_in(
        table, shard.range, [&](const model::ParamSpec& p, std::int64_t lo, std::int64_t hi) {
          const std::int64_t at = lo - shard.range.begin;
          kernels::lion_update(
              ctx,
              {.lr = static_cast<float>(lr),
               .beta1 = static_cast<float>(cfg_.lion_beta1),
               .beta2 = static_cast<float>(cfg_.lion_beta2),
               .weight_decay = p.weight_decay ? static_cast<float>(cfg_.weight_decay) : 0.0f,
               .grad_scale = grad_scale},
              {.param = core::view(shard.params + at, {hi - lo}, ctx.device),
               .m = core::view(shard.state[0] + at, {hi - lo}, ctx.device),
               .grad = core::view(shard.grads + at, {hi - lo}, ctx.device)});
        });
  }
  static constexpr const char* kNames[] = {"exp_avg"};

 private:
  OptimizerConfig cfg_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_update_rule(const OptimizerConfig& cfg) {
  switch (cfg.kind) {
    case OptimizerKind::kAdamW:
      return std::make_unique<AdamWRule>(cfg);
    case OptimizerKind::kLion:
      return std::make_unique<LionRule>(cfg);
  }
  throw core::InternalError("make_update_rule: unknown optimizer kind");
}

int state_array_count(OptimizerKind kind) {
  return static_cast<int>(make_update_rule({.kind = kind})->state_arrays().size());
}

}  // namespace trident::optim
