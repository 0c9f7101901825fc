// Tensor parallelism inside one process: ranks as threads (ThreadCommunicator). For TP = 2 and 4,
// with and without sequence parallelism, for GPT-2 and for Llama (RMSNorm, rotary with Llama 3
// scaling, SwiGLU, grouped-query attention with the key/value groups split across ranks, or
// replicated when there are fewer groups than ranks (2 groups on 4 ranks, multi-query attention on
// 2 and 4), untied output layer, no biases),
// each rank's initial weights are exactly its slice of the TP = 1 weights, and the loss, every
// gradient (gathered by global index) and the global gradient norm equal the single-rank ones.
// Tolerance: FP32 with different summation orders, max |tp - ref| / max |ref| <= 2e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "trident/comm/thread_communicator.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"
#include "trident/optim/adamw_optimizer.h"

namespace trident::model {
namespace {

struct Result {
  double loss = 0;
  double norm_sq = 0;
  std::vector<float> params, grads;  // flat, of the table used
};

// groups: Llama's key/value groups (0: GPT-2; -1: Llama with 4 experts in every layer, top-2,
// each expert's F split over the tp ranks, the router replicated).
ModelConfig tiny(int tp, int groups = 0) {
  const bool moe = groups < 0;
  const bool llama = groups != 0;
  ModelConfig c;
  if (llama) {
    c.normalization = Normalization::kRmsNorm;
    c.position_embedding = PositionEmbedding::kRope;
    c.rope_scaling = true;
    c.rope_original_max_positions = 4;  // so that the scaling changes the low frequencies
    c.rope_scaling_factor = 4.0f;
    c.swiglu = true;
    c.num_query_groups = moe ? 0 : groups;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
  }
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = llama ? 8 : 4;  // Llama: 8 query heads in `groups` groups
  c.ffn_hidden_size = 64;
  c.seq_length = 8;
  c.vocab_size = 250;
  c.make_vocab_size_divisible_by = 128 * 4 / tp;  // the same padded vocabulary (512) for any tp
  c.init_method_std = 0.1f;
  if (moe) {
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.moe_ffn_hidden_size = 32;
    c.moe_aux_loss_coeff = 0.01;
    c.moe_z_loss_coeff = 0.001;
  }
  return c;
}

std::vector<std::int32_t> batch_ids(std::uint32_t seed, std::int64_t n, std::int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& t : v) t = static_cast<std::int32_t>(rng() % vocab);
  return v;
}

Result run_shard(const ModelConfig& cfg, const ModelShard& shard, comm::Communicator* tp) {
  const core::ExecContext ctx;
  const ParamTable table = build_gpt_param_table(cfg, shard);
  Result r;
  r.params.assign(static_cast<std::size_t>(table.total_numel), 0.0f);
  r.grads.assign(r.params.size(), 0.0f);
  init_params(cfg, table, 11, r.params.data(), shard.tp_rank);
  ModelRuntime rt;
  rt.shard = shard;
  rt.tp = tp;
  const GptParams p = gpt_param_views(cfg, table, r.params.data());
  const GptGrads g = gpt_grad_views(cfg, table, r.grads.data());
  GptActivations acts;
  const std::int64_t B = 2, T = cfg.seq_length;
  make_activations(cfg, shard, B, T, acts);
  const auto tokens = batch_ids(1, B * T, cfg.vocab_size);
  auto labels = batch_ids(2, B * T, cfg.vocab_size);
  labels[3] = -1;                                             // an ignored position
  labels[5] = static_cast<std::int32_t>(cfg.vocab_size - 1);  // the last real column
  for (int micro = 0; micro < 2; ++micro) {                   // two micro-batches accumulate
    gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, acts);
    const LossSum l = gpt_loss(ctx, cfg, rt, labels.data(), 0.5f / static_cast<float>(B * T),
                               LossGrad::kCompute, acts);
    r.loss += 0.5 * l.sum / static_cast<double>(l.count);
    gpt_backward(ctx, cfg, rt, p, g, tokens.data(), acts);
  }
  // Under sequence parallelism the LayerNorm gradients are per-rank partial sums (the trainer's
  // DistributedOptimizer sums them over tp).
  for (const ParamSpec& ps : table.params) {
    if (ps.sequence_parallel) {
      tp->all_reduce(r.grads.data() + ps.offset, ps.numel, comm::Datatype::kF32,
                     comm::ReduceOp::kSum);
    }
  }
  // Replicated key/value heads: each copy's gradient covers this rank's query heads only (the
  // GradFinalizer sums them over the ranks sharing the copy).
  for (const ParamSpec& ps : table.params) {
    if (ps.tp_replicas <= 1) continue;
    const auto sub = tp->split(shard.tp_rank / ps.tp_replicas, shard.tp_rank, "replicas");
    const std::int64_t rb = ps.replicated_begin();
    sub->all_reduce(r.grads.data() + ps.offset + rb, ps.numel - rb, comm::Datatype::kF32,
                    comm::ReduceOp::kSum);
  }
  r.norm_sq = optim::grad_norm_squared_share(ctx, table, {0, table.total_numel}, r.grads.data(),
                                             shard.tp_rank);
  if (tp && tp->size() > 1) tp->all_reduce(std::span<double>(&r.norm_sq, 1), comm::ReduceOp::kSum);
  return r;
}

