#include "trident/train/trainer_state.h"

#include <cmath>
#include <string>

#include "trident/ckpt/json_checks.h"
#include "trident/core/error.h"

namespace trident::train {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const char* key, const json& v, const char* want) {
  ckpt::bad_checkpoint_value("trainer_state", key, v, want);
}

// The keys, each written and read here only.
constexpr const char* kLossScale = "loss_scale";
constexpr const char* kGrowth = "growth_tracker";
constexpr const char* kHysteresis = "hysteresis_tracker";
constexpr const char* kSkipped = "skipped_iterations";
constexpr const char* kNan = "nan_iterations";
constexpr const char* kLrSteps = "lr_num_steps";
constexpr const char* kLrTokens = "lr_num_tokens";
constexpr const char* kLrWarmupTokens = "lr_warmup_tokens";

std::int64_t count(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0) bad(key, v, "a non-negative integer");
  return v.get<std::int64_t>();
}

double finite(const json& j, const char* key, bool positive) {
  const json& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 ||
      (positive && v.get<double>() == 0)) {
    bad(key, v, positive ? "a positive number" : "a non-negative number");
  }
  return v.get<double>();
}

}  // namespace

json TrainerState::to_json() const {
  json j = json::object();
  if (scaler) {
    j[kLossScale] = scaler->scale;
    j[kGrowth] = scaler->growth_tracker;
    j[kHysteresis] = scaler->hysteresis_tracker;
  }
  j[kSkipped] = skipped_iterations;
  j[kNan] = nan_iterations;
  if (lr) {
    j[kLrSteps] = lr->num_steps;
    j[kLrTokens] = lr->num_tokens;
    if (lr->warmup_tokens) j[kLrWarmupTokens] = *lr->warmup_tokens;
  }
  return j;
}

TrainerState TrainerState::from_json(const json& j) {
  if (!j.is_object()) bad("trainer_state", j, "a JSON object");
  TrainerState s;
  if (j.contains(kLossScale)) {
    if (!j.contains(kGrowth) || !j.contains(kHysteresis)) {
      throw core::DataError(core::str("checkpoint trainer_state: \"", kLossScale, "\" without \"",
                                      kGrowth, "\" and \"", kHysteresis,
                                      "\" (the checkpoint is corrupt)"));
    }
    s.scaler = optim::LossScaler::State{.scale = finite(j, kLossScale, /*positive=*/true),
                                        .growth_tracker = count(j, kGrowth),
                                        .hysteresis_tracker = count(j, kHysteresis)};
  }
  if (j.contains(kSkipped)) s.skipped_iterations = count(j, kSkipped);
  if (j.contains(kNan)) s.nan_iterations = count(j, kNan);
  if (j.contains(kLrSteps)) {
    optim::MegatronLrScheduler::State lr;
    lr.num_steps = finite(j, kLrSteps, /*positive=*/false);
    if (j.contains(kLrTokens)) lr.num_tokens = finite(j, kLrTokens, /*positive=*/false);
    if (j.contains(kLrWarmupTokens)) lr.warmup_tokens = finite(j, kLrWarmupTokens, false);
    s.lr = lr;
  }
  return s;
}

}  // namespace trident::train
