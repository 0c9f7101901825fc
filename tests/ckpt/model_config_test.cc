// The two model-architecture readers given hostile files (found by fuzz_model_config, inputs in
// tests/fuzz/regressions/fuzz_model_config/): Hugging Face config.json (the import) and a
// trident checkpoint's "config". Each refusal names the key; none converts a float to an integer
// (undefined behaviour), divides by zero, or sizes a model from an absurd dimension.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/hf_model.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/comm/self_communicator.h"
#include "trident/core/error.h"
#include "trident/model/param_table.h"

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
  EXPECT_FALSE(m.add_qkv_bias);  // older checkpoints: the QKV bias follows add_bias_linear
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
  // --add-qkv-bias (Qwen2): kept, and a run without it differs from the checkpoint.
  m.add_qkv_bias = true;
  const json q = model_config_to_json(m);
  EXPECT_EQ(q["add_qkv_bias"], true);
  EXPECT_TRUE(model_config_from_json(q).add_qkv_bias);
  EXPECT_EQ(model_config_to_json(model_config_from_json(q)), q);
  EXPECT_EQ(architecture_diff(q, j), " add_qkv_bias: checkpoint true vs run false;");
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

// The mixture-of-experts settings: Megatron-Core's names and values, every one round-tripping;
// a checkpoint written before them is a dense model with Megatron-Core's router defaults.
TEST(CheckpointModelConfig, MixtureOfExpertsKeysRoundTrip) {
  model::ModelConfig m = model_config_from_json(trident_config());
  EXPECT_EQ(m.num_experts, 0);
  EXPECT_EQ(m.moe_ffn_hidden_size, 0);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_layer_freq, 1);
  EXPECT_EQ(m.moe_router_score_function, model::MoeScoreFunction::kSoftmax);
  EXPECT_FALSE(m.moe_router_pre_softmax);
  EXPECT_EQ(m.moe_router_topk_scaling_factor, 0.0);
  EXPECT_EQ(m.moe_expert_capacity_factor, 0.0);
  EXPECT_EQ(m.moe_token_drop_policy, model::MoeDropPolicy::kProbs);
  EXPECT_FALSE(m.moe_pad_expert_input_to_capacity);
  EXPECT_EQ(m.moe_router_load_balancing_type, model::MoeLoadBalancing::kAuxLoss);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.0);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.0);

  m.swiglu = true;
  m.add_bias_linear = false;
  m.num_experts = 8;
  m.moe_router_topk = 1;
  m.moe_layer_freq = 2;
  m.moe_router_pre_softmax = true;
  m.moe_router_topk_scaling_factor = 2.5;
  m.moe_expert_capacity_factor = 1.25;
  m.moe_token_drop_policy = model::MoeDropPolicy::kPosition;
  m.moe_pad_expert_input_to_capacity = true;
  m.moe_router_load_balancing_type = model::MoeLoadBalancing::kSeqAuxLoss;
  m.moe_aux_loss_coeff = 0.01;
  m.moe_z_loss_coeff = 0.001;
  json j = model_config_to_json(m);
  EXPECT_EQ(j["num_experts"], 8);
  EXPECT_EQ(j["moe_ffn_hidden_size"], 256);  // resolved: --ffn-hidden-size
  EXPECT_EQ(j["moe_router_topk"], 1);
  EXPECT_EQ(j["moe_layer_freq"], 2);
  EXPECT_EQ(j["moe_router_score_function"], "softmax");
  EXPECT_EQ(j["moe_router_pre_softmax"], true);
  EXPECT_EQ(j["moe_router_topk_scaling_factor"], 2.5);
  EXPECT_EQ(j["moe_expert_capacity_factor"], 1.25);
  EXPECT_EQ(j["moe_token_drop_policy"], "position");
  EXPECT_EQ(j["moe_pad_expert_input_to_capacity"], true);
  EXPECT_EQ(j["moe_router_load_balancing_type"], "seq_aux_loss");
  EXPECT_EQ(j["moe_aux_loss_coeff"], 0.01);
  EXPECT_EQ(j["moe_z_loss_coeff"], 0.001);
  const model::ModelConfig back = model_config_from_json(j);
  EXPECT_EQ(model_config_to_json(back), j);
  EXPECT_EQ(back.moe_ffn(), 256);
  EXPECT_EQ(back.moe_router_topk_scaling_factor, 2.5);
  EXPECT_EQ(back.moe_token_drop_policy, model::MoeDropPolicy::kPosition);
  EXPECT_EQ(back.moe_router_load_balancing_type, model::MoeLoadBalancing::kSeqAuxLoss);
  EXPECT_EQ(back.moe_z_loss_coeff, 0.001);
  EXPECT_EQ(architecture_diff(j, j), "");

  // Every value of the three enums, and values trident does not have.
  for (const char* v : {"softmax", "sigmoid"}) {
    j["moe_router_score_function"] = v;
    EXPECT_EQ(model_config_to_json(model_config_from_json(j))["moe_router_score_function"], v);
  }
  for (const char* v : {"probs", "position"}) {
    j["moe_token_drop_policy"] = v;
    EXPECT_EQ(model_config_to_json(model_config_from_json(j))["moe_token_drop_policy"], v);
  }
  for (const char* v : {"aux_loss", "seq_aux_loss", "none"}) {
    j["moe_router_load_balancing_type"] = v;
    EXPECT_EQ(model_config_to_json(model_config_from_json(j))["moe_router_load_balancing_type"], v);
  }
  json c = j;
  c["moe_router_score_function"] = "sqrtsoftplus";
  EXPECT_NE(ckpt_error(c).find("\"moe_router_score_function\" = \"sqrtsoftplus\" must be softmax "
                               "or sigmoid"),
            std::string::npos)
      << ckpt_error(c);
  c = j;
  c["moe_token_drop_policy"] = 1;
  EXPECT_NE(ckpt_error(c).find("\"moe_token_drop_policy\""), std::string::npos);
  c = j;
  c["moe_router_load_balancing_type"] = "sinkhorn";
  EXPECT_NE(ckpt_error(c).find("aux_loss, seq_aux_loss or none"), std::string::npos);
  // Hostile sizes: a layer frequency of 0 (ModelConfig::moe_layer divides by it), experts that
  // would make the model absurd.
  c = j;
  c["moe_layer_freq"] = 0;
  EXPECT_NE(ckpt_error(c).find("moe_layer_freq must be positive"), std::string::npos);
  c = j;
  c["num_experts"] = 2000000000;
  EXPECT_NE(ckpt_error(c).find("more than 2^40"), std::string::npos) << ckpt_error(c);
  c = j;
  c["num_experts"] = -1;
  EXPECT_NE(ckpt_error(c).find("\"num_experts\" = -1"), std::string::npos);
}