double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return ref > 0 ? diff / ref : diff;
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<int, bool, int>> {};

TEST_P(TensorParallel, MatchesOneRank) {
  const int tp = std::get<0>(GetParam());
  const bool sp = std::get<1>(GetParam());
  const int groups = std::get<2>(GetParam());
  const ModelConfig cfg = tiny(tp, groups);
  const ModelConfig ref_cfg = tiny(1, groups);  // same architecture and padded vocabulary, 1 rank
  ASSERT_EQ(cfg.padded_vocab_size(tp), ref_cfg.padded_vocab_size(1));
  const ParamTable ref_table = build_gpt_param_table(ref_cfg);
  const Result ref = run_shard(ref_cfg, {}, nullptr);

  std::mutex mu;
  std::vector<Result> results(static_cast<std::size_t>(tp));
  comm::run_on_threads(tp, [&](comm::Communicator& world) {
    ModelShard shard;
    shard.tp_size = tp;
    shard.tp_rank = world.rank();
    shard.sequence_parallel = sp;
    Result r = run_shard(cfg, shard, &world);
    std::lock_guard<std::mutex> lock(mu);
    results[static_cast<std::size_t>(world.rank())] = std::move(r);
  });

  for (int rank = 0; rank < tp; ++rank) {
    const Result& r = results[static_cast<std::size_t>(rank)];
    EXPECT_NEAR(r.loss, ref.loss, 2e-6 * ref.loss) << "tp rank " << rank;
    EXPECT_NEAR(r.norm_sq, ref.norm_sq, 4e-5 * ref.norm_sq) << "tp rank " << rank;
    ModelShard shard;
    shard.tp_size = tp;
    shard.tp_rank = rank;
    const ParamTable table = build_gpt_param_table(cfg, shard);
    for (const ParamSpec& p : table.params) {
      const ParamSpec& q = ref_table.find(p.name);
      std::vector<double> mine, theirs, mine_g, theirs_g;
      for (std::int64_t i = 0; i < p.numel; ++i) {
        const std::int64_t gi = p.global_index(i, rank);
        mine.push_back(r.params[static_cast<std::size_t>(p.offset + i)]);
        theirs.push_back(ref.params[static_cast<std::size_t>(q.offset + gi)]);
        mine_g.push_back(r.grads[static_cast<std::size_t>(p.offset + i)]);
        theirs_g.push_back(ref.grads[static_cast<std::size_t>(q.offset + gi)]);
      }
      ASSERT_EQ(mine, theirs) << p.name << " init differs on tp rank " << rank;
      EXPECT_LE(rel_err(mine_g, theirs_g), 2e-5) << "grad " << p.name << " tp rank " << rank;
    }
  }
}

// GPT-2 (0) and Llama with 4 groups (split) or 1 (replicated) on 2 and 4 ranks, and 2 groups
// on 4 ranks (each group's key/value heads on 2 ranks) with sequence parallelism.
INSTANTIATE_TEST_SUITE_P(Sizes, TensorParallel,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool(),
                                            ::testing::Values(0, 4, 1)));
INSTANTIATE_TEST_SUITE_P(ReplicatedGroups, TensorParallel,
                         ::testing::Values(std::tuple{4, true, 2}, std::tuple{4, false, 2}));
INSTANTIATE_TEST_SUITE_P(MixtureOfExperts, TensorParallel,
                         ::testing::Values(std::tuple{2, false, -1}, std::tuple{2, true, -1},
                                           std::tuple{4, true, -1}));

// Replicated key/value heads: every query row of the fused QKV weight is on exactly one rank,
// every key/value row on the tp / G ranks sharing its group, and local_index inverts
// global_index (-1 on the ranks that do not hold an element).
TEST(TensorParallelLayout, ReplicatedKeyValueIndices) {
  for (const auto& [tp, groups] : {std::pair{4, 2}, std::pair{2, 1}, std::pair{4, 1}}) {
    const ModelConfig cfg = tiny(tp, groups);
    const ParamTable whole_table = build_gpt_param_table(tiny(1, groups));
    const ParamSpec& whole = whole_table.find("layers.0.self_attention.query_key_value.weight");
    std::vector<int> holders(static_cast<std::size_t>(whole.numel), 0);
    for (int rank = 0; rank < tp; ++rank) {
      ModelShard shard;
      shard.tp_size = tp;
      shard.tp_rank = rank;
      const ParamTable table = build_gpt_param_table(cfg, shard);
      const ParamSpec& p = table.find("layers.0.self_attention.query_key_value.weight");
      ASSERT_EQ(p.tp_replicas, tp / groups);
      ASSERT_EQ(p.shape[0], cfg.local_qkv_rows(tp));
      for (std::int64_t i = 0; i < p.numel; ++i) {
        const std::int64_t g = p.global_index(i, rank);
        ASSERT_TRUE(g >= 0 && g < whole.numel);
        ASSERT_EQ(p.local_index(g, rank), i);
        ++holders[static_cast<std::size_t>(g)];
      }
      for (std::int64_t g = 0; g < whole.numel; ++g) {
        const std::int64_t i = p.local_index(g, rank);
        ASSERT_TRUE(i == -1 || p.global_index(i, rank) == g) << g;
      }
    }
    const std::int64_t C = cfg.hidden_size, HS = cfg.head_dim(), block = (8 / groups + 2) * HS;
    for (std::int64_t g = 0; g < whole.numel; ++g) {
      const bool kv = g / C % block >= 8 / groups * HS;
      ASSERT_EQ(holders[static_cast<std::size_t>(g)], kv ? tp / groups : 1)
          << "tp " << tp << " groups " << groups << " element " << g;
    }
  }
}

