// The model architecture of a checkpoint, from its manifest's "config" (TrainConfig::to_json):
// the one reader `trident generate`, `trident convert` and the Hugging Face export share. Keys
// added after a checkpoint was written take their GPT-2 defaults.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "trident/model/config.h"

namespace trident::ckpt {

// Throws core::DataError naming the key when a required key is missing or has the wrong type
// (sizes must be integers in 0 .. 2^31-1), or when the model is larger than check_model_size
// allows.
model::ModelConfig model_config_from_json(const nlohmann::json& config);

// Bounds on a model read from a file, checked before anything is sized from it: at most 4096
// layers and 2^40 parameters (a corrupt or hostile config would otherwise allocate without
// limit). Throws core::DataError starting with `where`.
void check_model_size(const model::ModelConfig& m, const std::string& where);

}  // namespace trident::ckpt
