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

namespace {

double decay(const LrSchedule& s, double ratio) {
  const double clamped = std::clamp(ratio, 0.0, 1.0);
  const double coeff = s.decay_style == LrDecayStyle::kLinear
                           ? 1.0 - clamped
                           : 0.5 * (std::cos(std::numbers::pi * clamped) + 1.0);
  return s.min_lr + coeff * (s.lr - s.min_lr);
}

}  // namespace

double LrSchedule::at(double steps) const {
  if (warmup_iters > 0 && steps <= warmup_iters) {
    return init_lr + (lr - init_lr) * steps / warmup_iters;
  }
  if (decay_style == LrDecayStyle::kConstant) return lr;
  if (steps > decay_iters) return min_lr;
  const double span = decay_iters - warmup_iters;
  return decay(*this, span > 0 ? (steps - warmup_iters) / span : 1.0);
}

MegatronLrScheduler::MegatronLrScheduler(Config c) : c_(c) { lr_ = compute(); }

void MegatronLrScheduler::set_state(const State& s) {
  state_ = s;
  lr_ = compute();
}

void MegatronLrScheduler::step(double increment_samples, double tokens_before_iteration) {
  state_.num_tokens = tokens_before_iteration;
  state_.num_steps += increment_samples;
  lr_ = compute();
}

double MegatronLrScheduler::compute() {
  const LrSchedule& s = c_.samples;
  if (!c_.decay_tokens) return s.at(state_.num_steps);
  // Megatron-DeepSpeed's token-based decay (optimizer_param_scheduler.py).
  std::optional<double> warm_tok = c_.warmup_tokens ? c_.warmup_tokens : state_.warmup_tokens;
  if (!warm_tok) {
    if (s.warmup_iters > 0 && state_.num_steps <= s.warmup_iters) {
      if (state_.num_steps == s.warmup_iters) state_.warmup_tokens = state_.num_tokens;
      return s.init_lr + (s.lr - s.init_lr) * state_.num_steps / s.warmup_iters;
    }
  } else if (*warm_tok > 0 && state_.num_tokens <= *warm_tok) {
    return s.init_lr + (s.lr - s.init_lr) * state_.num_tokens / *warm_tok;
  }
  if (s.decay_style == LrDecayStyle::kConstant) return s.lr;
  if (state_.num_tokens > *c_.decay_tokens) return s.min_lr;
  const double w = warm_tok.value_or(0.0);
  const double span = *c_.decay_tokens - w;
  return decay(s, span > 0 ? (state_.num_tokens - w) / span : 1.0);
}

}  // namespace trident::optim