TEST(TensorParallelLayout, HeadsAndFfnMustDivide) {
  ModelConfig cfg = tiny(4);
  cfg.num_attention_heads = 2;
  cfg.hidden_size = 32;
  ModelShard shard;
  shard.tp_size = 4;
  EXPECT_THROW(build_gpt_param_table(cfg, shard), core::InvalidArgument);
  cfg = tiny(4);
  cfg.ffn_hidden_size = 66;
  EXPECT_THROW(build_gpt_param_table(cfg, shard), core::InvalidArgument);
  // Key/value groups are split across ranks or replicated on tp / G ranks: 6 groups on 4 ranks
  // (neither divides the other) are refused.
  cfg = tiny(4, 6);
  cfg.num_attention_heads = 12;
  cfg.hidden_size = 48;
  try {
    build_gpt_param_table(cfg, shard);
    ADD_FAILURE() << "6 query groups on 4 tensor-parallel ranks were accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--num-query-groups"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident::model

namespace trident::model {
namespace {

// The vocab-parallel cross-entropy against the full-vocabulary kernel: targets in every tp rank's
// slice, in the last real column, ignored targets, and padding columns holding huge logits (which
// must never take probability).
TEST(VocabParallelCrossEntropy, MatchesTheFullVocabulary) {
  for (int tp : {2, 4}) {
    ModelConfig cfg;
    cfg.num_layers = 1;
    cfg.hidden_size = 8;
    cfg.num_attention_heads = 2;
    cfg.seq_length = 6;
    cfg.vocab_size = 500;  // padded to 512: slices of 512 / tp, padding 500..511 in the last
    cfg.make_vocab_size_divisible_by = 512 / tp;
    const std::int64_t Vp = cfg.padded_vocab_size(tp), rows = 2 * cfg.seq_length;
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(static_cast<std::size_t>(rows * Vp));
    for (auto& x : logits) x = normal(rng);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t v = cfg.vocab_size; v < Vp; ++v)
        logits[static_cast<std::size_t>(r * Vp + v)] = 1e4f;
    std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      targets[static_cast<std::size_t>(r)] =
          static_cast<std::int32_t>((r * Vp / rows + 7) % cfg.vocab_size);
    }
    targets[1] = static_cast<std::int32_t>(cfg.vocab_size - 1);
    targets[2] = -1;  // ignored
    // One rank, the full vocabulary.
    ModelShard head;
    head.has_embedding = false;
    head.num_layers = 0;
    head.first_layer = 1;
    GptActivations full;
    make_activations(cfg, head, 2, cfg.seq_length, full);
    std::copy(logits.begin(), logits.end(), full.logits);
    const core::ExecContext ctx;
    ModelRuntime one;
    one.shard = head;
    const LossSum ref = gpt_loss(ctx, cfg, one, targets.data(), 0.25f, LossGrad::kCompute, full);
    EXPECT_TRUE(std::isfinite(ref.sum));
    std::mutex mu;
    comm::run_on_threads(tp, [&](comm::Communicator& world) {
      ModelShard shard = head;
      shard.tp_size = tp;
      shard.tp_rank = world.rank();
      GptActivations a;
      make_activations(cfg, shard, 2, cfg.seq_length, a);
      const std::int64_t Vl = Vp / tp;
      for (std::int64_t r = 0; r < rows; ++r) {
        std::copy_n(logits.begin() + r * Vp + world.rank() * Vl, Vl, a.logits + r * Vl);
      }
      ModelRuntime rt;
      rt.shard = shard;
      rt.tp = &world;
      const LossSum got = gpt_loss(ctx, cfg, rt, targets.data(), 0.25f, LossGrad::kCompute, a);
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_NEAR(got.sum, ref.sum, 1e-5 * std::abs(ref.sum)) << "tp " << tp;
      EXPECT_EQ(got.count, ref.count);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t j = 0; j < Vl; ++j) {
          const float want = full.logits[r * Vp + world.rank() * Vl + j];
          ASSERT_NEAR(a.logits[r * Vl + j], want, 1e-6f)
              << "d_logits row " << r << " col " << world.rank() * Vl + j;
        }
      }
    });
  }
}

}  // namespace
}  // namespace trident::model
