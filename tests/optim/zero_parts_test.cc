// The optimizer's parts on thread worlds (comm::ThreadCommunicator), each against values computed
// here from first principles: the flat layout, buffer sizes by stage, gradient synchronisation per
// strategy (exact integer sums over ranks and micro-batches, and the overlap with backward), ZeRO-3
// gathering with prefetch, the distributed AdamW against the unsharded one (bitwise: AdamW is
// elementwise), and gradient finalisation (norm counted once, overflow on any rank, tied
// embeddings over pp, sequence-parallel LayerNorm sums over tp).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <tuple>
#include <vector>

#include "optim_test_util.h"
#include "trident/comm/self_communicator.h"
#include "trident/comm/thread_communicator.h"
#include "trident/core/bf16.h"
#include "trident/optim/distributed_optimizer.h"
#include "trident/optim/grad_finalize.h"
#include "trident/optim/grad_sync.h"
#include "trident/optim/model_state.h"
#include "trident/optim/param_buffers.h"
#include "trident/optim/zero3_gather.h"
#include "trident/parallel/parallel_context.h"

namespace trident::optim {
namespace {

using testing::grad_value;
using testing::OneChunk;
using testing::tiny_config;

const comm::WaitPolicy kWait{.timeout_s = 60.0};
const core::ExecContext kCtx;

parallel::ShardPlan plan_for(const FlatLayout& l, int dp) {
  return parallel::build_shard_plan(l.numel(), dp, kShardAlign);
}

// Ring bytes the counters charge for one collective over `elements` on dp ranks.
double ring_bytes(std::int64_t elements, int dp) {
  return static_cast<double>(dp - 1) / dp * static_cast<double>(elements) * 4.0;
}

TEST(FlatLayout, UnitsAndRestTileTheBufferAndPiecesFindParameters) {
  const model::ModelConfig cfg = tiny_config(4);
  // Two chunks, as an interleaved pipeline stage holds: layers 0-1 (with the embedding) and 2-3
  // (with the head).
  const model::ParamTable a = model::build_gpt_param_table(
      cfg, {.first_layer = 0, .num_layers = 2, .has_embedding = true, .has_head = false});
  const model::ParamTable b = model::build_gpt_param_table(
      cfg, {.first_layer = 2, .num_layers = 2, .has_embedding = false, .has_head = true});
  const FlatLayout l({{&a, 0, 0}, {&b, a.total_numel, 2}}, 0);
  EXPECT_EQ(l.numel(), a.total_numel + b.total_numel);
  ASSERT_EQ(l.units().size(), 4u);
  std::vector<Range> all = l.rest();
  for (const LayerUnit& u : l.units()) all.push_back(u.range);
  std::sort(all.begin(), all.end(),
            [](const Range& x, const Range& y) { return x.begin < y.begin; });
  std::int64_t at = 0;
  for (const Range& r : all) {
    EXPECT_EQ(r.begin, at);
    at = r.end;
  }
  EXPECT_EQ(at, l.numel());
  EXPECT_EQ(l.unit_of(1, 0), 2);
  EXPECT_EQ(l.unit_of(1, 2), -1);
  EXPECT_EQ(l.unit_of(0, -1), -1);
  std::int64_t rest = 0;
  for (const Range& r : l.rest()) rest += r.size();
  EXPECT_EQ(l.rest_numel(), rest);
  // The head's tied copy lives in chunk 1's rest.
  const Range wte = l.param_range(1, "embedding.word_embeddings.weight");
  EXPECT_GE(l.rest_index(wte.begin), 0);
  EXPECT_EQ(l.rest_index(l.units()[0].range.begin), -1);
  // Pieces of a range that straddles chunks: every parameter element exactly once, in order.
  const Range mid{l.units()[1].range.begin + 5, l.units()[2].range.end - 3};
  std::int64_t covered = 0, last_flat = -1;
  for (const ParamPiece& p : l.pieces(mid)) {
    EXPECT_GT(p.flat_begin, last_flat);
    EXPECT_GE(p.flat_begin, mid.begin);
    EXPECT_LE(p.flat_begin + (p.end - p.begin), mid.end);
    last_flat = p.flat_begin;
    covered += p.end - p.begin;
  }
  std::int64_t want = 0;
  for (const FlatLayout* lay : {&l}) {
    for (int c = 0; c < 2; ++c) {
      const LayoutChunk& ch = lay->chunks()[static_cast<std::size_t>(c)];
      for (const model::ParamSpec& p : ch.table->params) {
        want += std::max<std::int64_t>(0, std::min(mid.end, ch.base + p.offset + p.numel) -
                                              std::max(mid.begin, ch.base + p.offset));
      }
    }
  }
  EXPECT_EQ(covered, want);
  // Buckets: per chunk, consecutive layers, backward order within the chunk, covering the units.
  const std::vector<Range> buckets = l.layer_buckets(1);  // one layer per bucket
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0], l.units()[1].range);
  EXPECT_EQ(buckets[1], l.units()[0].range);
  EXPECT_EQ(buckets[2], l.units()[3].range);
  const std::vector<Range> big = l.layer_buckets(1 << 30);
  ASSERT_EQ(big.size(), 2u);
  EXPECT_EQ(big[0], (Range{l.units()[0].range.begin, l.units()[1].range.end}));
}

