// Qwen2-MoE (transformers' Qwen2MoeForCausalLM) through `trident convert` (docs/moe.md, "Hugging
// Face"); the bitwise round trip is hf_roundtrip_qwen2_moe (tests/ckpt).
//
// HfQwen2Moe.*: config.json <-> trident's settings (biases on q, k, v alone: --add-qkv-bias; the
// gated shared expert; norm_topk_prob false: --moe-router-pre-softmax, true: the default router),
// the tensors (each element of each stacked weight covered once), and what is refused, by name,
// on import (sliding windows, rope_scaling, a decoder_sparse_step or mlp_only_layers that leave no
// sparse layer, ...) and on export (a model with experts neither Mixtral nor Qwen2-MoE can
// express); decoder_sparse_step and mlp_only_layers both ways as the --moe-layer-freq pattern.
//
// HfQwen2MoeGolden.ImportedModelMatchesTransformers (needs transformers, $TRIDENT_HF_PYTHON): a
// tiny random Qwen2-MoE saved by transformers (tests/reference/hf_qwen2_moe_golden.py: 2 layers,
// hidden 32, 4 heads in 2 key/value groups, 4 experts of 16, top 2, a shared expert of 24) is
// imported with `trident convert --from-hf`; trident (FP32) then computes the logits, the loss,
// every gradient (compared per transformers tensor, through the import's own map) and each
// layer's router logits and chosen experts, against transformers in float64, for norm_topk_prob
// false and true. Tolerance: max |trident - transformers| / max |transformers| <= 1e-5 per tensor
// (hf_golden_test's). Mutations: the model without its QKV bias, without the shared expert's
// gate, or with the other top-k normalisation is off by more than 100 x the tolerance. Also with
// dense layers among the sparse ones (decoder_sparse_step 2; mlp_only_layers [0, 3]): their MLP
// (mlp.gate_proj / up_proj / down_proj of intermediate_size) zeroed is off as far.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "support/tensor_file.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/hf_model.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using ckpt::HfArch;
using nlohmann::json;

// What save_pretrained writes for a small Qwen2MoeConfig (transformers 4.46).
json qwen2_moe_config() {
  return {{"model_type", "qwen2_moe"},
          {"architectures", {"Qwen2MoeForCausalLM"}},
          {"vocab_size", 301},
          {"hidden_size", 32},
          {"intermediate_size", 40},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 5000.0},
          {"rope_scaling", nullptr},
          {"initializer_range", 0.02},
          {"num_experts", 4},
          {"num_experts_per_tok", 2},
          {"moe_intermediate_size", 16},
          {"shared_expert_intermediate_size", 24},
          {"norm_topk_prob", false},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()},
          {"router_aux_loss_coef", 0.001},
          {"output_router_logits", false},
          {"use_sliding_window", false},
          {"sliding_window", nullptr},
          {"max_window_layers", 28},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"},
          {"attention_dropout", 0.0},
          {"use_cache", true},
          {"torch_dtype", "bfloat16"}};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(HfQwen2Moe, ConfigMapsToTheSettings) {
  const ckpt::HfImport imp = ckpt::hf_config_to_trident(qwen2_moe_config(), 0);
  const model::ModelConfig& m = imp.model;
  EXPECT_EQ(imp.arch, HfArch::kQwen2Moe);
  EXPECT_EQ(m.num_experts, 4);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_ffn(), 16);
  EXPECT_EQ(m.ffn(), 40);  // the dense MLP's size (no dense layer with decoder_sparse_step 1)
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 24);
  EXPECT_TRUE(m.moe_shared_expert_gate);
  EXPECT_TRUE(m.moe_router_pre_softmax);  // norm_topk_prob false
  EXPECT_EQ(m.moe_layer_freq, 1);
  EXPECT_EQ(m.moe_router_score_function, model::MoeScoreFunction::kSoftmax);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.001);
  EXPECT_FALSE(m.add_bias_linear);
  EXPECT_TRUE(m.add_qkv_bias);
  EXPECT_EQ(m.query_groups(), 2);
  EXPECT_EQ(m.rotary_base, 5000.0);
  EXPECT_EQ(m.layernorm_epsilon, 1e-6);
  EXPECT_TRUE(m.swiglu);
  EXPECT_FALSE(m.tied_output());
  // And back: every key config.json gave is written with its value.
  EXPECT_EQ(ckpt::hf_arch_of(m), HfArch::kQwen2Moe);
  const json out = ckpt::trident_to_hf_config(m, HfArch::kQwen2Moe, imp.dtype);
  const json in = qwen2_moe_config();
  for (const auto& [key, value] : in.items()) {
    if (key == "use_cache" || key == "max_window_layers") continue;  // not trident's
    ASSERT_TRUE(out.contains(key)) << key;
    EXPECT_EQ(out[key], value) << key;
  }
  // norm_topk_prob true: the top k renormalised, trident's default router.
  json norm = qwen2_moe_config();
  norm["norm_topk_prob"] = true;
  const model::ModelConfig n = ckpt::hf_config_to_trident(norm, 0).model;
  EXPECT_FALSE(n.moe_router_pre_softmax);
  EXPECT_EQ(ckpt::trident_to_hf_config(n, ckpt::hf_arch_of(n), imp.dtype)["norm_topk_prob"], true);
  // Absent keys take Qwen2MoeConfig's defaults.
  json bare = qwen2_moe_config();
  for (const char* k : {"norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                        "use_sliding_window", "sliding_window", "rms_norm_eps"}) {
    bare.erase(k);
  }
  const model::ModelConfig b = ckpt::hf_config_to_trident(bare, 0).model;
  EXPECT_TRUE(b.moe_router_pre_softmax);
  EXPECT_EQ(b.layernorm_epsilon, 1e-6);
  EXPECT_TRUE(b.moe_layer_pattern.empty());
  EXPECT_EQ(b.moe_layer_freq, 1);
}

