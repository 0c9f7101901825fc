// The two model-architecture readers given hostile files (found by fuzz_model_config, inputs in
// tests/fuzz/regressions/fuzz_model_config/): Hugging Face config.json (the import) and a
// trident checkpoint's "config". Each refusal names the key; none converts a float to an integer
// (undefined behaviour), divides by zero, or sizes a model from an absurd dimension.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "trident/ckpt/hf_model.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/core/error.h"

namespace trident::ckpt {
namespace {

using nlohmann::json;

json gpt2() {
  return json::parse(R"({"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 2,
                         "n_head": 4, "n_positions": 64})");
}

json llama() {
  return json::parse(R"({"model_type": "llama", "vocab_size": 128, "hidden_size": 64,
                         "num_hidden_layers": 2, "num_attention_heads": 4,
                         "intermediate_size": 172, "max_position_embeddings": 128})");
}

// The message of the error hf_config_to_trident throws ("" when it accepts the config).
std::string hf_error(const json& c) {
  try {
    (void)hf_config_to_trident(c, 0);
  } catch (const core::InvalidArgument& e) {
    return e.what();
  } catch (const core::DataError& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, ValidConfigsAreAccepted) {
  EXPECT_EQ(hf_error(gpt2()), "");
  EXPECT_EQ(hf_error(llama()), "");
  EXPECT_EQ(hf_config_to_trident(llama(), 0).model.ffn_hidden_size, 172);
}

TEST(HfConfig, HostileValuesAreRefusedNamingTheKey) {
  auto with = [](json c, const char* key, json v) {
    c[key] = std::move(v);
    return c;
  };
  // A float id / size: converting 1e300 to int64 was undefined behaviour.
  EXPECT_NE(hf_error(with(gpt2(), "vocab_size", 1e300)).find("vocab_size = 1e+300 must be"),
            std::string::npos);
  EXPECT_NE(hf_error(with(gpt2(), "n_inner", 2.5)).find("n_inner"), std::string::npos);
  EXPECT_NE(hf_error(with(gpt2(), "n_layer", -2)).find("n_layer = -2"), std::string::npos);
  // model_type and torch_dtype of the wrong type escaped as bare JSON errors naming no file.
  EXPECT_NE(hf_error(with(gpt2(), "model_type", 7)).find("config.json: \"model_type\" = 7"),
            std::string::npos);
  EXPECT_NE(hf_error(with(gpt2(), "torch_dtype", json::array())).find("\"torch_dtype\" = []"),
            std::string::npos);
  EXPECT_NE(hf_error(with(gpt2(), "scale_attn_weights", "no")).find("\"scale_attn_weights\""),
            std::string::npos);
  EXPECT_NE(hf_error(json::array()).find("config.json: the file is not a JSON object"),
            std::string::npos);
  // head_dim with zero heads divided by zero before validate() could refuse the heads.
  json c = with(llama(), "num_attention_heads", 0);
  c["head_dim"] = 16;
  EXPECT_NE(hf_error(c).find("--num-attention-heads must be positive"), std::string::npos);
  // Sizes every one of which fits, whose model does not: refused before anything is sized.
  EXPECT_NE(hf_error(with(with(gpt2(), "n_embd", 1 << 30), "n_head", 1)).find("more than 2^40"),
            std::string::npos);
  EXPECT_NE(hf_error(with(gpt2(), "n_layer", 100000)).find("100000 layers"), std::string::npos);
}

// The HF keys come from the model config's key list: a required one missing is named, and every
// mapped setting survives an export and a re-import, for each architecture.
TEST(HfConfig, TheKeyListMapsEveryArchitecture) {
  json c = gpt2();
  c.erase("n_embd");
  EXPECT_NE(hf_error(c).find("config.json: n_embd is missing"), std::string::npos) << hf_error(c);
  c = llama();
  c.erase("intermediate_size");
  EXPECT_NE(hf_error(c).find("intermediate_size is missing"), std::string::npos);

  json l = llama();
  l["num_key_value_heads"] = 2;
  l["rms_norm_eps"] = 1e-5;
  l["rope_theta"] = 5e5;
  l["initializer_range"] = 0.01;
  json g = gpt2();
  g["n_inner"] = 96;
  g["layer_norm_epsilon"] = 3e-6;
  const json b = json::parse(R"({"model_type": "bloom", "vocab_size": 250, "n_embed": 64,
                                 "n_layer": 3, "n_head": 8, "layer_norm_epsilon": 2e-5})");
  for (const json& hf : {g, b, l}) {
    const HfImport in = hf_config_to_trident(hf, 32);
    const json out = trident_to_hf_config(in.model, in.arch, in.dtype);
    const HfImport again = hf_config_to_trident(out, 32);
    EXPECT_EQ(model_config_to_json(again.model), model_config_to_json(in.model)) << out.dump();
  }
  const model::ModelConfig m = hf_config_to_trident(l, 32).model;
  EXPECT_EQ(m.query_groups(), 2);
  EXPECT_EQ(m.layernorm_epsilon, 1e-5);
  EXPECT_EQ(m.rotary_base, 5e5);
  EXPECT_EQ(m.init_method_std, 0.01);
  EXPECT_EQ(hf_config_to_trident(g, 32).model.ffn(), 96);
  EXPECT_EQ(hf_config_to_trident(gpt2(), 32).model.ffn(), 4 * 32);  // n_inner absent
  EXPECT_EQ(hf_config_to_trident(b, 32).model.hidden_size, 64);     // BLOOM's older n_embed
  EXPECT_EQ(hf_config_to_trident(llama(), 32).model.layernorm_epsilon, 1e-6);  // HF's default
}

