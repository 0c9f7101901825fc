// The optimizer the user asked for: which update rule (--optimizer) and its hyper-parameters, as
// written (doubles, as Megatron's Python floats; the update kernels take them as float).
#pragma once

#include <string>
#include <string_view>

namespace trident::optim {

// The update rules (optim/update_rule.h). Adding one: docs/architecture.md, "How to add an
// optimizer".
enum class OptimizerKind {
  kAdamW,  // --optimizer adam (Megatron's adam is AdamW: decoupled weight decay)
  kLion,   // --optimizer lion (Chen et al. 2023)
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double beta1 = 0.9;  // --adam-beta1
  double beta2 = 0.999;
  double eps = 1e-8;
  double lion_beta1 = 0.9;   // --lion-beta1: the interpolation that is signed into the step
  double lion_beta2 = 0.99;  // --lion-beta2: the momentum's decay
  double weight_decay = 0.01;
  double clip_grad = 1.0;  // global-norm clipping threshold; 0 disables
  friend bool operator==(const OptimizerConfig&, const OptimizerConfig&) = default;
};

// The --optimizer names: "adam", "lion" (and the checkpoint manifest's "optimizer").
const char* optimizer_name(OptimizerKind kind);
// "adam" or "adamw" -> kAdamW, "lion" -> kLion; anything else is a core::InvalidArgument naming
// the choices.
OptimizerKind parse_optimizer(std::string_view name);

}  // namespace trident::optim