// What the model-state formulas say, from the sizes alone and as allocated.
TEST(ModelState, Stage3OnFourRanksKeepsAQuarterOfStage0) {
  // Layers dominate this model (hidden 128, vocabulary 100): staging is small next to the
  // states.
  model::ModelConfig cfg = tiny_config(8);
  cfg.hidden_size = 128;
  cfg.num_attention_heads = 4;
  OneChunk m(cfg);
  const MemoryReport s0 = model_state_memory(m.layout, 0, 4, false, 2);
  const MemoryReport s3 = model_state_memory(m.layout, 3, 4, false, 2);
  const double psi = static_cast<double>(m.layout.numel());
  EXPECT_EQ(s0.model_state_bytes(), static_cast<std::int64_t>(16 * psi));
  // Shard padding: at most dp * 16 elements per buffer.
  const double quarter = s0.model_state_bytes() / 4.0;
  EXPECT_NEAR(s3.model_state_bytes(), quarter, 4 * 4 * 16 * 4.0);
  EXPECT_EQ(s3.predicted_param_bytes + s3.predicted_grad_bytes + s3.predicted_optimizer_bytes,
            static_cast<std::int64_t>(16 * psi / 4));
  // Stages 1 and 2 in between.
  EXPECT_LT(model_state_memory(m.layout, 2, 4, false, 2).model_state_bytes(),
            model_state_memory(m.layout, 1, 4, false, 2).model_state_bytes());
  // As allocated on a thread world of four ranks.
  comm::run_on_threads(
      4,
      [&](comm::Communicator& world) {
        for (int stage : {0, 3}) {
          const ZeroPolicy policy = zero_policy(stage);
          const parallel::ShardPlan plan = plan_for(m.layout, 4);
          ParamGradBuffers b(m.layout, plan, policy, world.rank(), false);
          CommCounters cc;
          DistributedOptimizer adam(b, world, cc, {});
          const MemoryReport r = b.memory(2);
          const MemoryReport want = stage == 0 ? s0 : s3;
          EXPECT_EQ(r.param_bytes, want.param_bytes);
          EXPECT_EQ(r.grad_bytes, want.grad_bytes);
          EXPECT_EQ(adam.bytes(), want.optimizer_bytes);
          if (stage == 3) {
            EXPECT_EQ(b.full_params(), nullptr);  // no whole-model buffer on any rank
            EXPECT_EQ(b.full_grads(), nullptr);
          }
        }
      },
      kWait);
  EXPECT_THROW(zero_policy(4), core::InvalidArgument);
}

class GradSyncTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GradSyncTest, ReducesExactlyAndOverlapsWithBackward) {
  // Not structured bindings: the lambdas below capture them (clang 14, the sanitizer build).
  const int stage = std::get<0>(GetParam()), dp = std::get<1>(GetParam());
  OneChunk m(tiny_config(4));
  const int micro = 3;
  comm::run_on_threads(
      dp,
      [&](comm::Communicator& world) {
        const int rank = world.rank();
        const ZeroPolicy policy = zero_policy(stage);
        ParamGradBuffers b(m.layout, plan_for(m.layout, dp), policy, rank, false);
        CommCounters cc;
        // Buckets of about one layer, so that several launch during backward.
        auto sync = make_grad_sync(b, world, cc, m.layout.max_unit());
        sync->begin_iteration(kCtx);
        for (int mb = 0; mb < micro; ++mb) {
          const bool last = mb == micro - 1;
          sync->begin_backward(last);
          for (const Range& r : m.layout.rest()) {
            for (std::int64_t i = r.begin; i < r.end; ++i)
              *sync->rest_grad_at(i) += grad_value(rank, mb, i);
          }
          for (int u = static_cast<int>(m.layout.units().size()) - 1; u >= 0; --u) {
            const Range r = m.layout.units()[static_cast<std::size_t>(u)].range;
            float* g = sync->layer_grads(kCtx, u);
            for (std::int64_t i = r.begin; i < r.end; ++i)
              g[i - r.begin] += grad_value(rank, mb, i);
            const double before = cc.dp_bytes;
            sync->layer_done(kCtx, u);
            if (dp == 1) continue;
            if (policy.shards_gradients()) {
              EXPECT_DOUBLE_EQ(cc.dp_bytes - before, ring_bytes(r.size(), dp))
                  << "every micro-batch";
            } else if (!last) {
              EXPECT_EQ(cc.dp_bytes, before) << "no reduction before the last micro-batch";
            } else {
              // One bucket per layer: launched as soon as the layer is done, before backward
              // reaches the next one.
              EXPECT_DOUBLE_EQ(cc.dp_bytes - before,
                               (stage == 0 ? 2 : 1) * ring_bytes(r.size(), dp));
            }
          }
        }
        sync->finish_layers();
        sync->reduce_rest(kCtx);
        const HeldGrads held = sync->held();
        EXPECT_EQ(held.disjoint_over_dp, policy.shards_optimizer());
        const Range want_range = policy.shards_optimizer() ? b.shard() : Range{0, m.layout.numel()};
        EXPECT_EQ(held.grads.range, want_range);
        const std::int64_t end = std::min(held.grads.range.end, m.layout.numel());
        std::int64_t bad = 0;
        for (std::int64_t i = held.grads.range.begin; i < end; ++i) {
          float want = 0;
          for (int r = 0; r < dp; ++r) {
            for (int mb = 0; mb < micro; ++mb) want += grad_value(r, mb, i);
          }
          if (held.grads.data[i - held.grads.range.begin] != want && bad++ < 5) {
            ADD_FAILURE() << "rank " << rank << " element " << i << ": "
                          << held.grads.data[i - held.grads.range.begin] << " != " << want;
          }
        }
        EXPECT_EQ(bad, 0);
      },
      kWait);
}

INSTANTIATE_TEST_SUITE_P(StagesAndRanks, GradSyncTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& p) {
                           return "stage" + std::to_string(std::get<0>(p.param)) + "_dp" +
                                  std::to_string(std::get<1>(p.param));
                         });

// The value every rank's master shard holds at flat element i.
float weight_value(std::int64_t i) { return 0.25f * static_cast<float>(i % 1000) - 7.0f; }

