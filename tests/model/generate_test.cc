// Generation with the KV cache computes the same logits as the full forward over the prefix, for
// GPT (learned positions) and BLOOM (ALiBi, embedding LayerNorm); sampling rules.
#include "trident/model/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "trident/model/gpt.h"
#include "trident/model/param_table.h"

namespace trident::model {
namespace {

class KvCache : public ::testing::TestWithParam<bool> {};

TEST_P(KvCache, MatchesTheFullForward) {
  ModelConfig cfg;
  cfg.num_layers = 2;
  cfg.hidden_size = 32;
  cfg.num_attention_heads = 4;
  cfg.seq_length = 12;
  cfg.vocab_size = 100;
  cfg.init_method_std = 0.2f;
  if (GetParam()) {
    cfg.position_embedding = PositionEmbedding::kAlibi;
    cfg.embed_layernorm = true;
  }
  const ParamTable table = build_gpt_param_table(cfg);
  std::vector<float> flat(static_cast<std::size_t>(table.total_numel));
  init_params(cfg, table, 8, flat.data());
  const GptParams p = gpt_param_views(cfg, table, flat.data());
  std::mt19937 rng(2);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(cfg.seq_length));
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % cfg.vocab_size);
  const core::ExecContext ctx;
  GptActivations acts;
  const ModelRuntime rt;
  make_activations(cfg, rt.shard, 1, cfg.seq_length, acts);
  gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, acts);
  Generator gen(cfg, p);
  const std::int64_t Vp = cfg.padded_vocab_size();
  for (std::int64_t t = 0; t < cfg.seq_length; ++t) {
    const float* step = gen.step(ctx, tokens[static_cast<std::size_t>(t)]);
    double diff = 0, ref = 0;
    for (std::int64_t v = 0; v < cfg.vocab_size; ++v) {
      diff = std::max(diff, static_cast<double>(std::abs(step[v] - acts.logits[t * Vp + v])));
      ref = std::max(ref, static_cast<double>(std::abs(acts.logits[t * Vp + v])));
    }
    EXPECT_LE(diff / ref, 1e-5) << "position " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KvCache, ::testing::Bool());

TEST(Sampling, GreedyTopKAndSeeds) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  SamplingConfig greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(sample_token(logits.data(), 5, greedy, 0), 1);
  SamplingConfig top2;
  top2.top_k = 2;
  for (std::uint64_t d = 0; d < 200; ++d) {
    const std::int32_t t = sample_token(logits.data(), 5, top2, d);
    EXPECT_TRUE(t == 1 || t == 3);
  }
  SamplingConfig a, b;
  a.seed = b.seed = 42;
  EXPECT_EQ(sample_token(logits.data(), 5, a, 7), sample_token(logits.data(), 5, b, 7));
  SamplingConfig nucleus;
  nucleus.top_p = 0.01f;  // only the most likely token fits
  EXPECT_EQ(sample_token(logits.data(), 5, nucleus, 3), 1);
}

}  // namespace
}  // namespace trident::model