// decoder_sparse_step and mlp_only_layers: transformers' layer i is sparse iff i is not in
// mlp_only_layers and (i + 1) % decoder_sparse_step == 0; trident's --moe-layer-freq pattern says
// the same layers, and the export writes keys that make the same layers sparse (the step alone
// where one does, else step 1 and the dense layers).
TEST(HfQwen2Moe, SparseLayersMapToThePattern) {
  struct Case {
    int layers, step;
    json mlp_only;
    std::string pattern;
    int step_out;
    json mlp_only_out;
  };
  const std::vector<Case> cases = {
      {4, 1, json::array(), "[1,1,1,1]", 1, json::array()},
      {4, 2, json::array(), "[0,1,0,1]", 2, json::array()},
      {6, 3, json::array(), "[0,0,1,0,0,1]", 3, json::array()},
      {4, 1, {1}, "[1,0,1,1]", 1, {1}},
      {4, 1, {0, 3}, "[0,1,1,0]", 1, {0, 3}},
      {4, 2, {1}, "[0,0,0,1]", 4, json::array()},  // one sparse layer: step 4 alone says it
      // {1} over 5 layers: no step alone (2 gives {1, 3}): step 1 and the dense layers.
      {5, 2, {3}, "[0,1,0,0,0]", 1, {0, 2, 3, 4}},
      {2, 1, nullptr, "[1,1]", 1, json::array()},  // null: []
  };
  for (const Case& c : cases) {
    json in = qwen2_moe_config();
    in["num_hidden_layers"] = c.layers;
    in["decoder_sparse_step"] = c.step;
    in["mlp_only_layers"] = c.mlp_only;
    const model::ModelConfig m = ckpt::hf_config_to_trident(in, 0).model;
    const std::string what = in["decoder_sparse_step"].dump() + " " + in["mlp_only_layers"].dump();
    EXPECT_EQ(m.moe_layer_pattern_string(), c.pattern) << what;
    EXPECT_EQ(m.moe_layer_pattern.empty(), c.pattern.find('0') == std::string::npos) << what;
    EXPECT_EQ(m.ffn(), 40) << what;  // the dense layers' MLP: intermediate_size
    EXPECT_EQ(m.moe_ffn(), 16) << what;
    ASSERT_EQ(ckpt::hf_arch_of(m), HfArch::kQwen2Moe) << what;
    const json out = ckpt::trident_to_hf_config(m, HfArch::kQwen2Moe, ckpt::StDType::kF32);
    EXPECT_EQ(out["decoder_sparse_step"], c.step_out) << what;
    EXPECT_EQ(out["mlp_only_layers"], c.mlp_only_out) << what;
    EXPECT_EQ(out["intermediate_size"], 40) << what;
    // Back in: the same layers.
    json again = in;
    again["decoder_sparse_step"] = out["decoder_sparse_step"];
    again["mlp_only_layers"] = out["mlp_only_layers"];
    EXPECT_EQ(ckpt::hf_config_to_trident(again, 0).model.moe_layer_pattern_string(), c.pattern)
        << what << " -> " << out["decoder_sparse_step"] << " " << out["mlp_only_layers"];
  }
  // trident's --moe-layer-freq 2 (layers 0, 2): exported as Qwen2-MoE with mlp_only_layers.
  model::ModelConfig freq = ckpt::hf_config_to_trident(qwen2_moe_config(), 0).model;
  freq.num_layers = 4;
  freq.moe_layer_freq = 2;
  const json f = ckpt::trident_to_hf_config(freq, ckpt::hf_arch_of(freq), ckpt::StDType::kF32);
  EXPECT_EQ(f["decoder_sparse_step"], 1);
  EXPECT_EQ(f["mlp_only_layers"], json({1, 3}));
}

