// Qwen2-MoE (transformers' Qwen2MoeForCausalLM) through `trident convert` (docs/moe.md, "Hugging
// Face"); the bitwise round trip is hf_roundtrip_qwen2_moe (tests/ckpt).
//
// HfQwen2Moe.*: config.json <-> trident's settings (biases on q, k, v alone: --add-qkv-bias; the
// gated shared expert; norm_topk_prob false: --moe-router-pre-softmax, true: the default router),
// the tensors (each element of each stacked weight covered once), and what is refused, by name,
// on import (decoder_sparse_step, mlp_only_layers, sliding windows, rope_scaling, ...) and on
// export (a model with experts neither Mixtral nor Qwen2-MoE can express).
//
// HfQwen2MoeGolden.ImportedModelMatchesTransformers (needs transformers, $TRIDENT_HF_PYTHON): a
// tiny random Qwen2-MoE saved by transformers (tests/reference/hf_qwen2_moe_golden.py: 2 layers,
// hidden 32, 4 heads in 2 key/value groups, 4 experts of 16, top 2, a shared expert of 24) is
// imported with `trident convert --from-hf`; trident (FP32) then computes the logits, the loss,
// every gradient (compared per transformers tensor, through the import's own map) and each
// layer's router logits and chosen experts, against transformers in float64, for norm_topk_prob
// false and true. Tolerance: max |trident - transformers| / max |transformers| <= 1e-5 per tensor
// (hf_golden_test's). Mutations: the model without its QKV bias, without the shared expert's
// gate, or with the other top-k normalisation is off by more than 100 x the tolerance.
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
}

TEST(HfQwen2Moe, ImportRefusesWhatTridentCannotRun) {
  const auto refusal = [](const json& c) {
    return error_of([&] { (void)ckpt::hf_config_to_trident(c, 0); });
  };
  const std::vector<std::tuple<std::string, json, std::string>> cases = {
      {"decoder_sparse_step", 2, "decoder_sparse_step = 2 is not supported"},
      {"mlp_only_layers", {1}, "mlp_only_layers = [1] is not supported"},
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
          {"Qwen2-MoE", "--moe-layer-freq", [](model::ModelConfig& m) { m.moe_layer_freq = 2; }},
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
      };
  for (const auto& [arch, setting, change] : cases) {
    model::ModelConfig m = base;
    change(m);
    const std::string e = error_of([&] { (void)ckpt::hf_arch_of(m); });
    EXPECT_NE(e.find("not transformers' " + arch), std::string::npos) << setting << ": " << e;
    EXPECT_NE(e.find(setting), std::string::npos) << setting << ": " << e;
  }
  // A dense Llama with the QKV bias is transformers' Qwen2, which is not converted.
  model::ModelConfig dense = base;
  dense.num_experts = 0;
  EXPECT_NE(error_of([&] { (void)ckpt::hf_arch_of(dense); }).find("Qwen2"), std::string::npos);
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

void golden(bool norm_topk_prob) {
  const fs::path dir =
      fs::temp_directory_path() / ("trident_hf_qwen2_moe_" + std::to_string(::getpid()) +
                                   (norm_topk_prob ? "_norm" : "_presoftmax"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path hf = dir / "hf", ckpt_dir = dir / "ckpt", ref_path = dir / "transformers.trtf";
  ASSERT_EQ(run(std::string(TRIDENT_HF_PYTHON) + " " + TRIDENT_SOURCE_DIR +
                    "/tests/reference/hf_qwen2_moe_golden.py --out " + hf.string() + " --output " +
                    ref_path.string() + (norm_topk_prob ? " --norm-topk-prob" : ""),
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
  ASSERT_EQ(cfg.num_experts, 4);
  ASSERT_TRUE(cfg.add_qkv_bias && !cfg.add_bias_linear);
  ASSERT_EQ(cfg.moe_router_pre_softmax, !norm_topk_prob);
  Imported m(cfg, B, T);
  ckpt::load_full_params(ckpt_dir.string(), -1, m.table, m.params.data());

  const std::vector<std::int32_t> tokens = tok.i32();
  // transformers shifts its labels: position t's target is token t + 1; the last has none.
  std::vector<std::int32_t> targets(tokens.size());
  for (std::int64_t i = 0; i < B * T; ++i) {
    targets[static_cast<std::size_t>(i)] =
        (i + 1) % T == 0 ? -1 : tokens[static_cast<std::size_t>(i + 1)];
  }
  std::printf("norm_topk_prob %s\n", norm_topk_prob ? "true" : "false");
  auto report = [](const std::string& what, double e) {
    EXPECT_LE(e, kTolerance) << what << ": max |trident - transformers| / max |transformers|";
    std::printf("  %-58s rel err %.2e\n", what.c_str(), e);
  };
  m.forward(tokens);
  const std::vector<double> ref_logits = testing::find_tensor(ref, "logits").to_f64();
  report("logits", m.logits_error(ref_logits));
  const std::int64_t k = cfg.moe_router_topk, E = cfg.num_experts, rows = B * T;
  for (std::int64_t l = 0; l < cfg.num_layers; ++l) {
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
  for (const ckpt::HfTensor& t : ckpt::hf_tensors(cfg, HfArch::kQwen2Moe)) {
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
  EXPECT_EQ(compared, 3 + 2 * (2 + 7 + 1 + 3 * 4 + 3 + 1));

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
  model::ModelConfig no_gate = cfg;
  no_gate.moe_shared_expert_gate = false;
  mutated("no shared-expert gate", no_gate, [](Imported&) {});
  model::ModelConfig other_norm = cfg;
  other_norm.moe_router_pre_softmax = !cfg.moe_router_pre_softmax;
  mutated("the other top-k normalisation", other_norm, [](Imported&) {});
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

TEST(HfQwen2MoeGolden, ImportedModelMatchesTransformers) { golden(false); }
TEST(HfQwen2MoeGolden, ImportedModelMatchesTransformersNormTopk) { golden(true); }

}  // namespace
}  // namespace trident
