// The model architecture of a checkpoint, from its manifest's "config" (TrainConfig::to_json):
// the one reader `trident generate`, `trident convert` and the Hugging Face export share. Keys
// added after a checkpoint was written take their GPT-2 defaults.
#pragma once

#include <nlohmann/json.hpp>

#include "trident/model/config.h"

namespace trident::ckpt {

// Throws core::DataError naming the key when a required key is missing or has the wrong type.
model::ModelConfig model_config_from_json(const nlohmann::json& config);

}  // namespace trident::ckpt
