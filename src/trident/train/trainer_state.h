// The trainer's state a checkpoint carries besides the model, the optimizer and the sample
// counters (the manifest's "trainer_state"): the loss scaler, the skip counters and the
// learning-rate schedule's position. One type with its keys: the trainer fills it to save and
// reads it back on resume, and a malformed value is a DataError naming its key.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

#include "trident/optim/loss_scaler.h"
#include "trident/optim/lr_schedule.h"

namespace trident::train {

struct TrainerState {
  // Absent in a --finetune start (a fresh scaler).
  std::optional<optim::LossScaler::State> scaler;
  std::int64_t skipped_iterations = 0;  // steps the loss scaler or a non-finite norm skipped
  std::int64_t nan_iterations = 0;      // iterations whose loss or norm was not finite
  // Absent in checkpoints written before the schedule was saved: resume counts every consumed
  // sample as a step (lr_steps_or).
  std::optional<optim::MegatronLrScheduler::State> lr;

  nlohmann::json to_json() const;
  // Keys missing from older checkpoints take the defaults above; a value of the wrong type or
  // out of range throws core::DataError naming the key.
  static TrainerState from_json(const nlohmann::json& j);
};

}  // namespace trident::train
