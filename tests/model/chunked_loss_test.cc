// The chunked head (--loss-chunk-rows: the output layer, the cross-entropy and the output layer's
// backward fused, a chunk of token rows at a time) against the materialised head (every row's
// logits, then the loss, then the backward), in one process and with tensor parallelism (ranks
// as threads), with and without sequence parallelism, GPT-2 (tied output) and Llama (untied),
// for chunks of 1 row, a size that does not divide the rows, exactly the rows, and more.
// Two micro-batches accumulate. The loss and every gradient must agree to FP32 rounding (the
// output weight's gradient is summed chunk by chunk): max |chunked - full| / max |full| <= 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <utility>
#include <vector>

#include "tiny_model.h"
#include "trident/comm/thread_communicator.h"
#include "trident/model/gpt.h"

namespace trident::model {
namespace {

struct Result {
  double loss = 0;
  std::int64_t count = 0;
  std::vector<float> grads;
  std::int64_t arena_bytes = 0;
};

ModelConfig tiny(bool llama) {
  ModelConfig c = testing::tiny_config(/*seq_length=*/8, /*vocab_size=*/250);
  if (llama) {
    c.normalization = Normalization::kRmsNorm;
    c.position_embedding = PositionEmbedding::kRope;
    c.swiglu = true;
    c.num_query_groups = 2;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
  }
  c.ffn_hidden_size = 64;
  c.make_vocab_size_divisible_by = 128;
  c.init_method_std = 0.1f;
  return c;
}

Result run(const ModelConfig& cfg, const ModelShard& shard, comm::Communicator* tp) {
  const core::ExecContext ctx;
  testing::TinyParams model(cfg, 5, shard);
  Result r;
  ModelRuntime rt;
  rt.shard = shard;
  rt.tp = tp;
  const GptParams p = model.views();
  const GptGrads g = model.grad_views();
  GptActivations acts;
  const std::int64_t B = 2, T = cfg.seq_length;
  make_activations(cfg, shard, B, T, acts);
  r.arena_bytes = acts.arena.capacity();
  for (int micro = 0; micro < 2; ++micro) {
    const auto tokens = testing::random_ids(10 + micro, B * T, cfg.vocab_size);
    auto labels = testing::random_ids(20 + micro, B * T, cfg.vocab_size);
    labels[3] = -1;                                             // an ignored row
    labels[6] = static_cast<std::int32_t>(cfg.vocab_size - 1);  // the last real column
    gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, acts);
    const LossSum l = gpt_loss(ctx, cfg, rt, p, g, labels.data(), 0.25f, LossGrad::kCompute, acts);
    r.loss += l.sum;
    r.count += l.count;
    gpt_backward(ctx, cfg, rt, p, g, tokens.data(), acts);
  }
  r.grads = std::move(model.grads);
  return r;
}

// Every tp rank's result (one entry without tp).
std::vector<Result> run_layout(const ModelConfig& cfg, int tp, bool sp) {
  if (tp == 1) return {run(cfg, {}, nullptr)};
  std::mutex mu;
  std::vector<Result> out(static_cast<std::size_t>(tp));
  comm::run_on_threads(tp, [&](comm::Communicator& world) {
    ModelShard shard;
    shard.tp_size = tp;
    shard.tp_rank = world.rank();
    shard.sequence_parallel = sp;
    Result r = run(cfg, shard, &world);
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<std::size_t>(world.rank())] = std::move(r);
  });
  return out;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

// (tp, sequence parallel)
using Layout = std::pair<int, bool>;
class ChunkedLoss : public ::testing::TestWithParam<std::tuple<Layout, bool, int>> {};

TEST_P(ChunkedLoss, MatchesTheMaterialisedHead) {
  const auto [layout, llama, chunk] = GetParam();
  const auto [tp, sp] = layout;
  ModelConfig full = tiny(llama);
  ModelConfig chunked = full;
  chunked.loss_chunk_rows = chunk;
  const std::vector<Result> ref = run_layout(full, tp, sp);
  const std::vector<Result> got = run_layout(chunked, tp, sp);
  for (std::size_t rank = 0; rank < ref.size(); ++rank) {
    EXPECT_EQ(got[rank].count, ref[rank].count);
    EXPECT_NEAR(got[rank].loss, ref[rank].loss, 1e-6 * ref[rank].loss) << "tp rank " << rank;
    EXPECT_LE(rel_err(got[rank].grads, ref[rank].grads), 1e-5) << "tp rank " << rank;
    // Fewer rows of logits than the 16 of a micro-batch: the arena shrinks by their columns.
    if (chunk < 16) {
      EXPECT_LT(got[rank].arena_bytes, ref[rank].arena_bytes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ChunkedLoss,
                         ::testing::Combine(::testing::Values(Layout{1, false}, Layout{2, false},
                                                              Layout{2, true}),
                                            ::testing::Bool(), ::testing::Values(1, 5, 16, 64)));

TEST(ChunkedLoss, AutoChunkRowsFollowTheVocabulary) {
  ModelConfig c;
  c.vocab_size = 50257;  // GPT-2: padded 50304, 256 rows of 201 KiB each ~ 49 MiB
  EXPECT_EQ(c.auto_loss_chunk_rows(), 256);
  c.vocab_size = 250;  // tiny: the cap
  EXPECT_EQ(c.auto_loss_chunk_rows(), 4096);
  c.vocab_size = 256000;  // Gemma-sized: 64 rows of 1000 KiB
  EXPECT_EQ(c.auto_loss_chunk_rows(), 64);
  c.vocab_size = 2'000'000;  // the floor
  EXPECT_EQ(c.auto_loss_chunk_rows(), 16);
}

}  // namespace
}  // namespace trident::model
