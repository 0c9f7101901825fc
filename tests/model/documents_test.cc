// Documents inside samples (--reset-position-ids / --reset-attention-mask): the per-token
// positions and document ids are derived by the kernel op (kernels/document_ids.h) into space of
// the activation arena, which the size table counts, so a warm forward allocates nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tiny_model.h"
#include "trident/core/arena.h"
#include "trident/kernels/document_ids.h"
#include "trident/model/gpt.h"

namespace trident::model {
namespace {

ModelConfig documents_config(bool documents) {
  ModelConfig cfg = testing::tiny_config(/*seq_length=*/16, /*vocab_size=*/50);
  cfg.reset_position_ids = cfg.reset_attention_mask = documents;
  cfg.eod_token = 3;
  return cfg;
}

bool inside(const core::Arena& arena, const void* p, std::int64_t bytes) {
  const auto* base = static_cast<const std::byte*>(arena.base());
  const auto* q = static_cast<const std::byte*>(p);
  return q >= base && q + bytes <= base + arena.capacity();
}

TEST(Documents, IdsLiveInTheActivationArenaAndFollowTheTokens) {
  const ModelConfig cfg = documents_config(true);
  const std::int64_t B = 3, T = cfg.seq_length, BT = B * T;
  const ModelShard shard;
  // The size table counts two int32 slots per token (in float-sized slots, each padded as the
  // arena pads): the plan (plan/memory.cc reads activation_bytes) sees them.
  EXPECT_EQ(
      activation_bytes(cfg, shard, B, T) - activation_bytes(documents_config(false), shard, B, T),
      2 * core::Arena::footprint(core::DType::kF32, {BT}));
  const testing::TinyParams model(cfg, 5);
  const GptParams p = model.views();
  GptActivations acts;
  make_activations(cfg, shard, B, T, acts);
  ASSERT_NE(acts.positions, nullptr);
  ASSERT_NE(acts.docs, nullptr);
  EXPECT_TRUE(inside(acts.arena, acts.positions, BT * 4));
  EXPECT_TRUE(inside(acts.arena, acts.docs, BT * 4));
  const std::int64_t used = acts.arena.used();
  EXPECT_EQ(used, acts.arena.capacity());
  std::mt19937 rng(11);
  ModelRuntime rt;
  const core::ExecContext ctx;
  for (int step = 0; step < 2; ++step) {                  // a warm forward reuses the same slots
    const auto tokens = testing::random_ids(rng, BT, 8);  // eod 3: many documents
    const std::int32_t* positions = acts.positions;
    gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, acts);
    EXPECT_EQ(acts.positions, positions);
    EXPECT_EQ(acts.arena.used(), used);
    std::vector<std::int32_t> want_pos(tokens.size()), want_docs(tokens.size());
    kernels::ref::document_ids({.positions = want_pos.data(),
                                .docs = want_docs.data(),
                                .tokens = tokens.data(),
                                .batch = B,
                                .seq_len = T,
                                .eod_token = cfg.eod_token});
    EXPECT_EQ(std::vector<std::int32_t>(acts.positions, acts.positions + BT), want_pos);
    EXPECT_EQ(std::vector<std::int32_t>(acts.docs, acts.docs + BT), want_docs);
  }
  GptActivations plain;
  make_activations(documents_config(false), shard, B, T, plain);
  EXPECT_EQ(plain.positions, nullptr);
  EXPECT_EQ(plain.docs, nullptr);
}

}  // namespace
}  // namespace trident::model
