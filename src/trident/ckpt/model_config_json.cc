#include "trident/ckpt/model_config_json.h"

#include <cstdint>
#include <limits>
#include <string>

#include "trident/core/error.h"

namespace trident::ckpt {

namespace {

// A size or count: an integer in 0 .. 2^31-1 (converting a float such as 1e300 is undefined).
std::int64_t int_of(const nlohmann::json& v, const char* key) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
      v.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
    throw core::DataError(core::str("checkpoint config: \"", key, "\" = ", v.dump().substr(0, 40),
                                    " must be a non-negative integer below 2^31 (the checkpoint "
                                    "is corrupt)"));
  }
  return v.get<std::int64_t>();
}
std::int64_t int_or(const nlohmann::json& c, const char* key, std::int64_t fallback) {
  return c.contains(key) ? int_of(c[key], key) : fallback;
}

}  // namespace

void check_model_size(const model::ModelConfig& m, const std::string& where) {
  if (m.num_layers > 4096) {
    throw core::DataError(core::str(where, ": ", m.num_layers,
                                    " layers: more than trident reads from a file (4096); the "
                                    "file is corrupt"));
  }
  // In double: the int64 count itself could overflow for sizes near 2^31.
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn());
  const double v = static_cast<double>(m.padded_vocab_size());
  const double p = static_cast<double>(m.max_positions());
  const double params =
      2 * v * h + p * h + static_cast<double>(m.num_layers) * (4 * h * h + 3 * h * f);
  if (params > 0x1p40) {
    throw core::DataError(core::str(where, ": the model would have about ", params,
                                    " parameters, more than 2^40 (hidden ", m.hidden_size, ", ffn ",
                                    m.ffn(), ", vocab ", m.vocab_size, ", ", m.num_layers,
                                    " layers): the file is corrupt"));
  }
}

model::ModelConfig model_config_from_json(const nlohmann::json& c) {
  model::ModelConfig m;
  if (!c.is_object()) throw core::DataError("checkpoint config: not a JSON object");
  try {
    m.num_layers = int_of(c.at("num_layers"), "num_layers");
    m.hidden_size = int_of(c.at("hidden_size"), "hidden_size");
    m.num_attention_heads = int_of(c.at("num_attention_heads"), "num_attention_heads");
    m.ffn_hidden_size = int_of(c.at("ffn_hidden_size"), "ffn_hidden_size");
    m.seq_length = int_of(c.at("seq_length"), "seq_length");
    m.max_position_embeddings = int_of(c.at("max_position_embeddings"), "max_position_embeddings");
    m.vocab_size = int_of(c.at("vocab_size"), "vocab_size");
    m.make_vocab_size_divisible_by =
        int_of(c.at("make_vocab_size_divisible_by"), "make_vocab_size_divisible_by");
    m.layernorm_epsilon = c.value("layernorm_epsilon", 1e-5);
    m.init_method_std = c.value("init_method_std", 0.02);
    const std::string pos = c.value("position_embedding_type", std::string("learned_absolute"));
    if (pos == "alibi") m.position_embedding = model::PositionEmbedding::kAlibi;
    if (pos == "rope") m.position_embedding = model::PositionEmbedding::kRope;
    m.embed_layernorm = c.value("embed_layernorm", false);
    if (c.value("normalization", std::string("LayerNorm")) == "RMSNorm") {
      m.normalization = model::Normalization::kRmsNorm;
    }
    m.swiglu = c.value("swiglu", false);
    m.num_query_groups = int_or(c, "num_query_groups", 0);
    m.untie_embeddings_and_output_weights = c.value("untie_embeddings_and_output_weights", false);
    m.add_bias_linear = c.value("add_bias_linear", true);
    m.rotary_base = c.value("rotary_base", 10000.0);
    m.rope_scaling = c.value("use_rope_scaling", false);
    m.rope_scaling_factor = c.value("rope_scaling_factor", 8.0);
    m.rope_low_freq_factor = c.value("rope_low_freq_factor", 1.0);
    m.rope_high_freq_factor = c.value("rope_high_freq_factor", 4.0);
    m.rope_original_max_positions = int_or(c, "rope_original_max_position_embeddings", 8192);
  } catch (const nlohmann::json::exception& e) {
    throw core::DataError(core::str("checkpoint config: ", e.what()));
  }
  // Before a layer or a parameter is sized from it.
  if (m.make_vocab_size_divisible_by <= 0) {
    throw core::DataError("checkpoint config: make_vocab_size_divisible_by must be positive");
  }
  check_model_size(m, "checkpoint config");
  return m;
}

}  // namespace trident::ckpt