class Zero3GatherTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Zero3GatherTest, GathersEachLayerOnceWithPrefetch) {
  const int dp = std::get<0>(GetParam());  // not bindings: captured below (clang 14)
  const bool bf16 = std::get<1>(GetParam());
  OneChunk m(tiny_config(4));
  comm::run_on_threads(
      dp,
      [&](comm::Communicator& world) {
        ParamGradBuffers b(m.layout, plan_for(m.layout, dp), zero_policy(3), world.rank(), bf16);
        const Range s = b.shard();
        for (std::int64_t i = s.begin; i < std::min(s.end, m.layout.numel()); ++i) {
          b.master()[i - s.begin] = weight_value(i);
        }
        CommCounters cc;
        Zero3ParamGatherer g(b, world, cc);
        g.begin_iteration(kCtx);
        std::int64_t c = 0;
        for (const Range& r : m.layout.rest()) {
          for (std::int64_t i = r.begin; i < r.end; ++i, ++c) {
            ASSERT_EQ(b.rest_params()[c], weight_value(i)) << i;
            if (bf16) {
              ASSERT_EQ(b.bf16_params()[c].bits, core::bf16::from_float(weight_value(i)).bits);
            }
          }
        }
        EXPECT_EQ(cc.dp_bytes, dp > 1 ? ring_bytes(m.layout.rest_numel(), dp) : 0.0);
        const int U = static_cast<int>(m.layout.units().size());
        const auto check = [&](int u, const StagedLayer& st) {
          const Range r = m.layout.units()[static_cast<std::size_t>(u)].range;
          for (std::int64_t i = r.begin; i < r.end; ++i) {
            ASSERT_EQ(st.params[i - r.begin], weight_value(i)) << "unit " << u << " element " << i;
            if (bf16) {
              ASSERT_EQ(st.params_bf16[i - r.begin].bits,
                        core::bf16::from_float(weight_value(i)).bits);
            } else {
              ASSERT_EQ(st.params_bf16, nullptr);
            }
          }
        };
        std::int64_t layers = 0;
        for (const LayerUnit& u : m.layout.units()) layers += u.range.size();
        // Forward: each layer gathered once (the next one prefetched while this one runs).
        for (int u = 0; u < U; ++u) check(u, g.acquire(kCtx, u, u % 2, u + 1 < U ? u + 1 : -1));
        const double after_forward = cc.dp_bytes;
        if (dp > 1) {
          EXPECT_DOUBLE_EQ(after_forward, ring_bytes(m.layout.rest_numel() + layers, dp));
        }
        // Backward: the last two layers of the forward are still in their slots; the others are
        // gathered once more each.
        for (int u = U - 1; u >= 0; --u) check(u, g.acquire(kCtx, u, u % 2, u - 1));
        const std::int64_t staged = m.layout.units()[static_cast<std::size_t>(U - 1)].range.size() +
                                    m.layout.units()[static_cast<std::size_t>(U - 2)].range.size();
        if (dp > 1) {
          EXPECT_DOUBLE_EQ(cc.dp_bytes - after_forward, ring_bytes(layers - staged, dp));
        }
        g.drain();
      },
      kWait);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Zero3GatherTest,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Bool()),
                         [](const auto& p) {
                           return "dp" + std::to_string(std::get<0>(p.param)) +
                                  (std::get<1>(p.param) ? "_bf16" : "_fp32");
                         });

