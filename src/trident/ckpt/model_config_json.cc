#include "trident/ckpt/model_config_json.h"

#include <string>

#include "trident/core/error.h"

namespace trident::ckpt {

model::ModelConfig model_config_from_json(const nlohmann::json& c) {
  model::ModelConfig m;
  try {
    m.num_layers = c.at("num_layers");
    m.hidden_size = c.at("hidden_size");
    m.num_attention_heads = c.at("num_attention_heads");
    m.ffn_hidden_size = c.at("ffn_hidden_size");
    m.seq_length = c.at("seq_length");
    m.max_position_embeddings = c.at("max_position_embeddings");
    m.vocab_size = c.at("vocab_size");
    m.make_vocab_size_divisible_by = c.at("make_vocab_size_divisible_by");
    m.layernorm_epsilon = c.value("layernorm_epsilon", 1e-5f);
    m.init_method_std = c.value("init_method_std", 0.02f);
    const std::string pos = c.value("position_embedding_type", std::string("learned_absolute"));
    if (pos == "alibi") m.position_embedding = model::PositionEmbedding::kAlibi;
    if (pos == "rope") m.position_embedding = model::PositionEmbedding::kRope;
    m.embed_layernorm = c.value("embed_layernorm", false);
    if (c.value("normalization", std::string("LayerNorm")) == "RMSNorm") {
      m.normalization = model::Normalization::kRmsNorm;
    }
    m.swiglu = c.value("swiglu", false);
    m.num_query_groups = c.value("num_query_groups", std::int64_t{0});
    m.untie_embeddings_and_output_weights = c.value("untie_embeddings_and_output_weights", false);
    m.add_bias_linear = c.value("add_bias_linear", true);
    m.rotary_base = c.value("rotary_base", 10000.0f);
    m.rope_scaling = c.value("use_rope_scaling", false);
    m.rope_scaling_factor = c.value("rope_scaling_factor", 8.0f);
    m.rope_low_freq_factor = c.value("rope_low_freq_factor", 1.0f);
    m.rope_high_freq_factor = c.value("rope_high_freq_factor", 4.0f);
    m.rope_original_max_positions =
        c.value("rope_original_max_position_embeddings", std::int64_t{8192});
  } catch (const nlohmann::json::exception& e) {
    throw core::DataError(core::str("checkpoint config: ", e.what()));
  }
  return m;
}

}  // namespace trident::ckpt