TEST(HfQwen2Moe, EveryWeightHasItsTensors) {
  const model::ModelConfig m = ckpt::hf_config_to_trident(qwen2_moe_config(), 0).model;
  const std::vector<ckpt::HfTensor> t = ckpt::hf_tensors(m, HfArch::kQwen2Moe);
  // embed, norm, lm_head; per layer 2 norms, q, k, v and their biases, o, the router, 3 x 4
  // experts, the shared expert's 3 and its gate.
  EXPECT_EQ(t.size(), 3u + 2u * (2 + 7 + 1 + 3 * 4 + 3 + 1));
  std::set<std::pair<std::string, std::int64_t>> covered;
  std::int64_t elements = 0;
  for (const ckpt::HfTensor& x : t) {
    if (x.name.ends_with("q_proj.bias")) {
      EXPECT_EQ(x.shape, (std::vector<std::int64_t>{32}));
    }
    if (x.name.ends_with("k_proj.bias")) {
      EXPECT_EQ(x.shape, (std::vector<std::int64_t>{16}));
    }
    if (x.name.ends_with("shared_expert_gate.weight")) {
      EXPECT_EQ(x.shape, (std::vector<std::int64_t>{1, 32}));
    }
    if (x.name.ends_with("shared_expert.down_proj.weight")) {
      EXPECT_EQ(x.shape, (std::vector<std::int64_t>{32, 24}));
    }
    if (x.name.ends_with("experts.3.down_proj.weight")) {
      EXPECT_EQ(x.shape, (std::vector<std::int64_t>{32, 16}));
    }
    if (x.trident_name.find("layers.") != 0) continue;
    elements += x.numel();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_TRUE(covered.insert({x.trident_name, x.index(i)}).second)
          << x.name << " element " << i << " is another tensor's too";
    }
  }
  // Every element of every layer weight, once.
  std::int64_t layer_numel = 0;
  for (const model::ParamSpec& p : model::build_gpt_param_table(m).params) {
    if (p.layer >= 0) layer_numel += p.numel;
  }
  EXPECT_EQ(elements, layer_numel);
  EXPECT_EQ(static_cast<std::int64_t>(covered.size()), layer_numel);

  // Dense layers (mlp_only_layers [0]): Llama's MLP of intermediate_size under mlp., every
  // element once.
  json with_dense = qwen2_moe_config();
  with_dense["mlp_only_layers"] = {0};
  const model::ModelConfig d = ckpt::hf_config_to_trident(with_dense, 0).model;
  std::set<std::string> names;
  std::set<std::pair<std::string, std::int64_t>> dense_covered;
  std::int64_t dense_elements = 0;
  for (const ckpt::HfTensor& x : ckpt::hf_tensors(d, HfArch::kQwen2Moe)) {
    names.insert(x.name);
    if (x.trident_name.rfind("layers.0.mlp.", 0) != 0) continue;
    dense_elements += x.numel();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_TRUE(dense_covered.insert({x.trident_name, x.index(i)}).second) << x.name;
    }
  }
  for (const char* n : {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                        "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.gate.weight",
                        "model.layers.1.mlp.experts.3.up_proj.weight"}) {
    EXPECT_TRUE(names.contains(n)) << n;
  }
  EXPECT_FALSE(names.contains("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(names.contains("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_EQ(dense_elements, 3 * 40 * 32);  // gate, up (40, 32), down (32, 40)
  EXPECT_EQ(static_cast<std::int64_t>(dense_covered.size()), dense_elements);
}

TEST(HfQwen2Moe, ImportRefusesWhatTridentCannotRun) {
  const auto refusal = [](const json& c) {
    return error_of([&] { (void)ckpt::hf_config_to_trident(c, 0); });
  };
  const std::vector<std::tuple<std::string, json, std::string>> cases = {
      {"decoder_sparse_step", 0, "decoder_sparse_step = 0 is not supported"},
      {"decoder_sparse_step", 3,
       "decoder_sparse_step = 3 and mlp_only_layers leave no sparse layer in 2 layers"},
      {"mlp_only_layers",
       {0, 1},
       "decoder_sparse_step = 1 and mlp_only_layers leave no sparse layer in 2 layers"},
      {"mlp_only_layers",
       {2},
       "mlp_only_layers = [2]: layer 2 is not one of the "
       "num_hidden_layers = 2 layers"},
      {"mlp_only_layers", {-1}, "mlp_only_layers[] = -1 must be a non-negative integer"},
      {"mlp_only_layers", 1, "mlp_only_layers = 1 must be a list of layer indices"},
      {"use_sliding_window", true, "use_sliding_window true"},
      {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}, "rope_scaling"},
      {"shared_expert_intermediate_size", 0, "shared_expert_intermediate_size 0"},
      {"num_experts", 0, "num_experts 0"},
      {"qkv_bias", false, "qkv_bias false"},
      {"hidden_act", "gelu", "hidden_act"},
      {"num_experts_per_tok", 5, "--moe-router-topk"},
  };
  for (const auto& [key, value, expect] : cases) {
    json c = qwen2_moe_config();
    c[key] = value;
    const std::string e = refusal(c);
    EXPECT_NE(e.find(expect), std::string::npos) << key << ": " << e;
  }
  EXPECT_EQ(refusal(qwen2_moe_config()), "");
}