// The sharded update at stages 1-3 on dp ranks gives bitwise the weights and state arrays of the
// unsharded one (stage 0, one rank), for each update rule: the rules are elementwise and the
// shards are ranges.
TEST(DistributedOptimizer, ShardedUpdateEqualsTheWholeOneBitwise) {
  const model::ModelConfig cfg = tiny_config(3);
  OneChunk m(cfg);
  const std::int64_t N = m.layout.numel();
  const auto grads_at = [](int step, std::int64_t i) {
    return 1e-3f * static_cast<float>((i * 37 + step * 11) % 17) - 8e-3f;
  };
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kLion}) {
    const OptimizerConfig opt_cfg{
        .kind = kind, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    SCOPED_TRACE(optimizer_name(kind));
    // Reference: one rank, stage 0.
    comm::SelfCommunicator self;
    ParamGradBuffers ref(m.layout, plan_for(m.layout, 1), zero_policy(0), 0, false);
    model::init_params(cfg, m.table, 5, ref.full_params());
    CommCounters rc;
    DistributedOptimizer ref_opt(ref, self, rc, opt_cfg);
    ASSERT_EQ(ref_opt.state().size(), kind == OptimizerKind::kAdamW ? 2u : 1u);
    std::vector<float> g(static_cast<std::size_t>(N));
    for (int step = 1; step <= 3; ++step) {
      for (std::int64_t i = 0; i < N; ++i) g[static_cast<std::size_t>(i)] = grads_at(step, i);
      ref_opt.step(kCtx, 1e-2, step, 0.5f, g.data());
    }
    for (int stage : {1, 2, 3}) {
      for (int dp : {2, 3}) {
        comm::run_on_threads(
            dp,
            [&](comm::Communicator& world) {
              ParamGradBuffers b(m.layout, plan_for(m.layout, dp), zero_policy(stage), world.rank(),
                                 false);
              const Range s = b.shard();
              const Range held{s.begin, std::min(s.end, N)};
              if (b.full_params() != nullptr) {
                model::init_params(cfg, m.table, 5, b.full_params());
              } else {
                model::init_params_range(cfg, m.table, 5, held.begin, held.end, b.master());
              }
              CommCounters cc;
              DistributedOptimizer opt(b, world, cc, opt_cfg);
              ASSERT_EQ(opt.updated_range(), s);
              std::vector<float> mine(static_cast<std::size_t>(s.size()), 0.0f);
              for (int step = 1; step <= 3; ++step) {
                for (std::int64_t i = held.begin; i < held.end; ++i) {
                  mine[static_cast<std::size_t>(i - s.begin)] = grads_at(step, i);
                }
                opt.step(kCtx, 1e-2, step, 0.5f, mine.data());
              }
              const float* w = stage < 3 ? b.full_params() : b.master() - s.begin;
              const Range check = stage < 3 ? Range{0, N} : held;  // 1-2: gathered whole
              for (std::int64_t i = check.begin; i < check.end; ++i) {
                ASSERT_EQ(std::bit_cast<std::uint32_t>(w[i]),
                          std::bit_cast<std::uint32_t>(ref.full_params()[i]))
                    << "stage " << stage << " dp " << dp << " element " << i;
              }
              const auto mine_state = opt.state(), ref_state = ref_opt.state();
              ASSERT_EQ(mine_state.size(), ref_state.size());
              for (std::size_t k = 0; k < mine_state.size(); ++k) {
                const FlatSpan<float> em = mine_state[k].span, rm = ref_state[k].span;
                EXPECT_STREQ(mine_state[k].name, ref_state[k].name);
                EXPECT_EQ(em.range, held);
                for (std::int64_t i = held.begin; i < held.end; ++i) {
                  ASSERT_EQ(em.data[i - held.begin], rm.data[i]) << mine_state[k].name << " " << i;
                }
              }
            },
            kWait);
      }
    }
  }
}

// A ZeRO-3 shard initialized alone equals the same range of the whole model's initialization.
TEST(InitRange, ShardEqualsTheSliceOfTheWholeInit) {
  const model::ModelConfig cfg = tiny_config(2);
  for (int tp_rank : {0, 1}) {
    const model::ParamTable t =
        model::build_gpt_param_table(cfg, {.tp_size = 2, .tp_rank = tp_rank});
    std::vector<float> whole(static_cast<std::size_t>(t.total_numel));
    model::init_params(cfg, t, 9, whole.data(), tp_rank);
    for (const Range r : {Range{0, t.total_numel}, Range{3, 700}, Range{17, 18},
                          Range{t.total_numel - 40, t.total_numel}, Range{5, 5}}) {
      std::vector<float> part(static_cast<std::size_t>(r.size()) + 1, 42.0f);
      model::init_params_range(cfg, t, 9, r.begin, r.end, part.data(), tp_rank);
      for (std::int64_t i = r.begin; i < r.end; ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(part[static_cast<std::size_t>(i - r.begin)]),
                  std::bit_cast<std::uint32_t>(whole[static_cast<std::size_t>(i)]))
            << "range [" << r.begin << ", " << r.end << ") element " << i;
      }
      EXPECT_EQ(part.back(), 42.0f) << "wrote past the range";
    }
    std::vector<float> out(8);
    EXPECT_THROW(model::init_params_range(cfg, t, 9, 5, t.total_numel + 1, out.data(), tp_rank),
                 core::InvalidArgument);
  }
}

