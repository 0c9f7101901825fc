#include "trident/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "trident/core/error.h"

namespace trident::optim {

LrDecayStyle parse_lr_decay_style(const std::string& s) {
  if (s == "constant") return LrDecayStyle::kConstant;
  if (s == "linear") return LrDecayStyle::kLinear;
  if (s == "cosine") return LrDecayStyle::kCosine;
  throw core::InvalidArgument(
      core::str("--lr-decay-style: unknown style '", s, "' (use constant, linear or cosine)"));
}

const char* lr_decay_style_name(LrDecayStyle s) {
  switch (s) {
    case LrDecayStyle::kConstant:
      return "constant";
    case LrDecayStyle::kLinear:
      return "linear";
    case LrDecayStyle::kCosine:
      return "cosine";
  }
  return "?";
}

double LrSchedule::at(std::int64_t steps) const {
  if (warmup_iters > 0 && steps <= warmup_iters) {
    return lr * static_cast<double>(steps) / static_cast<double>(warmup_iters);
  }
  if (decay_style == LrDecayStyle::kConstant) return lr;
  if (steps > decay_iters) return min_lr;
  const double span = static_cast<double>(decay_iters - warmup_iters);
  const double ratio = span > 0 ? static_cast<double>(steps - warmup_iters) / span : 1.0;
  const double clamped = std::clamp(ratio, 0.0, 1.0);
  const double coeff = decay_style == LrDecayStyle::kLinear
                           ? 1.0 - clamped
                           : 0.5 * (std::cos(std::numbers::pi * clamped) + 1.0);
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace trident::optim