TEST(HfQwen2Moe, ExportRefusesWhatNeitherArchitectureExpresses) {
  const model::ModelConfig base = ckpt::hf_config_to_trident(qwen2_moe_config(), 0).model;
  const std::vector<std::tuple<std::string, std::string, std::function<void(model::ModelConfig&)>>>
      cases = {
          {"Qwen2-MoE", "--moe-shared-expert-gate",
           [](model::ModelConfig& m) { m.moe_shared_expert_gate = false; }},
          {"Qwen2-MoE", "no QKV bias", [](model::ModelConfig& m) { m.add_qkv_bias = false; }},
          {"Qwen2-MoE", "biases other than the QKV's",
           [](model::ModelConfig& m) { m.add_bias_linear = true; }},
          {"Qwen2-MoE", "--moe-expert-capacity-factor",
           [](model::ModelConfig& m) { m.moe_expert_capacity_factor = 1.5; }},
          // Without shared experts it would be a Mixtral, which has neither of these.
          {"Mixtral", "--add-qkv-bias",
           [](model::ModelConfig& m) {
             m.moe_shared_expert_intermediate_size = 0;
             m.moe_shared_expert_gate = false;
             m.moe_router_pre_softmax = false;
           }},
          {"Mixtral", "--moe-router-pre-softmax",
           [](model::ModelConfig& m) {
             m.moe_shared_expert_intermediate_size = 0;
             m.moe_shared_expert_gate = false;
             m.add_qkv_bias = false;
           }},
          // Dense layers: Qwen2-MoE has them, Mixtral not.
          {"Mixtral", "--moe-layer-freq with dense layers",
           [](model::ModelConfig& m) {
             m.moe_shared_expert_intermediate_size = 0;
             m.moe_shared_expert_gate = false;
             m.add_qkv_bias = false;
             m.moe_router_pre_softmax = false;
             m.moe_layer_pattern = {false, true};
           }},
      };
  for (const auto& [arch, setting, change] : cases) {
    model::ModelConfig m = base;
    change(m);
    const std::string e = error_of([&] { (void)ckpt::hf_arch_of(m); });
    EXPECT_NE(e.find("not transformers' " + arch), std::string::npos) << setting << ": " << e;
    EXPECT_NE(e.find(setting), std::string::npos) << setting << ": " << e;
  }
  // A dense Llama with the QKV bias is transformers' Qwen2 (HfQwen2.*), without rope scaling.
  model::ModelConfig dense = base;
  dense.num_experts = 0;
  EXPECT_EQ(ckpt::hf_arch_of(dense), HfArch::kQwen2);
  dense.rope_scaling = true;
  EXPECT_NE(error_of([&] { (void)ckpt::hf_arch_of(dense); }).find("rope_scaling of Qwen2"),
            std::string::npos);
}

// Qwen2 (dense, Qwen2ForCausalLM; what save_pretrained writes for a small Qwen2Config): Llama
// with biases on q, k and v alone, both ways; its refusals by name; every layer element covered
// by exactly one tensor.
json qwen2_config() {
  json c = qwen2_moe_config();
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                        "mlp_only_layers", "router_aux_loss_coef", "output_router_logits"}) {
    c.erase(k);
  }
  c["model_type"] = "qwen2";
  c["architectures"] = {"Qwen2ForCausalLM"};
  return c;
}