// The norm over disjoint shards equals the norm of the whole gradient; any rank's overflow skips
// every rank; the update's scale is clip / (norm + 1e-6) / loss_scale.
TEST(GradFinalizer, NormOverflowAndClipOverDataParallelShards) {
  OneChunk m(tiny_config(3));
  const std::int64_t N = m.layout.numel();
  const auto gv = [](std::int64_t i) { return 0.01f * static_cast<float>(i % 13) - 0.05f; };
  double want_sq = 0;
  for (const model::ParamSpec& p : m.table.params) {
    for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i) want_sq += double(gv(i)) * gv(i);
  }
  const double want = std::sqrt(want_sq);
  for (int dp : {1, 2, 4}) {
    comm::run_on_threads(
        dp,
        [&](comm::Communicator& world) {
          parallel::ParallelContext par(world, {.tp_size = 1, .dp_size = dp, .pp_size = 1});
          GradFinalizer fin(m.layout, par, 1.0f);
          const parallel::ShardPlan plan = plan_for(m.layout, dp);
          const Range s = plan.shard(par.dp().rank());
          std::vector<float> shard(static_cast<std::size_t>(s.size()), 0.0f);
          // Padding between parameters holds junk that must not count.
          for (std::int64_t i = s.begin; i < std::min(s.end, N); ++i) shard[i - s.begin] = gv(i);
          const HeldGrads held{{shard.data(), s}, true};
          EXPECT_NEAR(fin.global_norm(kCtx, held), want, 1e-12 * want);
          const FinalizedGrads f = fin.finalize(kCtx, held, {.loss_scale = 4.0});
          EXPECT_FALSE(f.skipped);
          EXPECT_NEAR(f.grad_norm, want / 4.0, 1e-12 * want);
          const double clip = want / 4.0 > 1.0 ? 1.0 / (want / 4.0 + 1e-6) : 1.0;
          EXPECT_FLOAT_EQ(f.grad_scale, static_cast<float>(clip / 4.0));
          // An FP16 overflow on the last rank only.
          if (par.dp().rank() == dp - 1) shard[0] = 70000.0f;
          const FinalizedGrads o =
              fin.finalize(kCtx, held, {.loss_scale = 4.0, .overflow_threshold = 65504.0f});
          EXPECT_TRUE(o.skipped);
          if (par.dp().rank() == dp - 1) shard[0] = std::nanf("");
          EXPECT_TRUE(fin.finalize(kCtx, held, {}).skipped);  // a NaN norm skips without FP16
        },
        kWait);
  }
}

// Pipeline of two stages: the first stage's word embedding and the last stage's tied copy sum
// their (still whole) gradients before the data-parallel reduction.
TEST(GradFinalizer, TiedEmbeddingsSumOverThePipeline) {
  const model::ModelConfig cfg = tiny_config(2);
  comm::run_on_threads(
      2,
      [&](comm::Communicator& world) {
        parallel::ParallelContext par(world, {.tp_size = 1, .dp_size = 1, .pp_size = 2});
        const int pp = par.coord().pp;
        OneChunk m(
            cfg,
            {.first_layer = pp, .num_layers = 1, .has_embedding = pp == 0, .has_head = pp == 1});
        ParamGradBuffers b(m.layout, plan_for(m.layout, 1), zero_policy(0), 0, false);
        CommCounters cc;
        auto sync = make_grad_sync(b, par.dp(), cc, 1000);
        sync->begin_iteration(kCtx);
        const Range wte = m.layout.param_range(0, "embedding.word_embeddings.weight");
        const Range lnf = pp == 1 ? m.layout.param_range(0, "final_layernorm.weight") : Range{};
        for (std::int64_t i = wte.begin; i < wte.end; ++i) {
          *sync->rest_grad_at(i) = static_cast<float>((pp + 1) * (i - wte.begin));
        }
        for (std::int64_t i = lnf.begin; i < lnf.end; ++i) *sync->rest_grad_at(i) = 5.0f;
        sync->finish_layers();
        GradFinalizer fin(m.layout, par, 1.0f);
        fin.sum_tied_embeddings(*sync);
        for (std::int64_t i = wte.begin; i < wte.end; ++i) {
          ASSERT_EQ(*sync->rest_grad_at(i), 3.0f * static_cast<float>(i - wte.begin)) << i;
        }
        for (std::int64_t i = lnf.begin; i < lnf.end; ++i) ASSERT_EQ(*sync->rest_grad_at(i), 5.0f);
      },
      kWait);
}

