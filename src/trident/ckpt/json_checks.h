// The error for a malformed value in a checkpoint's JSON (manifest config, trainer state): names
// the section, the key, the start of the value and what it must be. Shared by the readers of
// ckpt/model_config_json.cc and train/trainer_state.cc.
#pragma once

#include <nlohmann/json.hpp>

#include "trident/core/error.h"

namespace trident::ckpt {

[[noreturn]] inline void bad_checkpoint_value(const char* section, const char* key,
                                              const nlohmann::json& v, const char* want) {
  throw core::DataError(core::str("checkpoint ", section, ": \"", key,
                                  "\" = ", v.dump().substr(0, 40), " must be ", want,
                                  " (the checkpoint is corrupt)"));
}

}  // namespace trident::ckpt