// A resume must keep the experts: each differing setting is named. The router's settings are
// part of a model with experts only: two dense models agree whatever they say.
TEST(CheckpointModelConfig, MixtureOfExpertsDifferencesAreNamed) {
  json dense = trident_config();
  json moe = dense;
  moe["num_experts"] = 8;
  EXPECT_EQ(architecture_diff(dense, moe), " num_experts: checkpoint 0 vs run 8;");
  json other = moe;
  other["num_experts"] = 16;
  other["moe_router_topk"] = 1;
  other["moe_aux_loss_coeff"] = 0.01;
  other["moe_router_load_balancing_type"] = "none";
  EXPECT_EQ(architecture_diff(moe, other),
            " num_experts: checkpoint 8 vs run 16; moe_router_topk: checkpoint 2 vs run 1; "
            "moe_router_load_balancing_type: checkpoint \"aux_loss\" vs run \"none\"; "
            "moe_aux_loss_coeff: checkpoint 0.0 vs run 0.01;");
  // The experts' hidden size: not given is --ffn-hidden-size.
  other = moe;
  other["moe_ffn_hidden_size"] = 256;
  EXPECT_EQ(architecture_diff(moe, other), "");
  other["moe_ffn_hidden_size"] = 128;
  EXPECT_EQ(architecture_diff(moe, other), " moe_ffn_hidden_size: checkpoint 256 vs run 128;");
  // Dense: the router's settings do not count.
  json dense2 = dense;
  dense2["moe_router_topk"] = 4;
  dense2["moe_ffn_hidden_size"] = 64;
  EXPECT_EQ(architecture_diff(dense, dense2), "");
}

