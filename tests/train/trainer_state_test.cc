// The trainer's saved state (train/trainer_state.h): one type, its keys written and read in one
// place; older checkpoints' missing keys take the defaults and malformed values name their key.
#include "trident/train/trainer_state.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "trident/core/error.h"

namespace trident::train {
namespace {

using nlohmann::json;

std::string error_of(const json& j) {
  try {
    (void)TrainerState::from_json(j);
  } catch (const core::DataError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainerState, RoundTripsEveryField) {
  TrainerState s{
      .scaler =
          optim::LossScaler::State{.scale = 4096, .growth_tracker = 7, .hysteresis_tracker = 2},
      .skipped_iterations = 3,
      .nan_iterations = 1,
      .lr = optim::MegatronLrScheduler::State{
          .num_steps = 640, .num_tokens = 81920, .warmup_tokens = 2048}};
  const json j = s.to_json();
  EXPECT_EQ(j["loss_scale"], 4096.0);
  EXPECT_EQ(j["lr_warmup_tokens"], 2048.0);
  const TrainerState r = TrainerState::from_json(j);
  ASSERT_TRUE(r.scaler && r.lr && r.lr->warmup_tokens);
  EXPECT_EQ(r.scaler->scale, 4096);
  EXPECT_EQ(r.scaler->growth_tracker, 7);
  EXPECT_EQ(r.scaler->hysteresis_tracker, 2);
  EXPECT_EQ(r.skipped_iterations, 3);
  EXPECT_EQ(r.nan_iterations, 1);
  EXPECT_EQ(r.lr->num_steps, 640);
  EXPECT_EQ(r.lr->num_tokens, 81920);
  EXPECT_EQ(*r.lr->warmup_tokens, 2048);
  EXPECT_EQ(r.to_json(), j);
}

TEST(TrainerState, OlderCheckpointsTakeTheDefaults) {
  const TrainerState r = TrainerState::from_json(json::object());  // --finetune, or very old
  EXPECT_FALSE(r.scaler);
  EXPECT_FALSE(r.lr);
  EXPECT_EQ(r.skipped_iterations, 0);
  const TrainerState no_warmup = TrainerState::from_json({{"lr_num_steps", 8.0}});
  ASSERT_TRUE(no_warmup.lr);
  EXPECT_EQ(no_warmup.lr->num_steps, 8);
  EXPECT_EQ(no_warmup.lr->num_tokens, 0);
  EXPECT_FALSE(no_warmup.lr->warmup_tokens);
}

TEST(TrainerState, MalformedValuesNameTheirKey) {
  EXPECT_EQ(error_of({{"skipped_iterations", 2}}), "");
  EXPECT_NE(error_of({{"skipped_iterations", -1}}).find("\"skipped_iterations\" = -1"),
            std::string::npos);
  EXPECT_NE(error_of({{"nan_iterations", "x"}}).find("\"nan_iterations\""), std::string::npos);
  EXPECT_NE(error_of({{"loss_scale", 0.0}, {"growth_tracker", 0}, {"hysteresis_tracker", 0}})
                .find("\"loss_scale\" = 0.0 must be a positive number"),
            std::string::npos);
  EXPECT_NE(error_of({{"loss_scale", 1.0}}).find("without \"growth_tracker\""), std::string::npos);
  EXPECT_NE(error_of({{"lr_num_steps", 1.0}, {"lr_num_tokens", -5.0}}).find("\"lr_num_tokens\""),
            std::string::npos);
  EXPECT_NE(error_of(json::array()).find("a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace trident::train
