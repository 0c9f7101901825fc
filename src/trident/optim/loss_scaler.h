// Loss scaling for FP16 training (Megatron's DynamicGradScaler / DeepSpeed's loss scaler): the
// loss is multiplied by `scale` before backward so small gradients survive FP16; an overflow (a
// gradient that is not finite, or does not fit FP16) skips the step on every rank and lowers the
// scale after `hysteresis` consecutive overflows; `window` clean steps in a row double it.
#pragma once

#include <cstdint>

namespace trident::optim {

struct LossScalerConfig {
  bool dynamic = true;
  double static_scale = 1.0;       // --loss-scale (dynamic = false)
  double initial_scale = 65536.0;  // --initial-loss-scale (2^16)
  double min_scale = 1.0;          // --min-loss-scale
  std::int64_t window = 1000;      // --loss-scale-window
  std::int64_t hysteresis = 2;     // --hysteresis
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg);
  double scale() const { return scale_; }
  // Records the outcome of a step (found_overflow: on any rank) and updates the scale.
  void update(bool found_overflow);

  struct State {
    double scale = 1;
    std::int64_t growth_tracker = 0, hysteresis_tracker = 0;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void set_state(const State& s);

 private:
  LossScalerConfig cfg_;
  double scale_;
  std::int64_t growth_tracker_ = 0;
  std::int64_t hysteresis_tracker_;
};

// The largest finite FP16 value: gradients beyond it overflow in FP16.
inline constexpr float kFp16Max = 65504.0f;

}  // namespace trident::optim