// The HF weight list covers every weight the layers declare, for each architecture; a model whose
// layers declare a weight transformers' architecture lacks is refused, naming it (it would have
// stayed zero on import).
TEST(HfTensors, CoverEveryDeclaredWeight) {
  const json b = json::parse(R"({"model_type": "bloom", "vocab_size": 250, "hidden_size": 64,
                                 "n_layer": 2, "n_head": 8})");
  json tied = llama();
  tied["tie_word_embeddings"] = true;
  for (const json& hf : {gpt2(), b, llama(), tied}) {
    const HfImport in = hf_config_to_trident(hf, 32);
    EXPECT_NO_THROW((void)hf_tensors(in.model, in.arch)) << hf.dump();
  }
  model::ModelConfig m = hf_config_to_trident(gpt2(), 32).model;
  m.embed_layernorm = true;  // BLOOM's, not GPT-2's
  try {
    (void)hf_tensors(m, HfArch::kGpt2);
    FAIL() << "a GPT-2 with an embedding LayerNorm was mapped";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("embedding.word_embeddings_layernorm.weight has no tensor"),
        std::string::npos)
        << e.what();
  }
}

json trident_config() {
  return json::parse(R"({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                         "ffn_hidden_size": 256, "seq_length": 32, "max_position_embeddings": 64,
                         "vocab_size": 100, "make_vocab_size_divisible_by": 128})");
}

std::string ckpt_error(const json& c) {
  try {
    (void)model_config_from_json(c);
  } catch (const core::DataError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointModelConfig, HostileValuesAreDataErrorsNamingTheKey) {
  EXPECT_EQ(ckpt_error(trident_config()), "");
  json c = trident_config();
  c["hidden_size"] = 1e300;
  EXPECT_NE(ckpt_error(c).find("\"hidden_size\" = 1e+300"), std::string::npos);
  c = trident_config();
  c["num_query_groups"] = 0.5;
  EXPECT_NE(ckpt_error(c).find("\"num_query_groups\""), std::string::npos);
  c = trident_config();
  c["make_vocab_size_divisible_by"] = 0;  // padded_vocab_size() divides by it
  EXPECT_NE(ckpt_error(c).find("make_vocab_size_divisible_by must be positive"), std::string::npos);
  c = trident_config();
  c["num_layers"] = 5000;
  EXPECT_NE(ckpt_error(c).find("5000 layers"), std::string::npos);
  EXPECT_NE(ckpt_error(json("x")).find("not a JSON object"), std::string::npos);
}

// One key list writes and reads the config: every setting survives the round trip, and keys
// added after a checkpoint was written take the defaults of the model it was trained as.
TEST(CheckpointModelConfig, RoundTripsEveryKeyAndOldConfigsTakeTheDefaults) {
  model::ModelConfig m = model_config_from_json(trident_config());
  EXPECT_EQ(m.normalization, model::Normalization::kLayerNorm);
  EXPECT_EQ(m.position_embedding, model::PositionEmbedding::kLearnedAbsolute);
  EXPECT_EQ(m.query_groups(), 4);
  EXPECT_TRUE(m.add_bias_linear);
  EXPECT_DOUBLE_EQ(m.rotary_base, 10000.0);
  m.normalization = model::Normalization::kRmsNorm;
  m.position_embedding = model::PositionEmbedding::kRope;
  m.num_query_groups = 2;
  m.swiglu = true;
  m.add_bias_linear = false;
  m.rotary_base = 500000.0;
  m.rope_scaling = true;
  m.rope_scaling_factor = 32.0;
  const json j = model_config_to_json(m);
  EXPECT_EQ(j["normalization"], "RMSNorm");
  EXPECT_EQ(j["position_embedding_type"], "rope");
  EXPECT_EQ(model_config_to_json(model_config_from_json(j)), j);
  EXPECT_EQ(architecture_diff(j, j), "");
}

TEST(CheckpointModelConfig, MissingKeysAndDifferencesAreNamed) {
  json c = trident_config();
  c.erase("hidden_size");
  EXPECT_NE(ckpt_error(c).find("\"hidden_size\" is missing"), std::string::npos);
  c = trident_config();
  c["normalization"] = "BatchNorm";
  EXPECT_NE(ckpt_error(c).find("LayerNorm or RMSNorm"), std::string::npos);
  json run = trident_config();
  run["num_layers"] = 3;
  run["normalization"] = "RMSNorm";
  run["init_method_std"] = 0.01;  // not part of the architecture: a resumed run may change it
  EXPECT_EQ(architecture_diff(trident_config(), run),
            " num_layers: checkpoint 2 vs run 3; normalization: checkpoint \"LayerNorm\" vs run "
            "\"RMSNorm\";");
  // Absent num_query_groups is one group per head, so it equals an explicit 4.
  run = trident_config();
  run["num_query_groups"] = 4;
  EXPECT_EQ(architecture_diff(trident_config(), run), "");
  run["num_query_groups"] = 2;
  EXPECT_EQ(architecture_diff(trident_config(), run), " num_query_groups: checkpoint 4 vs run 2;");
  // A real value written as a float's (older checkpoints) matches the double that rounds to it.
  run = trident_config();
  run["rotary_base"] = static_cast<double>(static_cast<float>(10000.1));
  json saved = trident_config();
  saved["rotary_base"] = 10000.1;
  EXPECT_EQ(architecture_diff(saved, run), "");
}

}  // namespace
}  // namespace trident::ckpt