// --moe-layer-freq's pattern: saved as Megatron's list under moe_layer_freq and read back; a
// checkpoint with the integer (every checkpoint before patterns) still loads; a list of the wrong
// length or with other entries is refused; a resume compares the layers, not the spelling.
TEST(CheckpointModelConfig, MoeLayerPatternRoundTrips) {
  json j = trident_config();
  j["num_layers"] = 4;
  j["swiglu"] = true;
  j["add_bias_linear"] = false;
  j["num_experts"] = 4;
  model::ModelConfig m = model_config_from_json(j);
  m.moe_layer_pattern = {false, true, true, false};
  const json saved = model_config_to_json(m);
  EXPECT_EQ(saved["moe_layer_freq"], json({0, 1, 1, 0}));
  const model::ModelConfig back = model_config_from_json(saved);
  EXPECT_EQ(back.moe_layer_pattern, m.moe_layer_pattern);
  EXPECT_FALSE(back.moe_layer(0));
  EXPECT_TRUE(back.moe_layer(1));
  EXPECT_TRUE(back.moe_layer(2));
  EXPECT_FALSE(back.moe_layer(3));
  EXPECT_EQ(model_config_to_json(back), saved);
  // The integer form (older checkpoints): no pattern.
  json old = saved;
  old["moe_layer_freq"] = 2;
  const model::ModelConfig o = model_config_from_json(old);
  EXPECT_TRUE(o.moe_layer_pattern.empty());
  EXPECT_EQ(o.moe_layer_freq, 2);
  old.erase("moe_layer_freq");  // before mixtures of experts: every layer (dense anyway)
  EXPECT_EQ(model_config_from_json(old).moe_layer_freq, 1);
  // Bad lists.
  json c = saved;
  c["moe_layer_freq"] = json({1, 0});
  EXPECT_NE(ckpt_error(c).find("moe_layer_freq has 2 entries for 4 layers"), std::string::npos)
      << ckpt_error(c);
  c["moe_layer_freq"] = json({1, 2, 0, 1});
  EXPECT_NE(ckpt_error(c).find("\"moe_layer_freq\" = [1,2,0,1]"), std::string::npos)
      << ckpt_error(c);
  c["moe_layer_freq"] = json({1, "1", 0, 1});
  EXPECT_NE(ckpt_error(c).find("\"moe_layer_freq\""), std::string::npos) << ckpt_error(c);
  // A resume: the same layers agree in either spelling, other layers are named.
  json freq2 = saved;
  freq2["moe_layer_freq"] = 2;
  json pattern2 = saved;
  pattern2["moe_layer_freq"] = json({1, 0, 1, 0});
  EXPECT_EQ(architecture_diff(freq2, pattern2), "");
  EXPECT_EQ(architecture_diff(saved, pattern2),
            " moe_layer_freq: checkpoint \"[0,1,1,0]\" vs run \"[1,0,1,0]\";");
  // A dense model: whatever the pattern says.
  json dense = saved, dense2 = pattern2;
  dense["num_experts"] = dense2["num_experts"] = 0;
  EXPECT_EQ(architecture_diff(dense, dense2), "");
}

// The parameter count and the declared weights follow the pattern: the router and the experts in
// the layers it marks, the dense MLP in the others.
TEST(CheckpointModelConfig, MoeLayerPatternDeclaresTheLayers) {
  model::ModelConfig m = model_config_from_json(trident_config());
  m.num_layers = 3;
  m.swiglu = true;
  m.add_bias_linear = false;
  m.num_experts = 4;
  m.moe_ffn_hidden_size = 32;
  m.moe_layer_pattern = {false, true, false};
  const model::ParamTable table = model::build_gpt_param_table(m);
  std::vector<std::string> routers, dense;
  for (const model::ParamSpec& p : table.params) {
    if (p.name.ends_with("mlp.router.weight")) routers.push_back(p.name);
    if (p.name.ends_with("mlp.dense_h_to_4h.weight")) dense.push_back(p.name);
  }
  EXPECT_EQ(routers, (std::vector<std::string>{"layers.1.mlp.router.weight"}));
  EXPECT_EQ(dense, (std::vector<std::string>{"layers.0.mlp.dense_h_to_4h.weight",
                                             "layers.2.mlp.dense_h_to_4h.weight"}));
  EXPECT_EQ(table.total_numel, m.num_parameters());
  // Another pattern, another count.
  model::ModelConfig two = m;
  two.moe_layer_pattern = {true, true, false};
  EXPECT_EQ(model::build_gpt_param_table(two).total_numel, two.num_parameters());
  EXPECT_NE(two.num_parameters(), m.num_parameters());
}

// A resume from a dense checkpoint with --num-experts is refused by the load, naming the key.
TEST(CheckpointModelConfig, ResumeWithOtherExpertsIsRefused) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "trident_model_config_test_moe_resume";
  std::filesystem::remove_all(dir);
  model::ModelConfig mc;
  mc.num_layers = 1;
  mc.hidden_size = 8;
  mc.num_attention_heads = 2;
  mc.seq_length = 4;
  mc.vocab_size = 10;
  mc.make_vocab_size_divisible_by = 4;
  mc.swiglu = true;
  mc.add_bias_linear = false;
  const model::ParamTable table = model::build_gpt_param_table(mc);
  const std::int64_t n = table.total_numel;
  std::vector<float> buf(static_cast<std::size_t>(n), 0.5f);
  CheckpointState st;
  st.iteration = 2;
  st.config = model_config_to_json(mc);
  st.layout = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
  st.coords = {{"tp", 0}, {"pp", 0}, {"dp", 0}};
  st.tables.push_back({&table, 0});
  st.numel = n;
  st.params = {buf.data(), 0, n};
  comm::SelfCommunicator world;
  save_checkpoint(dir.string(), st, world);

  model::ModelConfig run = mc;
  run.num_experts = 4;
  st.config = model_config_to_json(run);
  try {
    (void)load_checkpoint(dir.string(), -1, st, world);
    ADD_FAILURE() << "a dense checkpoint loaded into a run with --num-experts 4";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "the checkpoint's model differs from this run's: num_experts: checkpoint 0 vs "
                  "run 4;"),
              std::string::npos)
        << e.what();
  }
  // The same experts load.
  st.config = model_config_to_json(mc);
  EXPECT_NO_THROW((void)load_checkpoint(dir.string(), -1, st, world));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trident::ckpt
