// The mixture-of-experts layer inside the model: the parameter table declares the router and the
// experts in the MoE layers only (--moe-layer-freq), the parameter count follows, the whole model's
// gradients (the LM loss plus every MoE layer's load-balancing loss and z-loss) match central
// finite differences of that objective, and a layer's recorded routing is complete.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "tiny_model.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"

namespace trident::model {
namespace {

ModelConfig moe_config() {
  ModelConfig c = testing::tiny_config(8, 40);
  c.num_layers = 3;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.normalization = Normalization::kRmsNorm;
  c.position_embedding = PositionEmbedding::kRope;
  c.untie_embeddings_and_output_weights = true;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  c.moe_layer_freq = 2;  // layers 0 and 2
  c.moe_aux_loss_coeff = 0.1;
  c.moe_z_loss_coeff = 0.01;
  c.moe_shared_expert_intermediate_size = 16;  // Qwen2-MoE's shared experts, gated
  c.moe_shared_expert_gate = true;
  return c;
}

const ParamSpec* find(const ParamTable& t, const std::string& name) {
  for (const ParamSpec& p : t.params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

TEST(MoeModel, TableDeclaresTheExpertsInTheirLayers) {
  const ModelConfig cfg = moe_config();
  const ParamTable t = build_gpt_param_table(cfg);
  for (int l : {0, 2}) {
    const std::string p = "layers." + std::to_string(l) + ".mlp.";
    const ParamSpec* router = find(t, p + "router.weight");
    ASSERT_NE(router, nullptr) << p;
    EXPECT_EQ(router->shape, (std::vector<std::int64_t>{4, 32}));
    const ParamSpec* fc = find(t, p + "experts.dense_h_to_4h.weight");
    ASSERT_NE(fc, nullptr);
    EXPECT_EQ(fc->shape, (std::vector<std::int64_t>{4, 2, 24, 32}));
    const ParamSpec* fc2 = find(t, p + "experts.dense_4h_to_h.weight");
    ASSERT_NE(fc2, nullptr);
    EXPECT_EQ(fc2->shape, (std::vector<std::int64_t>{4, 32, 24}));
    EXPECT_EQ(find(t, p + "dense_h_to_4h.weight"), nullptr) << "a MoE layer has no dense MLP";
    const ParamSpec* shared = find(t, p + "shared_experts.dense_h_to_4h.weight");
    ASSERT_NE(shared, nullptr);
    EXPECT_EQ(shared->shape, (std::vector<std::int64_t>{2, 16, 32}));
    EXPECT_FALSE(shared->expert);
    ASSERT_NE(find(t, p + "shared_experts.dense_4h_to_h.weight"), nullptr);
    const ParamSpec* gate = find(t, p + "shared_experts.gate_weight");
    ASSERT_NE(gate, nullptr);
    EXPECT_EQ(gate->shape, (std::vector<std::int64_t>{1, 32}));
  }
  EXPECT_NE(find(t, "layers.1.mlp.dense_h_to_4h.weight"), nullptr);
  EXPECT_EQ(find(t, "layers.1.mlp.router.weight"), nullptr);
  std::int64_t total = 0;
  for (const ParamSpec& p : t.params) total += p.numel;
  EXPECT_EQ(total, cfg.num_parameters());
}

struct MoeRun {
  ModelConfig cfg = moe_config();
  testing::TinyParams tiny{cfg, 7};
  GptParams p = tiny.views();
  GptGrads g = tiny.grad_views();
  ModelRuntime rt;
  GptActivations a;
  const core::ExecContext ctx;
  std::vector<std::int32_t> tokens, labels;
  static constexpr std::int64_t B = 2, T = 8;

  MoeRun() {
    make_activations(cfg, rt.shard, B, T, a);
    tokens = testing::random_ids(1, B * T, cfg.vocab_size);
    labels = testing::random_ids(2, B * T, cfg.vocab_size);
  }
  // The objective: mean token loss + every MoE layer's auxiliary losses (their coefficients
  // included); with gradients into g when `backward`.
  double objective(bool backward) {
    gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, a);
    const LossSum l = gpt_loss(ctx, cfg, rt, p, g, labels.data(), 1.0f / (B * T),
                               backward ? LossGrad::kCompute : LossGrad::kNone, a);
    double aux = 0;
    for (const layers::MoeStats& s : a.moe_stats) aux += s.aux_loss + s.z_loss;
    if (backward) gpt_backward(ctx, cfg, rt, p, g, tokens.data(), a);
    return l.sum / static_cast<double>(l.count) + aux;
  }
};

TEST(MoeModel, GradientsMatchFiniteDifferences) {
  MoeRun r;
  std::fill(r.tiny.grads.begin(), r.tiny.grads.end(), 0.0f);
  r.objective(true);
  ASSERT_EQ(r.a.moe_stats.size(), 3u);
  EXPECT_GT(r.a.moe_stats[0].aux_loss, 0.0);
  EXPECT_GT(r.a.moe_stats[2].z_loss, 0.0);
  EXPECT_TRUE(r.a.moe_stats[1].tokens_per_expert.empty()) << "layer 1 is dense";
  std::int64_t routed = 0;
  for (std::int32_t c : r.a.moe_stats[2].tokens_per_expert) routed += c;
  EXPECT_EQ(routed, MoeRun::B * MoeRun::T * 2);
  // A few elements of each MoE weight, a dense layer's and the attention's.
  std::mt19937 rng(3);
  int checked = 0, bad = 0;
  for (const char* name :
       {"layers.0.mlp.router.weight", "layers.0.mlp.experts.dense_h_to_4h.weight",
        "layers.2.mlp.experts.dense_4h_to_h.weight", "layers.2.mlp.router.weight",
        "layers.1.mlp.dense_h_to_4h.weight", "layers.0.self_attention.query_key_value.weight",
        "layers.0.mlp.shared_experts.dense_h_to_4h.weight",
        "layers.2.mlp.shared_experts.dense_4h_to_h.weight",
        "layers.2.mlp.shared_experts.gate_weight"}) {
    const ParamSpec* spec = find(r.tiny.table, name);
    ASSERT_NE(spec, nullptr) << name;
    for (int i = 0; i < 6; ++i) {
      const std::int64_t at = spec->offset + static_cast<std::int64_t>(rng() % spec->numel);
      float& w = r.tiny.params[static_cast<std::size_t>(at)];
      const float saved = w, eps = 2e-3f;
      w = saved + eps;
      const double up = r.objective(false);
      w = saved - eps;
      const double down = r.objective(false);
      w = saved;
      const double fd = (up - down) / (2.0 * static_cast<double>(eps));
      const double got = r.tiny.grads[static_cast<std::size_t>(at)];
      const bool ok = std::abs(got - fd) <= 2e-4 + 2e-2 * std::abs(fd);
      ++checked;
      if (!ok) {
        ++bad;
        ADD_FAILURE() << name << " element " << at - spec->offset << ": gradient " << got
                      << ", finite difference " << fd;
      }
    }
  }
  std::printf("checked %d gradient elements against finite differences\n", checked);
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace trident::model
