// Activation recomputation changes memory, never numbers: full (uniform and block) and selective
// recomputation give bitwise the same loss and gradients as storing everything, with the unfused
// and the fused attention and with dropout on; the activation arena shrinks as expected.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "trident/model/gpt.h"
#include "trident/model/param_table.h"

namespace trident::model {
namespace {

struct RunResult {
  double loss = 0;
  std::vector<float> grads;
  std::int64_t activation_bytes = 0;
};

RunResult run(ModelConfig cfg, Recompute r, bool block, std::int64_t n) {
  cfg.recompute = r;
  cfg.recompute_block = block;
  cfg.recompute_num_layers = n;
  const ParamTable table = build_gpt_param_table(cfg);
  std::vector<float> params(static_cast<std::size_t>(table.total_numel));
  RunResult out;
  out.grads.assign(params.size(), 0.0f);
  init_params(cfg, table, 3, params.data());
  ModelRuntime rt;
  rt.dropout_seed = 99;
  const GptParams p = gpt_param_views(cfg, table, params.data());
  const GptGrads g = gpt_grad_views(cfg, table, out.grads.data());
  GptActivations acts;
  const std::int64_t B = 2, T = cfg.seq_length;
  make_activations(cfg, rt.shard, B, T, acts);
  out.activation_bytes = acts.arena.capacity();
  std::mt19937 rng(4);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T)), labels(tokens.size());
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % cfg.vocab_size);
  for (auto& t : labels) t = static_cast<std::int32_t>(rng() % cfg.vocab_size);
  const core::ExecContext ctx;
  gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data(), .first_sample = 40, .iteration = 7}, acts);
  const LossSum l = gpt_loss(ctx, cfg, rt, labels.data(), 1.0f / static_cast<float>(B * T),
                             LossGrad::kCompute, acts);
  out.loss = l.sum / static_cast<double>(l.count);
  gpt_backward(ctx, cfg, rt, p, g, tokens.data(), acts);
  return out;
}

class Recomputation : public ::testing::TestWithParam<std::tuple<bool, float>> {};

TEST_P(Recomputation, IsBitwiseIdenticalAndSavesMemory) {
  ModelConfig cfg;
  cfg.num_layers = 3;
  cfg.hidden_size = 32;
  cfg.num_attention_heads = 4;
  cfg.seq_length = 16;
  cfg.vocab_size = 200;
  cfg.use_flash_attention = std::get<0>(GetParam());
  cfg.hidden_dropout = cfg.attention_dropout = std::get<1>(GetParam());
  const RunResult base = run(cfg, Recompute::kNone, false, 1);
  const RunResult selective = run(cfg, Recompute::kSelective, false, 1);
  const RunResult full = run(cfg, Recompute::kFull, false, 1);
  const RunResult block = run(cfg, Recompute::kFull, true, 2);
  for (const RunResult* r : {&selective, &full, &block}) {
    EXPECT_EQ(r->loss, base.loss);
    ASSERT_EQ(std::memcmp(r->grads.data(), base.grads.data(), base.grads.size() * sizeof(float)), 0)
        << "gradients differ";
  }
  EXPECT_LT(full.activation_bytes, block.activation_bytes);
  EXPECT_LT(block.activation_bytes, base.activation_bytes);
  if (!cfg.flash_attention()) {
    EXPECT_LT(selective.activation_bytes, base.activation_bytes);  // no (T x T) probabilities kept
  } else {
    EXPECT_EQ(selective.activation_bytes, base.activation_bytes);  // the fused kernel keeps none
  }
  std::printf("activation bytes: none %lld, selective %lld, full block(2 of 3) %lld, full %lld\n",
              static_cast<long long>(base.activation_bytes),
              static_cast<long long>(selective.activation_bytes),
              static_cast<long long>(block.activation_bytes),
              static_cast<long long>(full.activation_bytes));
}

INSTANTIATE_TEST_SUITE_P(Attention, Recomputation,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0.0f, 0.1f)));

}  // namespace
}  // namespace trident::model
