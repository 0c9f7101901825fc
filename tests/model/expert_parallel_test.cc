// Expert parallelism inside one process: ranks as threads. EP ranks are data-parallel ranks that
// split the experts: each routes its own micro-batches and sends the permuted rows to the ranks
// holding their experts (all-to-all over the ep group). Against one rank that runs every rank's
// micro-batches in turn:
//   - each rank's initial expert weights are exactly its block of the one-rank experts;
//   - the losses summed over the ranks equal the one-rank sum;
//   - the expert gradients a rank holds (every rank's tokens for its experts) equal its block of
//     the one-rank gradients without any reduction; the other gradients, summed over the ranks (the
//     data-parallel all-reduce), equal the one-rank ones.
// For EP 2 and 4, EP 2 x TP 2 with sequence parallelism, and with capacity drops and padding.
// Tolerance: FP32 with different summation orders, max |ep - ref| / max |ref| <= 2e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "trident/comm/thread_communicator.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"
#include "trident/parallel/parallel_context.h"

namespace trident::model {
namespace {

struct Variant {
  const char* name;
  int ep = 2, tp = 1;
  bool sp = false;
  double capacity = 0.0;  // --moe-expert-capacity-factor
  bool pad = false;
  bool seq_aux = false;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

ModelConfig tiny(const Variant& v) {
  ModelConfig c;
  c.normalization = Normalization::kRmsNorm;
  c.position_embedding = PositionEmbedding::kRope;
  c.swiglu = true;
  c.untie_embeddings_and_output_weights = true;
  c.add_bias_linear = false;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 64;
  c.seq_length = 8;
  c.vocab_size = 250;
  c.make_vocab_size_divisible_by = 128 * 4 / v.tp;  // the same padded vocabulary for any tp
  c.init_method_std = 0.1f;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 32;
  c.moe_aux_loss_coeff = 0.01;
  c.moe_z_loss_coeff = 0.001;
  c.moe_expert_capacity_factor = v.capacity;
  c.moe_pad_expert_input_to_capacity = v.pad;
  if (v.seq_aux) c.moe_router_load_balancing_type = MoeLoadBalancing::kSeqAuxLoss;
  return c;
}

std::vector<std::int32_t> batch_ids(std::uint32_t seed, std::int64_t n, std::int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& t : v) t = static_cast<std::int32_t>(rng() % vocab);
  return v;
}

struct Result {
  double loss = 0;
  std::int64_t dropped = 0;
  std::vector<float> params, grads;
};

constexpr std::int64_t kBatch = 2;

// Runs data-parallel rank `dp_rank`'s two micro-batches (all of ranks 0 .. dp_ranks - 1's when
// `one_rank`), accumulating gradients.
Result run(const ModelConfig& cfg, const ModelShard& shard, comm::Communicator* tp,
           comm::Communicator* ep, int dp_rank, int dp_ranks, bool one_rank) {
  const core::ExecContext ctx;
  const ParamTable table = build_gpt_param_table(cfg, shard);
  Result r;
  r.params.assign(static_cast<std::size_t>(table.total_numel), 0.0f);
  r.grads.assign(r.params.size(), 0.0f);
  init_params(cfg, table, 11, r.params.data(), shard.tp_rank);
  ModelRuntime rt;
  rt.shard = shard;
  rt.tp = tp;
  rt.ep = ep;
  rt.ep_host = ep;
  const GptParams p = gpt_param_views(cfg, table, r.params.data());
  const GptGrads g = gpt_grad_views(cfg, table, r.grads.data());
  GptActivations acts;
  const std::int64_t T = cfg.seq_length;
  make_activations(cfg, shard, kBatch, T, acts);
  for (int d = one_rank ? 0 : dp_rank; d < (one_rank ? dp_ranks : dp_rank + 1); ++d) {
    for (int micro = 0; micro < 2; ++micro) {
      const auto seed = static_cast<std::uint32_t>(10 * d + 2 * micro);
      const auto tokens = batch_ids(seed + 1, kBatch * T, cfg.vocab_size);
      const auto labels = batch_ids(seed + 2, kBatch * T, cfg.vocab_size);
      gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, acts);
      const LossSum l = gpt_loss(ctx, cfg, rt, labels.data(), 1.0f / static_cast<float>(kBatch * T),
                                 LossGrad::kCompute, acts);
      r.loss += l.sum / static_cast<double>(l.count);
      for (const layers::MoeStats& st : acts.moe_stats) r.dropped += st.dropped;
      gpt_backward(ctx, cfg, rt, p, g, tokens.data(), acts);
    }
  }
  // Sequence-parallel norms: per-rank partial sums (the optimizer sums them over tp).
  for (const ParamSpec& ps : table.params) {
    if (ps.sequence_parallel) {
      tp->all_reduce(r.grads.data() + ps.offset, ps.numel, comm::Datatype::kF32,
                     comm::ReduceOp::kSum);
    }
  }
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

class ExpertParallel : public ::testing::TestWithParam<Variant> {};

TEST_P(ExpertParallel, MatchesOneRankRunningEveryRanksBatches) {
  const Variant v = GetParam();
  const ModelConfig cfg = tiny(v);
  Variant one = v;
  one.tp = 1;
  const ModelConfig ref_cfg = tiny(one);
  ASSERT_EQ(cfg.padded_vocab_size(v.tp), ref_cfg.padded_vocab_size(1));
  const ParamTable ref_table = build_gpt_param_table(ref_cfg);
  const Result ref = run(ref_cfg, {}, nullptr, nullptr, 0, v.ep, true);

  const parallel::ParallelLayout layout{
      .tp_size = v.tp, .dp_size = v.ep, .pp_size = 1, .ep_size = v.ep};
  std::mutex mu;
  std::vector<Result> results(static_cast<std::size_t>(layout.world_size()));
  std::vector<ModelShard> shards(results.size());
  double loss_sum = 0;
  std::int64_t dropped = 0;
  comm::run_on_threads(layout.world_size(), [&](comm::Communicator& world) {
    const parallel::ParallelContext par(world, layout);
    ModelShard shard;
    shard.tp_size = v.tp;
    shard.tp_rank = par.coord().tp;
    shard.sequence_parallel = v.sp;
    shard.ep_size = v.ep;
    shard.ep_rank = layout.ep_rank(par.coord());
    Result r = run(cfg, shard, &par.tp(), &par.ep(), par.coord().dp, v.ep, false);
    // The data-parallel all-reduce of everything but the experts (whose gradients are complete:
    // every rank's tokens for this rank's experts).
    const ParamTable table = build_gpt_param_table(cfg, shard);
    for (const ParamSpec& ps : table.params) {
      if (ps.expert) continue;
      par.dp().all_reduce(r.grads.data() + ps.offset, ps.numel, comm::Datatype::kF32,
                          comm::ReduceOp::kSum);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (par.coord().tp == 0) {
      loss_sum += r.loss;
      dropped += r.dropped;
    }
    shards[static_cast<std::size_t>(world.rank())] = shard;
    results[static_cast<std::size_t>(world.rank())] = std::move(r);
  });

  EXPECT_NEAR(loss_sum, ref.loss, 2e-6 * ref.loss);
  EXPECT_EQ(dropped, ref.dropped);  // every layout routes and drops alike
  if (v.capacity > 0 && !v.pad) EXPECT_GT(ref.dropped, 0) << "the capacity drops nothing";
  for (std::size_t rank = 0; rank < results.size(); ++rank) {
    const Result& r = results[rank];
    const ModelShard& shard = shards[rank];
    const ParamTable table = build_gpt_param_table(cfg, shard);
    int experts_seen = 0;
    for (const ParamSpec& p : table.params) {
      const ParamSpec& q = ref_table.find(p.name);
      if (p.expert) {
        ++experts_seen;
        ASSERT_EQ(p.shape[0] * v.ep, q.shape[0]) << p.name;
      }
      std::vector<double> mine, theirs, mine_g, theirs_g;
      for (std::int64_t i = 0; i < p.numel; ++i) {
        const std::int64_t gi = p.global_index(i, shard.tp_rank);
        mine.push_back(r.params[static_cast<std::size_t>(p.offset + i)]);
        theirs.push_back(ref.params[static_cast<std::size_t>(q.offset + gi)]);
        mine_g.push_back(r.grads[static_cast<std::size_t>(p.offset + i)]);
        theirs_g.push_back(ref.grads[static_cast<std::size_t>(q.offset + gi)]);
      }
      ASSERT_EQ(mine, theirs) << p.name << " init differs on rank " << rank;
      EXPECT_LE(rel_err(mine_g, theirs_g), 2e-5) << "grad " << p.name << " rank " << rank;
    }
    EXPECT_EQ(experts_seen, 2 * cfg.num_layers);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ExpertParallel,
    ::testing::Values(Variant{.name = "ep2"}, Variant{.name = "ep4", .ep = 4},
                      Variant{.name = "ep2tp2sp", .ep = 2, .tp = 2, .sp = true},
                      Variant{.name = "ep2drops", .capacity = 1.0, .seq_aux = true},
                      Variant{.name = "ep2padded", .capacity = 1.5, .pad = true},
                      Variant{.name = "ep4tp2", .ep = 4, .tp = 2}),
    [](const auto& p) { return std::string(p.param.name); });

// The index maps: each expert element is held by exactly one ep rank (per tp slice), and
// local_index inverts global_index.
TEST(ExpertParallelLayout, EveryExpertElementOnExactlyOneRank) {
  const Variant v{.name = "ep2tp2", .ep = 2, .tp = 2};
  const ModelConfig cfg = tiny(v);
  const ParamTable whole_table = build_gpt_param_table(tiny(Variant{.name = "one", .tp = 1}));
  for (const char* name :
       {"layers.0.mlp.experts.dense_h_to_4h.weight", "layers.1.mlp.experts.dense_4h_to_h.weight"}) {
    const ParamSpec& whole = whole_table.find(name);
    std::vector<int> holders(static_cast<std::size_t>(whole.numel), 0);
    for (int ep = 0; ep < v.ep; ++ep) {
      for (int tp = 0; tp < v.tp; ++tp) {
        const ModelShard shard{.tp_size = v.tp, .tp_rank = tp, .ep_size = v.ep, .ep_rank = ep};
        const ParamTable table = build_gpt_param_table(cfg, shard);
        const ParamSpec& p = table.find(name);
        ASSERT_TRUE(p.expert);
        for (std::int64_t i = 0; i < p.numel; ++i) {
          const std::int64_t g = p.global_index(i, tp);
          ASSERT_TRUE(g >= 0 && g < whole.numel);
          ASSERT_EQ(p.local_index(g, tp), i);
          ++holders[static_cast<std::size_t>(g)];
        }
        for (std::int64_t g = 0; g < whole.numel; ++g) {
          const std::int64_t i = p.local_index(g, tp);
          ASSERT_TRUE(i == -1 || p.global_index(i, tp) == g) << g;
        }
      }
    }
    EXPECT_TRUE(std::all_of(holders.begin(), holders.end(), [](int h) { return h == 1; })) << name;
  }
  ModelConfig three = cfg;
  three.num_experts = 3;
  EXPECT_THROW(build_gpt_param_table(three, {.ep_size = 2, .ep_rank = 0}), core::InvalidArgument);
}

}  // namespace
}  // namespace trident::model
