// Learning-rate schedule of Megatron's OptimizerParamScheduler: linear warm-up from init_lr to lr
// over warmup_iters steps, then constant / linear / cosine decay to min_lr at decay_iters steps,
// min_lr after. A "step" is whatever the caller counts: Megatron counts samples (iterations are
// converted to iterations x global batch size), Megatron-DeepSpeed can also count tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace trident::optim {

enum class LrDecayStyle : std::uint8_t { kConstant, kLinear, kCosine };
LrDecayStyle parse_lr_decay_style(const std::string& s);  // InvalidArgument on unknown
const char* lr_decay_style_name(LrDecayStyle s);

struct LrSchedule {
  double lr = 1e-4;
  double min_lr = 0.0;
  LrDecayStyle decay_style = LrDecayStyle::kLinear;
  double warmup_iters = 0;  // in the caller's steps
  double decay_iters = 0;   // 0 -> train_iters (set by the trainer)
  double init_lr = 0.0;     // --lr-warmup-init

  // Learning rate after `steps` completed steps.
  double at(double steps) const;
};

// Megatron's scheduler state, stepped after every successful optimizer step (a skipped step does
// not advance it): num_steps counts samples, num_tokens the tokens consumed before the iteration
// (Megatron-DeepSpeed passes consumed_train_tokens, updated after the step). With decay_tokens
// set, warm-up and decay are measured in tokens as Megatron-DeepSpeed does; a warm-up given in
// samples then ends at the token count reached when it ends.
class MegatronLrScheduler {
 public:
  struct Config {
    LrSchedule samples;  // warm-up and decay in samples
    std::optional<double> warmup_tokens, decay_tokens;
  };
  struct State {
    double num_steps = 0, num_tokens = 0;
    std::optional<double> warmup_tokens;  // set when a sample warm-up meets a token decay
  };
  explicit MegatronLrScheduler(Config c);
  double lr() const { return lr_; }  // the rate the next iteration uses
  void step(double increment_samples, double tokens_before_iteration);
  const State& state() const { return state_; }
  void set_state(const State& s);

 private:
  double compute();
  Config c_;
  State state_;
  double lr_ = 0;
};

}  // namespace trident::optim
