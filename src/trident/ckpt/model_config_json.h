// The model architecture in a checkpoint's manifest ("config"): one list of keys
// (model_config_json.cc, kKeys) gives the JSON a checkpoint stores (TrainConfig::to_json writes
// it beside the trainer's settings), its reading (`trident generate`, `trident convert`, the
// Hugging Face export, resume), the defaults of keys added after a checkpoint was written, and
// the comparison of a checkpoint's model with a resuming run's, with a per-key diff. A new
// architecture setting is one line there.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "trident/model/config.h"

namespace trident::ckpt {

// The Hugging Face architectures trident converts (hf_model.h).
enum class HfArch : std::uint8_t { kGpt2, kBloom, kLlama, kMixtral, kQwen2Moe, kQwen2 };

// The architecture's keys of `m` (sizes resolved: ffn_hidden_size, max_position_embeddings and
// num_query_groups as the model uses them).
nlohmann::json model_config_to_json(const model::ModelConfig& m);

// Throws core::DataError naming the key when a required key is missing or a key has the wrong
// type (sizes must be integers in 0 .. 2^31-1), or when the model is larger than
// check_model_size allows. Keys added after a checkpoint was written take their GPT-2 defaults.
model::ModelConfig model_config_from_json(const nlohmann::json& config);

// The keys that define the model's function and parameters, where a checkpoint's config `a` and
// a run's `b` differ: " key: checkpoint X vs run Y;" each ("" when they agree). Real values
// written as single-precision floats by older checkpoints match the double that rounds to them;
// the mixture-of-experts keys count only when either model has experts.
// Throws core::DataError as model_config_from_json for a malformed config.
std::string architecture_diff(const nlohmann::json& a, const nlohmann::json& b);

// Hugging Face config.json: the keys the same list maps for `arch` (the sizes, the norm's epsilon,
// the init std, the key/value heads, the rotary base; transformers' default where it has one).
// hf_keys_to_model throws InvalidArgument naming config.json and the key for a missing required
// key or a malformed value; what an architecture fixes (ALiBi, SwiGLU, ...) and refuses is
// hf_model.cc's.
void hf_keys_to_model(const nlohmann::json& config, HfArch arch, model::ModelConfig& m);
void model_to_hf_keys(const model::ModelConfig& m, HfArch arch, nlohmann::json& config);

// Bounds on a model read from a file, checked before anything is sized from it: at most 4096
// layers and 2^40 parameters (a corrupt or hostile config would otherwise allocate without
// limit). Throws core::DataError starting with `where`.
void check_model_size(const model::ModelConfig& m, const std::string& where);

}  // namespace trident::ckpt
