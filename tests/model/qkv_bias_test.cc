// The QKV-only bias (--add-qkv-bias with --disable-bias-linear, Qwen2 and Qwen2-MoE): the table
// declares each layer's query_key_value.bias and no other linear bias, the parameter count
// follows, a zero bias gives exactly the bias-free model's logits, and the bias's gradient matches
// central finite differences of the loss. (Against transformers: hf_golden_qwen2_moe.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tiny_model.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"

namespace trident::model {
namespace {

// A Qwen2-style model: RMSNorm, rope, SwiGLU, grouped-query attention, biases on q, k and v only.
ModelConfig qwen2_config(bool qkv_bias) {
  ModelConfig c = testing::tiny_config(8, 40);
  c.swiglu = true;
  c.add_bias_linear = false;
  c.add_qkv_bias = qkv_bias;
  c.normalization = Normalization::kRmsNorm;
  c.position_embedding = PositionEmbedding::kRope;
  c.untie_embeddings_and_output_weights = true;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 48;
  return c;
}

const ParamSpec* find(const ParamTable& t, const std::string& name) {
  for (const ParamSpec& p : t.params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

TEST(QkvBias, TableHasTheQkvBiasAlone) {
  const ModelConfig cfg = qwen2_config(true);
  EXPECT_TRUE(cfg.qkv_bias());
  const ParamTable t = build_gpt_param_table(cfg);
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const ParamSpec* b = find(t, p + "self_attention.query_key_value.bias");
    ASSERT_NE(b, nullptr) << p;
    EXPECT_EQ(b->shape, (std::vector<std::int64_t>{cfg.qkv_rows()}));  // (4 + 2 x 2) x 8
    EXPECT_FALSE(b->weight_decay);
    EXPECT_EQ(find(t, p + "self_attention.dense.bias"), nullptr);
    EXPECT_EQ(find(t, p + "mlp.dense_h_to_4h.bias"), nullptr);
    EXPECT_EQ(find(t, p + "mlp.dense_4h_to_h.bias"), nullptr);
  }
  std::int64_t total = 0;
  for (const ParamSpec& p : t.params) total += p.numel;
  EXPECT_EQ(total, cfg.num_parameters());
  const ParamTable none = build_gpt_param_table(qwen2_config(false));
  EXPECT_EQ(find(none, "layers.0.self_attention.query_key_value.bias"), nullptr);
  EXPECT_EQ(cfg.num_parameters() - qwen2_config(false).num_parameters(),
            cfg.num_layers * cfg.qkv_rows());
  // Two tensor-parallel ranks split the bias with the QKV rows.
  const ParamTable tp = build_gpt_param_table(cfg, {.tp_size = 2, .tp_rank = 1});
  const ParamSpec* b = find(tp, "layers.1.self_attention.query_key_value.bias");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->shape, (std::vector<std::int64_t>{cfg.local_qkv_rows(2)}));
}

struct QkvRun {
  ModelConfig cfg;
  testing::TinyParams tiny;
  GptParams p = tiny.views();
  GptGrads g = tiny.grad_views();
  ModelRuntime rt;
  GptActivations a;
  const core::ExecContext ctx;
  std::vector<std::int32_t> tokens, labels;
  static constexpr std::int64_t B = 2, T = 8;

  explicit QkvRun(bool qkv_bias) : cfg(qwen2_config(qkv_bias)), tiny(cfg, 5) {
    make_activations(cfg, rt.shard, B, T, a);
    tokens = testing::random_ids(1, B * T, cfg.vocab_size);
    labels = testing::random_ids(2, B * T, cfg.vocab_size);
  }
  double loss(bool backward) {
    gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, a);
    const LossSum l = gpt_loss(ctx, cfg, rt, p, g, labels.data(), 1.0f / (B * T),
                               backward ? LossGrad::kCompute : LossGrad::kNone, a);
    if (backward) gpt_backward(ctx, cfg, rt, p, g, tokens.data(), a);
    return l.sum / static_cast<double>(l.count);
  }
  std::vector<float> logits() const {
    return {a.logits, a.logits + B * T * cfg.padded_vocab_size()};
  }
};

TEST(QkvBias, ZeroBiasIsTheBiasFreeModelAndTheGradientIsRight) {
  QkvRun with(true), without(false);
  // The same weights by name; the bias zero (its init).
  for (const ParamSpec& s : without.tiny.table.params) {
    const ParamSpec* w = find(with.tiny.table, s.name);
    ASSERT_NE(w, nullptr) << s.name;
    std::copy_n(without.tiny.params.begin() + s.offset, s.numel,
                with.tiny.params.begin() + w->offset);
  }
  const double l0 = without.loss(false), l1 = with.loss(false);
  EXPECT_EQ(l0, l1);
  EXPECT_EQ(without.logits(), with.logits());
  // A bias that matters: the loss moves, and its gradient is the finite difference's.
  const ParamSpec* b = find(with.tiny.table, "layers.0.self_attention.query_key_value.bias");
  ASSERT_NE(b, nullptr);
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 0.5f);
  for (std::int64_t i = 0; i < b->numel; ++i) with.tiny.params[b->offset + i] = n(rng);
  const double moved = with.loss(true);
  EXPECT_GT(std::abs(moved - l0), 1e-4);
  int bad = 0;
  // Query, key and value rows of both groups (rows (G, hpg + 2, HS)).
  for (std::int64_t row : {0L, 9L, 17L, 25L, 34L, 42L, 63L}) {
    float& w = with.tiny.params[static_cast<std::size_t>(b->offset + row)];
    const float saved = w, eps = 2e-3f;
    w = saved + eps;
    const double up = with.loss(false);
    w = saved - eps;
    const double down = with.loss(false);
    w = saved;
    const double fd = (up - down) / (2.0 * static_cast<double>(eps));
    const double got = with.tiny.grads[static_cast<std::size_t>(b->offset + row)];
    if (std::abs(got - fd) > 2e-4 + 2e-2 * std::abs(fd)) {
      ++bad;
      ADD_FAILURE() << "bias row " << row << ": gradient " << got << ", finite difference " << fd;
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace trident::model
