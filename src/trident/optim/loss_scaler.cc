#include "trident/optim/loss_scaler.h"

#include <algorithm>

#include "trident/core/error.h"

namespace trident::optim {

LossScaler::LossScaler(const LossScalerConfig& cfg)
    : cfg_(cfg),
      scale_(cfg.dynamic ? cfg.initial_scale : cfg.static_scale),
      hysteresis_tracker_(cfg.hysteresis) {
  TRIDENT_CHECK(scale_ > 0, "the loss scale must be positive, got ", scale_);
  TRIDENT_CHECK(!cfg.dynamic || (cfg.min_scale > 0 && cfg.window > 0 && cfg.hysteresis > 0),
                "dynamic loss scaling needs --min-loss-scale > 0, --loss-scale-window > 0 and "
                "--hysteresis > 0");
}

void LossScaler::update(bool found_overflow) {
  if (!cfg_.dynamic) return;
  if (found_overflow) {
    growth_tracker_ = 0;
    --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5, cfg_.min_scale);
    return;
  }
  ++growth_tracker_;
  if (growth_tracker_ == cfg_.window) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = cfg_.hysteresis;
    scale_ *= 2.0;
  }
}

void LossScaler::set_state(const State& s) {
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
}

}  // namespace trident::optim