TEST(HfQwen2Moe, DenseQwen2ConvertsBothWays) {
  const ckpt::HfImport imp = ckpt::hf_config_to_trident(qwen2_config(), 0);
  const model::ModelConfig& m = imp.model;
  EXPECT_EQ(imp.arch, HfArch::kQwen2);
  EXPECT_EQ(m.num_experts, 0);
  EXPECT_FALSE(m.add_bias_linear);
  EXPECT_TRUE(m.add_qkv_bias);
  EXPECT_EQ(m.ffn(), 40);
  EXPECT_EQ(m.query_groups(), 2);
  EXPECT_EQ(m.rotary_base, 5000.0);
  EXPECT_EQ(m.layernorm_epsilon, 1e-6);
  EXPECT_TRUE(m.swiglu);
  EXPECT_FALSE(m.tied_output());
  EXPECT_EQ(ckpt::hf_arch_of(m), HfArch::kQwen2);
  const json out = ckpt::trident_to_hf_config(m, HfArch::kQwen2, imp.dtype);
  const json in = qwen2_config();
  for (const auto& [key, value] : in.items()) {
    if (key == "use_cache" || key == "max_window_layers") continue;  // not trident's
    ASSERT_TRUE(out.contains(key)) << key;
    EXPECT_EQ(out[key], value) << key;
  }
  EXPECT_FALSE(out.contains("num_experts"));
  // Qwen2Config's defaults for absent keys; null key/value heads: one per query head.
  json bare = qwen2_config();
  bare.erase("rms_norm_eps");
  bare.erase("rope_theta");
  bare["num_key_value_heads"] = nullptr;
  const model::ModelConfig b = ckpt::hf_config_to_trident(bare, 0).model;
  EXPECT_EQ(b.layernorm_epsilon, 1e-6);
  EXPECT_EQ(b.rotary_base, 10000.0);
  EXPECT_EQ(b.query_groups(), 4);
  // Refusals, by name.
  for (const auto& [key, value, expect] : std::vector<std::tuple<std::string, json, std::string>>{
           {"use_sliding_window", true, "use_sliding_window true is not supported"},
           {"rope_scaling",
            {{"rope_type", "linear"}, {"factor", 2.0}},
            "rope_scaling is not supported for qwen2"},
           {"hidden_act", "gelu", "hidden_act other than silu"}}) {
    json c = qwen2_config();
    c[key] = value;
    const std::string e = error_of([&] { (void)ckpt::hf_config_to_trident(c, 0); });
    EXPECT_NE(e.find(expect), std::string::npos) << key << ": " << e;
  }
  // The tensors: Llama's and the three biases.
  const std::vector<ckpt::HfTensor> t = ckpt::hf_tensors(m, HfArch::kQwen2);
  EXPECT_EQ(t.size(), 3u + 2u * (2 + 7 + 3));
  std::set<std::pair<std::string, std::int64_t>> covered;
  std::int64_t elements = 0, layer_numel = 0;
  for (const ckpt::HfTensor& x : t) {
    if (x.name == "model.layers.1.self_attn.v_proj.bias") {
      EXPECT_EQ(x.shape, (std::vector<std::int64_t>{16}));
    }
    if (x.name == "model.layers.1.mlp.down_proj.weight") {
      EXPECT_EQ(x.shape, (std::vector<std::int64_t>{32, 40}));
    }
    if (x.trident_name.find("layers.") != 0) continue;
    elements += x.numel();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_TRUE(covered.insert({x.trident_name, x.index(i)}).second) << x.name;
    }
  }
  for (const model::ParamSpec& p : model::build_gpt_param_table(m).params) {
    if (p.layer >= 0) layer_numel += p.numel;
  }
  EXPECT_EQ(elements, layer_numel);
  EXPECT_EQ(static_cast<std::int64_t>(covered.size()), layer_numel);
}

// --- Against transformers --------------------------------------------------------------------

int run(const std::string& cmd, const fs::path& log) {
  const std::string full = cmd + " > " + log.string() + " 2>&1";
  const int rc = std::system(full.c_str());
  if (rc != 0) {
    std::ifstream in(log);
    std::cerr << "command failed: " << full << "\n" << in.rdbuf();
  }
  return rc;
}

constexpr double kTolerance = 1e-5;

