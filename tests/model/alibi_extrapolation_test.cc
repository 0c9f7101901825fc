// ALiBi extrapolates: a small BLOOM model trained at sequence length 16 on a periodic token stream
// evaluates at length 48 with about the training loss, while a model with learned positions cannot
// even run past its position table.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "trident/core/error.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"
#include "trident/optim/adamw_optimizer.h"

namespace trident::model {
namespace {

std::vector<std::int32_t> stream(std::int64_t n, std::int64_t offset) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>((i + offset) % 7 + 3 * ((i + offset) / 7 % 2));
  return v;
}

double loss_at(const ModelConfig& cfg, const GptParams& p, std::int64_t T) {
  GptActivations a;
  const ModelRuntime rt;
  make_activations(cfg, rt.shard, 1, T, a);
  const auto seq = stream(T + 1, 5);
  std::vector<std::int32_t> tokens(seq.begin(), seq.end() - 1), labels(seq.begin() + 1, seq.end());
  const core::ExecContext ctx;
  gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, a);
  const LossSum l = gpt_loss(ctx, cfg, rt, labels.data(), 0.0f, LossGrad::kNone, a);
  return l.sum / static_cast<double>(l.count);
}

TEST(Alibi, EvaluatesLongerThanTrained) {
  ModelConfig cfg;
  cfg.num_layers = 2;
  cfg.hidden_size = 32;
  cfg.num_attention_heads = 4;
  cfg.seq_length = 16;
  cfg.vocab_size = 20;
  cfg.position_embedding = PositionEmbedding::kAlibi;
  cfg.embed_layernorm = true;
  const ParamTable table = build_gpt_param_table(cfg);
  const std::int64_t n = table.total_numel;
  std::vector<float> p(static_cast<std::size_t>(n)), g(p.size()), m(p.size()), v(p.size());
  init_params(cfg, table, 1, p.data());
  const GptParams params = gpt_param_views(cfg, table, p.data());
  const GptGrads grads = gpt_grad_views(cfg, table, g.data());
  GptActivations a;
  const ModelRuntime rt;
  const std::int64_t B = 4, T = cfg.seq_length;
  make_activations(cfg, rt.shard, B, T, a);
  const core::ExecContext ctx;
  const optim::OptimizerConfig adam{
      .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.0f, .clip_grad = 1.0f};
  const double before = loss_at(cfg, params, 48);
  for (int step = 1; step <= 150; ++step) {
    std::vector<std::int32_t> tokens, labels;
    for (std::int64_t b = 0; b < B; ++b) {
      const auto seq = stream(T + 1, step * 3 + b);
      tokens.insert(tokens.end(), seq.begin(), seq.end() - 1);
      labels.insert(labels.end(), seq.begin() + 1, seq.end());
    }
    std::fill(g.begin(), g.end(), 0.0f);
    gpt_forward(ctx, cfg, rt, params, {.tokens = tokens.data()}, a);
    gpt_loss(ctx, cfg, rt, labels.data(), 1.0f / static_cast<float>(B * T), LossGrad::kCompute, a);
    gpt_backward(ctx, cfg, rt, params, grads, tokens.data(), a);
    optim::adamw_step(
        ctx, table, adam, 3e-3, step, 1.0f,
        {.range = {0, n}, .params = p.data(), .grads = g.data(), .m = m.data(), .v = v.data()});
  }
  const double at16 = loss_at(cfg, params, 16), at48 = loss_at(cfg, params, 48);
  std::printf("loss before training at 48: %.3f; after: at 16 %.3f, at 48 %.3f\n", before, at16,
              at48);
  EXPECT_LT(at16, 0.5 * before);
  EXPECT_LT(at48, 0.5 * before);  // learned, and it carries to 3x the length
  EXPECT_LT(at48, at16 * 1.5 + 0.05);

  // Learned absolute positions have no row for position 16 and beyond.
  ModelConfig learned = cfg;
  learned.position_embedding = PositionEmbedding::kLearnedAbsolute;
  learned.embed_layernorm = false;
  GptActivations b;
  EXPECT_THROW(
      {
        const ParamTable t2 = build_gpt_param_table(learned);
        std::vector<float> q(static_cast<std::size_t>(t2.total_numel));
        make_activations(learned, rt.shard, 1, 48, b);
        std::vector<std::int32_t> toks(48, 1);
        gpt_forward(ctx, learned, rt, gpt_param_views(learned, t2, q.data()),
                    {.tokens = toks.data()}, b);
      },
      core::Error);
}

}  // namespace
}  // namespace trident::model