// Tensor parallelism with sequence parallelism: LayerNorm gradients (each tp rank saw only its
// rows) are summed over tp inside the held range; split and other replicated tensors are not.
TEST(GradFinalizer, SequenceParallelLayerNormsSumOverTensorParallel) {
  const model::ModelConfig cfg = tiny_config(2);
  for (int dp : {1, 2}) {
    comm::run_on_threads(
        2 * dp,
        [&](comm::Communicator& world) {
          parallel::ParallelContext par(world, {.tp_size = 2, .dp_size = dp, .pp_size = 1});
          const int tp = par.coord().tp;
          OneChunk m(cfg, {.tp_size = 2, .tp_rank = tp, .sequence_parallel = true});
          const parallel::ShardPlan plan = plan_for(m.layout, dp);
          const Range s = plan.shard(par.dp().rank());
          std::vector<float> g(static_cast<std::size_t>(s.size()));
          for (std::int64_t i = s.begin; i < s.end; ++i) g[i - s.begin] = grad_value(tp, 0, i);
          GradFinalizer fin(m.layout, par, 1.0f);
          fin.sum_sequence_parallel_norms({{g.data(), s}, dp > 1});
          std::int64_t summed = 0;
          for (const ParamPiece& p : m.layout.pieces(s)) {
            for (std::int64_t k = 0; k < p.end - p.begin; ++k) {
              const std::int64_t i = p.flat_begin + k;
              const float want = p.spec->sequence_parallel
                                     ? grad_value(0, 0, i) + grad_value(1, 0, i)
                                     : grad_value(tp, 0, i);
              ASSERT_EQ(g[i - s.begin], want) << p.spec->name << " element " << i;
            }
            if (p.spec->sequence_parallel) summed += p.end - p.begin;
          }
          if (dp == 1) {
            EXPECT_GT(summed, 0);
          }
        },
        kWait);
  }
}

// Key/value heads replicated over tp subgroups (2 query groups on TP 4: ranks {0, 1} share group
// 0's key/value rows, {2, 3} group 1's): those rows' gradients are summed over the subgroup, the
// query rows and everything else are untouched; the gradient norm counts each copy once.
TEST(GradFinalizer, ReplicatedKeyValueRowsSumOverTheirTensorParallelSubgroup) {
  model::ModelConfig cfg = tiny_config(2);
  cfg.num_attention_heads = 4;
  cfg.num_query_groups = 2;
  for (int dp : {1, 2}) {
    comm::run_on_threads(
        4 * dp,
        [&](comm::Communicator& world) {
          parallel::ParallelContext par(world, {.tp_size = 4, .dp_size = dp, .pp_size = 1});
          const int tp = par.coord().tp;
          OneChunk m(cfg, {.tp_size = 4, .tp_rank = tp});
          const parallel::ShardPlan plan = plan_for(m.layout, dp);
          const Range s = plan.shard(par.dp().rank());
          std::vector<float> g(static_cast<std::size_t>(s.size()));
          for (std::int64_t i = s.begin; i < s.end; ++i) g[i - s.begin] = grad_value(tp, 0, i);
          GradFinalizer fin(m.layout, par, 1.0f);
          fin.sum_tp_replicated({{g.data(), s}, dp > 1});
          std::int64_t summed = 0;
          for (const ParamPiece& p : m.layout.pieces(s)) {
            for (std::int64_t k = 0; k < p.end - p.begin; ++k) {
              const std::int64_t i = p.flat_begin + k;
              const bool replicated =
                  p.spec->tp_replicas > 1 && p.begin + k >= p.spec->replicated_begin();
              const int first = tp / 2 * 2;  // the subgroup's first rank
              const float want = replicated ? grad_value(first, 0, i) + grad_value(first + 1, 0, i)
                                            : grad_value(tp, 0, i);
              ASSERT_EQ(g[i - s.begin], want) << p.spec->name << " element " << i;
              if (replicated) ++summed;
            }
          }
          if (dp == 1) {
            // Two layers' QKV weight and bias: a key and a value head of 4 rows (x 16 columns).
            EXPECT_EQ(summed, 2 * (2 * 4 * 16 + 2 * 4));
          }
        },
        kWait);
  }
}

}  // namespace
}  // namespace trident::optim