// max |a - b| / max |b| over b's values, a read at a_index(i).
double rel_error(const std::function<double(std::int64_t)>& a, const std::vector<double>& b) {
  double max_ref = 0, max_diff = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(b[i]));
    const double d = std::abs(a(static_cast<std::int64_t>(i)) - b[i]);
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

// One trident model from the imported weights: forward (logits, routing) and, with targets, the
// mean loss and the gradients.
struct Imported {
  model::ModelConfig cfg;
  model::ParamTable table;
  std::vector<float> params, grads;
  model::GptActivations acts;
  model::ModelRuntime rt;
  core::ExecContext ctx;
  std::int64_t B = 0, T = 0;

  Imported(const model::ModelConfig& c, std::int64_t b, std::int64_t t)
      : cfg(c),
        table(model::build_gpt_param_table(c)),
        params(static_cast<std::size_t>(table.total_numel), 0.0f),
        grads(params.size(), 0.0f),
        B(b),
        T(t) {
    model::make_activations(cfg, rt.shard, B, T, acts);
  }
  // The weights of `from` by name (those this model lacks are skipped).
  void copy_from(const Imported& from) {
    for (const model::ParamSpec& p : table.params) {
      for (const model::ParamSpec& q : from.table.params) {
        if (q.name != p.name) continue;
        std::copy_n(from.params.begin() + q.offset, p.numel, params.begin() + p.offset);
      }
    }
  }
  float* param(const std::string& name) {
    for (const model::ParamSpec& p : table.params) {
      if (p.name == name) return params.data() + p.offset;
    }
    return nullptr;
  }
  void forward(const std::vector<std::int32_t>& tokens) {
    const model::GptParams p = model::gpt_param_views(cfg, table, params.data());
    model::gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, acts);
  }
  double loss_and_backward(const std::vector<std::int32_t>& tokens,
                           const std::vector<std::int32_t>& targets) {
    const model::GptParams p = model::gpt_param_views(cfg, table, params.data());
    const model::GptGrads g = model::gpt_grad_views(cfg, table, grads.data());
    const model::LossSum l =
        model::gpt_loss(ctx, cfg, rt, targets.data(), 1.0f, model::LossGrad::kCompute, acts);
    // transformers' loss is the mean over the counted tokens.
    for (std::int64_t i = 0; i < B * T * cfg.padded_vocab_size(); ++i) {
      acts.logits[i] /= static_cast<float>(l.count);
    }
    model::gpt_backward(ctx, cfg, rt, p, g, tokens.data(), acts);
    return l.sum / static_cast<double>(l.count);
  }
  // The logits' error against transformers' (B*T, V); trident's rows are padded.
  double logits_error(const std::vector<double>& ref) const {
    const std::int64_t V = cfg.vocab_size, Vp = cfg.padded_vocab_size();
    return rel_error([&](std::int64_t i) { return acts.logits[(i / V) * Vp + i % V]; }, ref);
  }
};

// One golden model: the top-k normalisation, and the layers (decoder_sparse_step,
// mlp_only_layers: the sparse layers trident's --moe-layer-freq pattern must reproduce).
struct GoldenCase {
  bool norm_topk_prob = false;
  int layers = 2;
  int sparse_step = 1;
  std::string mlp_only;  // "1,3"
  std::string pattern;   // trident's moe_layer_pattern_string() expected
  bool dense = false;    // a Qwen2 (Qwen2ForCausalLM) instead: no experts
};

