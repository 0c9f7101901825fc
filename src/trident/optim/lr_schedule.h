// Learning-rate schedule of Megatron's OptimizerParamScheduler: linear warm-up from 0 to lr over
// lr_warmup_iters, then constant / linear / cosine decay to min_lr at lr_decay_iters, min_lr
// after. Iteration k (1-based) uses the rate at step k - 1, as Megatron does.
#pragma once

#include <cstdint>
#include <string>

namespace trident::optim {

enum class LrDecayStyle : std::uint8_t { kConstant, kLinear, kCosine };
LrDecayStyle parse_lr_decay_style(const std::string& s);  // InvalidArgument on unknown
const char* lr_decay_style_name(LrDecayStyle s);

struct LrSchedule {
  double lr = 1e-4;
  double min_lr = 0.0;
  LrDecayStyle decay_style = LrDecayStyle::kLinear;
  std::int64_t warmup_iters = 0;
  std::int64_t decay_iters = 0;  // 0 -> train_iters (set by the trainer)

  // Learning rate after `steps` completed optimizer steps.
  double at(std::int64_t steps) const;
};

}  // namespace trident::optim