void golden(const GoldenCase& gc) {
  const bool norm_topk_prob = gc.norm_topk_prob;
  const fs::path dir =
      fs::temp_directory_path() /
      ("trident_hf_qwen2_moe_" + std::to_string(::getpid()) + (gc.dense ? "_dense" : "") +
       (norm_topk_prob ? "_norm" : "_presoftmax") + "_" + std::to_string(gc.layers) + "_" +
       std::to_string(gc.sparse_step) + "_" + gc.mlp_only);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path hf = dir / "hf", ckpt_dir = dir / "ckpt", ref_path = dir / "transformers.trtf";
  ASSERT_EQ(run(std::string(TRIDENT_HF_PYTHON) + " " + TRIDENT_SOURCE_DIR +
                    "/tests/reference/hf_qwen2_moe_golden.py --out " + hf.string() + " --output " +
                    ref_path.string() + (norm_topk_prob ? " --norm-topk-prob" : "") + " --layers " +
                    std::to_string(gc.layers) + " --sparse-step " + std::to_string(gc.sparse_step) +
                    (gc.mlp_only.empty() ? "" : " --mlp-only " + gc.mlp_only) +
                    (gc.dense ? " --dense" : ""),
                dir / "transformers.txt"),
            0);
  const auto ref = testing::read_tensor_file(ref_path.string());
  const testing::NamedTensor& tok = testing::find_tensor(ref, "tokens");
  const std::int64_t B = tok.shape[0], T = tok.shape[1];
  ASSERT_EQ(
      run(std::string("OMP_NUM_THREADS=1 ") + TRIDENT_CLI + " convert --from-hf " + hf.string() +
              " --save " + ckpt_dir.string() + " --seq-length " + std::to_string(T),
          dir / "import.txt"),
      0);
  const json manifest = ckpt::read_manifest(ckpt_dir.string(), -1);
  const model::ModelConfig cfg = ckpt::model_config_from_json(manifest.at("config"));
  const HfArch arch = gc.dense ? HfArch::kQwen2 : HfArch::kQwen2Moe;
  ASSERT_EQ(ckpt::hf_arch_of(cfg), arch);
  ASSERT_EQ(cfg.num_experts, gc.dense ? 0 : 4);
  ASSERT_TRUE(cfg.add_qkv_bias && !cfg.add_bias_linear);
  ASSERT_EQ(cfg.num_layers, gc.layers);
  if (!gc.dense) {
    ASSERT_EQ(cfg.moe_router_pre_softmax, !norm_topk_prob);
    ASSERT_EQ(cfg.moe_layer_pattern_string(), gc.pattern);
  }
  Imported m(cfg, B, T);
  ckpt::load_full_params(ckpt_dir.string(), -1, m.table, m.params.data());

  const std::vector<std::int32_t> tokens = tok.i32();
  // transformers shifts its labels: position t's target is token t + 1; the last has none.
  std::vector<std::int32_t> targets(tokens.size());
  for (std::int64_t i = 0; i < B * T; ++i) {
    targets[static_cast<std::size_t>(i)] =
        (i + 1) % T == 0 ? -1 : tokens[static_cast<std::size_t>(i + 1)];
  }
  if (gc.dense) {
    std::printf("Qwen2 (dense), %d layers\n", gc.layers);
  } else {
    std::printf(
        "norm_topk_prob %s, %d layers, decoder_sparse_step %d, mlp_only_layers [%s]: "
        "--moe-layer-freq %s\n",
        norm_topk_prob ? "true" : "false", gc.layers, gc.sparse_step, gc.mlp_only.c_str(),
        cfg.moe_layer_pattern_string().c_str());
  }
  auto report = [](const std::string& what, double e) {
    EXPECT_LE(e, kTolerance) << what << ": max |trident - transformers| / max |transformers|";
    std::printf("  %-58s rel err %.2e\n", what.c_str(), e);
  };
  m.forward(tokens);
  const std::vector<double> ref_logits = testing::find_tensor(ref, "logits").to_f64();
  report("logits", m.logits_error(ref_logits));
  const std::int64_t k = cfg.moe_router_topk, E = cfg.num_experts, rows = B * T;
  std::int64_t sparse_layers = 0;
  for (std::int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.moe_layer(l)) continue;  // transformers has router outputs for the sparse ones
    ++sparse_layers;
    const model::layers::MoeSaved& moe = m.acts.layers[static_cast<std::size_t>(l)].moe;
    const std::string at = std::to_string(l);
    report("router_logits." + at,
           rel_error([&](std::int64_t i) { return moe.logits[i]; },
                     testing::find_tensor(ref, "router_logits." + at).to_f64()));
    const std::vector<std::int64_t> theirs =
        testing::find_tensor(ref, "router_experts." + at).i64();
    ASSERT_EQ(static_cast<std::int64_t>(theirs.size()), rows * k);
    std::int64_t differ = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      std::vector<std::int64_t> a(moe.experts + r * k, moe.experts + (r + 1) * k);
      std::vector<std::int64_t> b(theirs.begin() + r * k, theirs.begin() + (r + 1) * k);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      differ += a != b;
    }
    EXPECT_EQ(differ, 0) << "layer " << l << ": tokens routed to other experts than transformers'";
    std::printf("  %-58s %lld of %lld tokens differ (E %lld)\n", ("router_experts." + at).c_str(),
                static_cast<long long>(differ), static_cast<long long>(rows),
                static_cast<long long>(E));
  }
  const double loss = m.loss_and_backward(tokens, targets);
  report("loss", std::abs(loss - testing::find_tensor(ref, "loss").scalar()) /
                     std::abs(testing::find_tensor(ref, "loss").scalar()));
  // Every gradient, per transformers tensor, read through the import's map.
  std::int64_t compared = 0;
  for (const ckpt::HfTensor& t : ckpt::hf_tensors(cfg, arch)) {
    const model::ParamSpec* spec = nullptr;
    for (const model::ParamSpec& p : m.table.params) {
      if (p.name == t.trident_name) spec = &p;
    }
    ASSERT_NE(spec, nullptr) << t.name;
    const testing::NamedTensor& g = testing::find_tensor(ref, "grad." + t.name);
    ASSERT_EQ(g.numel(), t.numel()) << t.name;
    const float* grad = m.grads.data() + spec->offset;
    report("grad." + t.name,
           rel_error([&](std::int64_t i) { return grad[t.index(i)]; }, g.to_f64()));
    ++compared;
  }
  // embed, norm, lm_head; per layer 2 norms, q, k, v and their biases, o; a sparse layer's
  // router, 3 x 4 experts, shared expert's 3 and its gate; a dense layer's 3 MLP matrices.
  const std::int64_t dense_layers = cfg.num_layers - sparse_layers;
  EXPECT_EQ(compared,
            3 + cfg.num_layers * (2 + 7) + sparse_layers * (1 + 3 * 4 + 3 + 1) + dense_layers * 3);

  // Mutations: each must move the logits far beyond the tolerance.
  auto mutated = [&](const std::string& what, const model::ModelConfig& c,
                     const std::function<void(Imported&)>& change) {
    Imported x(c, B, T);
    x.copy_from(m);
    change(x);
    x.forward(tokens);
    const double e = x.logits_error(ref_logits);
    EXPECT_GT(e, 100 * kTolerance) << what << " is not caught";
    std::printf("  mutation: %-48s logits rel err %.2e\n", what.c_str(), e);
  };
  mutated("no QKV bias", cfg, [&](Imported& x) {
    for (std::int64_t l = 0; l < cfg.num_layers; ++l) {
      float* b = x.param("layers." + std::to_string(l) + ".self_attention.query_key_value.bias");
      ASSERT_NE(b, nullptr);
      std::fill_n(b, cfg.qkv_rows(), 0.0f);
    }
  });
  if (!gc.dense) {
    model::ModelConfig no_gate = cfg;
    no_gate.moe_shared_expert_gate = false;
    mutated("no shared-expert gate", no_gate, [](Imported&) {});
    model::ModelConfig other_norm = cfg;
    other_norm.moe_router_pre_softmax = !cfg.moe_router_pre_softmax;
    mutated("the other top-k normalisation", other_norm, [](Imported&) {});
  }
  if (dense_layers > 0) {
    // The dense layers' MLP (mlp.gate_proj / up_proj / down_proj of intermediate_size) counts.
    mutated("the dense layers' MLP zeroed", cfg, [&](Imported& x) {
      for (std::int64_t l = 0; l < cfg.num_layers; ++l) {
        if (cfg.moe_layer(l)) continue;
        float* w = x.param("layers." + std::to_string(l) + ".mlp.dense_4h_to_h.weight");
        ASSERT_NE(w, nullptr) << "layer " << l << " has no dense MLP";
        std::fill_n(w, cfg.hidden_size * cfg.ffn(), 0.0f);
      }
    });
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

TEST(HfQwen2MoeGolden, ImportedModelMatchesTransformers) { golden({.pattern = "[1,1]"}); }
TEST(HfQwen2MoeGolden, ImportedModelMatchesTransformersNormTopk) {
  golden({.norm_topk_prob = true, .pattern = "[1,1]"});
}
// decoder_sparse_step 2 over 4 layers: layers 1 and 3 sparse, 0 and 2 dense.
TEST(HfQwen2MoeGolden, DecoderSparseStep) {
  golden({.layers = 4, .sparse_step = 2, .pattern = "[0,1,0,1]"});
}
// mlp_only_layers [0, 3] with step 1 over 4 layers: 1 and 2 sparse; with norm_topk_prob.
TEST(HfQwen2MoeGolden, MlpOnlyLayers) {
  golden({.norm_topk_prob = true, .layers = 4, .mlp_only = "0,3", .pattern = "[0,1,1,0]"});
}
// Qwen2 (dense, Qwen2ForCausalLM): Llama with the q, k, v biases; 3 layers, every MLP dense.
TEST(HfQwen2MoeGolden, DenseQwen2) { golden({.layers = 3, .dense = true}); }

}  // namespace
}  // namespace trident
