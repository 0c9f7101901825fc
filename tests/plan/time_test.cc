// The time model's structure: the pipeline bubble follows (P - 1) / (v m) for uniform stages,
// tensor parallelism divides the compute, ZeRO-3 moves three times ZeRO-1's bytes per
// micro-batch, context parallelism's ring as its formula, Megatron's throughput formula; --search
// returns only layouts that fit, best first, and context-parallel ones for long sequences; the GPU
// table and its error for unknown names.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <set>
#include <sstream>
#include <tuple>

#include "trident/core/error.h"
#include "trident/plan/plan.h"

namespace trident::plan {
namespace {

train::TrainConfig gpt(const std::string& flags, int world) {
  train::TrainConfig cfg;
  CLI::App app;
  train::add_train_options(app, cfg);
  std::vector<std::string> args;
  std::istringstream in(
      "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
      "--tokenizer-type NullTokenizer --vocab-size 50256 --data-path x --bf16 " +
      flags);
  for (std::string a; in >> a;) args.push_back(a);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  cfg.finalize(world);
  cfg.model.vocab_size = 50257;
  return cfg;
}

Cluster a100(int n) {
  Cluster c;
  c.hw = find_hardware("A100-80GB");
  c.num_gpus = n;
  return c;
}

TEST(PlanTime, BubbleIsPMinusOneOverVm) {
  // Middle stages without embedding/head: compare the bubble with the schedule's formula using
  // the per-stage time the model itself reports.
  for (int v : {1, 2}) {
    std::string f = "--micro-batch-size 1 --global-batch-size 16 --pipeline-model-parallel-size 4";
    if (v == 2) f += " --num-layers-per-virtual-pipeline-stage 3";
    const auto cfg = gpt(f, 4);
    const TimeBreakdown t = predict_time(cfg, a100(4));
    const double per_micro =
        (t.forward + t.backward + t.recompute + t.tp_comm + t.pp_comm) / t.micro_batches;
    // Stages differ only by the embedding and head, so the bubble is close to (P-1)/v stages.
    EXPECT_NEAR(t.bubble / per_micro, 3.0 / v, 0.35 * 3.0 / v) << "v=" << v;
    EXPECT_NEAR(t.iteration, t.micro_batches * per_micro + t.bubble + t.dp_exposed + t.optimizer,
                1e-9 * t.iteration);
  }
}

TEST(PlanTime, TensorParallelismDividesComputeAndAddsCommunication) {
  const auto t1 = predict_time(gpt("--micro-batch-size 4 --global-batch-size 32", 1), a100(1));
  const auto t4 = predict_time(
      gpt("--micro-batch-size 4 --global-batch-size 32 --tensor-model-parallel-size 4", 4),
      a100(4));
  const double c1 = t1.forward + t1.backward, c4 = t4.forward + t4.backward;
  EXPECT_GT(c1 / c4, 3.0);
  EXPECT_LT(c1 / c4, 4.5);
  EXPECT_EQ(t1.tp_comm, 0);
  EXPECT_GT(t4.tp_comm, 0);
}

// Llama's shapes change the GEMMs by what their FLOPs change: grouped-query attention shrinks the
// QKV projection from 3h to h + 2 G h / a rows, SwiGLU's up-projection has 2f outputs. The GEMM
// time tracks the model FLOPs' ratio (GEMMs are most of them at this size).
TEST(PlanTime, LlamaShapesScaleTheGemmsAsTheirFlops) {
  const std::string base = "--micro-batch-size 4 --global-batch-size 32 ";
  const auto mha = predict_time(gpt(base, 1), a100(1));
  const auto mqa =
      predict_time(gpt(base + "--group-query-attention --num-query-groups 1", 1), a100(1));
  const auto glu = predict_time(gpt(base + "--swiglu", 1), a100(1));
  EXPECT_LT(mqa.gemm, mha.gemm);
  EXPECT_GT(glu.gemm, mha.gemm);
  EXPECT_NEAR(mqa.gemm / mha.gemm, mqa.model_flops / mha.model_flops, 0.05);
  EXPECT_NEAR(glu.gemm / mha.gemm, glu.model_flops / mha.model_flops, 0.05);
}

TEST(PlanTime, ZeroThreeMovesMoreThanZeroOne) {
  const auto z1 =
      predict_time(gpt("--micro-batch-size 2 --global-batch-size 64 --zero-stage 1", 8), a100(8));
  const auto z3 =
      predict_time(gpt("--micro-batch-size 2 --global-batch-size 64 --zero-stage 3", 8), a100(8));
  // Stage 1: the layers' reduce-scatter, the non-layer ranges' one (embeddings, final LayerNorm:
  // reduced apart from the layers' buckets, as trident does) and one all-gather, each its ring's
  // latency; stage 3: per micro-batch a reduce-scatter and two
  // gathers (4 micro-batches here), each of them one call per unit (24 layers, the embedding and
  // the head), so 26 times the per-call latency of its ring's 7 steps.
  const double lat = a100(8).hw.intra_latency, ring = 7 * lat;
  const double bytes_term = (z1.dp_comm - 3 * ring) / 2;  // one collective's bandwidth time
  EXPECT_NEAR(z3.dp_comm, 4 * 3 * (bytes_term + 26 * ring), 1e-9 * z3.dp_comm);
  EXPECT_GT(z3.dp_comm / z1.dp_comm, 3.0 * 4 / 2);
  EXPECT_GE(z3.iteration, z1.iteration);
}

TEST(PlanTime, ThroughputUsesMegatronsFormula) {
  const auto cfg = gpt("--micro-batch-size 4 --global-batch-size 64", 8);
  const auto t = predict_time(cfg, a100(8));
  EXPECT_DOUBLE_EQ(t.model_flops, cfg.model.flops_per_iteration(64 * 2048));
  EXPECT_NEAR(t.tflops_per_gpu, t.model_flops / t.iteration / 8 / 1e12, 1e-9);
  EXPECT_NEAR(t.mfu, t.tflops_per_gpu / 312.0, 1e-12);
  EXPECT_NEAR(t.tokens_per_s, 64 * 2048 / t.iteration, 1e-6);
  const TrainingEstimate e = estimate_training(t, a100(8), 1e9);
  EXPECT_NEAR(e.gpu_hours, 1e9 / t.tokens_per_s / 3600 * 8, 1e-6);
}

TEST(PlanTime, CpuNeedsACalibration) {
  Cluster c;
  c.hw.name = "cpu";
  c.hw.is_cpu = true;
  try {
    predict_time(gpt("--micro-batch-size 1", 1), c);
    FAIL() << "no exception";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--calibrate"), std::string::npos) << e.what();
  }
}

TEST(PlanSearch, RanksOnlyLayoutsThatFitBestFirst) {
  // 1.3B-class model on 8 A100-40GB.
  const auto base = gpt("--micro-batch-size 1 --global-batch-size 64", 8);
  Cluster c = a100(8);
  c.hw = find_hardware("A100-40GB");
  const SearchResult r = search_layouts(base, c, 20);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_GT(r.evaluated, static_cast<std::int64_t>(r.ranked.size()));
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    const Candidate& cand = r.ranked[i];
    EXPECT_TRUE(cand.plan.fits);
    EXPECT_LE(static_cast<double>(cand.plan.memory.worst().peak()), cand.plan.capacity_bytes);
    EXPECT_EQ(cand.cfg.global_batch_size, 64);
    if (i > 0) {
      EXPECT_LE(cand.plan.time.tokens_per_s, r.ranked[i - 1].plan.time.tokens_per_s);
    }
    EXPECT_NE(cand.flags.find("--tensor-model-parallel-size"), std::string::npos);
  }
  // With 4 GiB per GPU nothing of a 1.3B model with FP32 states fits without sharding.
  c.hw.memory_bytes = 4e9;
  c.hw.reserved_bytes = 0;
  const SearchResult small = search_layouts(base, c, 20);
  for (const Candidate& cand : small.ranked)
    EXPECT_GT(cand.cfg.zero_stage + cand.cfg.tensor_model_parallel_size +
                  cand.cfg.pipeline_model_parallel_size,
              1);
  EXPECT_GT(small.rejected_memory, r.rejected_memory);
}

// A mixture-of-experts model (FP32: trident's experts run in FP32), `experts` experts of top 2 in
// every layer.
train::TrainConfig moe(const std::string& flags, int world, int experts = 8) {
  train::TrainConfig cfg;
  CLI::App app;
  train::add_train_options(app, cfg);
  std::vector<std::string> args;
  std::istringstream in(
      "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
      "--seq-length 1024 --tokenizer-type NullTokenizer --vocab-size 50256 "
      "--data-path x --swiglu --disable-bias-linear --moe-router-topk 2 --num-experts " +
      std::to_string(experts) + " " + flags);
  for (std::string a; in >> a;) args.push_back(a);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  cfg.finalize(world);
  cfg.model.vocab_size = 50257;
  return cfg;
}

// The expert-parallel exchange per MoE layer and micro-batch, forward and backward alike: the
// count all-gather (ep x E int64) and two all-to-alls of the routed rows (rows x k x C x 4 bytes,
// (ep-1)/ep of them leaving the rank), each (ep-1) latencies, over NVLink inside one node.
// Computed here from the hardware table, not from the planner's helpers.
TEST(PlanTime, ExpertAllToAllGrowsWithEpAsTheFormula) {
  const Cluster c = a100(8);
  const double bw = c.hw.intra_bw * c.hw.comm_efficiency, alpha = c.hw.intra_latency;
  const double rows = 2 * 1024, k = 2, C = 1024, E = 8, L = 4;
  const std::string f = "--micro-batch-size 2 --global-batch-size 64 ";
  const TimeBreakdown t1 = predict_time(moe(f, 8), c);
  EXPECT_EQ(t1.ep_comm, 0);
  double previous = 0;
  for (int ep : {2, 4, 8}) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    const TimeBreakdown t =
        predict_time(moe(f + "--expert-model-parallel-size " + std::to_string(ep), 8), c);
    const double n = ep;
    const double a2a = (n - 1) / n * rows * k * C * 4 / bw + (n - 1) * alpha;
    const double counts = (n - 1) / n * n * E * 8 / bw + (n - 1) * alpha;
    const double m = 64.0 / (2 * 8);  // micro-batches: global batch / (micro-batch x dp)
    EXPECT_EQ(t.micro_batches, 4);
    const double expected = m * L * 2 * (counts + 2 * a2a);
    EXPECT_NEAR(t.ep_comm, expected, 1e-9 * expected);
    EXPECT_GT(t.ep_comm, previous);
    previous = t.ep_comm;
    // On the critical path: the iteration is the micro-batches' work (the exchange included),
    // the bubble, the exposed data-parallel traffic and the optimizer.
    EXPECT_NEAR(t.iteration,
                t.forward + t.backward + t.recompute + t.tp_comm + t.ep_comm + t.pp_comm +
                    t.bubble + t.dp_exposed + t.optimizer,
                1e-9 * t.iteration);
  }
  // An ep group of tp x ep = 16 ranks spans two nodes: InfiniBand's bandwidth and latency.
  const Cluster c16 = a100(16);
  const double ib = c16.hw.inter_bw * c16.hw.comm_efficiency, beta = c16.hw.inter_latency;
  const TimeBreakdown t16 =
      predict_time(moe("--micro-batch-size 2 --global-batch-size 64 --expert-model-parallel-size 8 "
                       "--tensor-model-parallel-size 2",
                       16),
                   c16);
  const double a2a16 = 7.0 / 8 * rows * k * C * 4 / ib + 7 * beta;
  const double counts16 = 7.0 / 8 * 8 * E * 8 / ib + 7 * beta;
  const double expected16 = 4 * L * 2 * (counts16 + 2 * a2a16);
  EXPECT_NEAR(t16.ep_comm, expected16, 1e-9 * expected16);
}

// The experts' GEMMs: the same FLOPs per rank whatever ep (each rank's E / ep experts run the
// rows every ep rank sends them), the busiest rank moe_load_imbalance(ep) times the mean; padded to
// a capacity, exactly ep x capacity rows per local expert. Shared experts add their MLP's GEMMs:
// the GEMM time grows as the model's FLOPs do (the FLOPs formula, model/config.cc, is independent
// of the time model).
TEST(PlanTime, SharedExpertsAddTheirMlpAsTheFlops) {
  const std::string f = "--micro-batch-size 2 --global-batch-size 16 --moe-ffn-hidden-size 1024 ";
  const TimeBreakdown plain = predict_time(moe(f, 8), a100(8));
  const TimeBreakdown shared =
      predict_time(moe(f + "--moe-shared-expert-intermediate-size 2048", 8), a100(8));
  const TimeBreakdown gated = predict_time(
      moe(f + "--moe-shared-expert-intermediate-size 2048 --moe-shared-expert-gate", 8), a100(8));
  EXPECT_GT(shared.model_flops, plain.model_flops);
  EXPECT_GT(shared.gemm, plain.gemm);
  EXPECT_NEAR(shared.gemm / plain.gemm, shared.model_flops / plain.model_flops, 0.05);
  EXPECT_GT(gated.gemm, shared.gemm);
}

// The fitted busiest-rank load (docs/plan.md, "Mixture of experts"): none without expert
// parallelism, then growing with log2 of the ep ranks through the measured 1.26 / 1.41 / 1.76.
TEST(PlanTime, ExpertLoadImbalanceIsTheFittedCurve) {
  EXPECT_EQ(moe_load_imbalance(1), 1.0);
  EXPECT_DOUBLE_EQ(moe_load_imbalance(2), 1.25);
  EXPECT_DOUBLE_EQ(moe_load_imbalance(4), 1.5);
  EXPECT_DOUBLE_EQ(moe_load_imbalance(8), 1.75);
  for (auto [ep, measured] : {std::pair{2, 1.261}, {4, 1.406}, {8, 1.763}}) {
    EXPECT_NEAR(moe_load_imbalance(ep), measured, 0.1) << "ep " << ep;
  }
}

TEST(PlanTime, ExpertRowsPerRankFollowTheRouting) {
  const auto mc = moe("--micro-batch-size 2 --global-batch-size 64", 8).model;
  const std::int64_t rows = 2048;
  const MoeLayerCost one = moe_layer_cost(mc, rows, 1, 1);
  EXPECT_EQ(one.routed_rows, rows * 2);
  EXPECT_EQ(one.local_experts, 8);
  EXPECT_EQ(one.rows_per_local_expert, rows * 2 / 8);
  EXPECT_EQ(one.all_to_all_bytes, rows * 2 * 1024 * 4.0);
  for (int ep : {2, 4, 8}) {
    const MoeLayerCost c = moe_layer_cost(mc, rows, 2, ep);
    EXPECT_EQ(c.local_experts, 8 / ep);
    EXPECT_EQ(c.rows_per_local_expert,
              static_cast<std::int64_t>(std::ceil(ep * rows * 2 / 8.0 * moe_load_imbalance(ep))));
    EXPECT_EQ(c.ffn_local, 4096 / 2);
    EXPECT_EQ(c.count_bytes, ep * 8 * 8.0);
  }
  auto padded = moe("--micro-batch-size 2 --global-batch-size 64 --moe-expert-capacity-factor 1.5 "
                    "--moe-pad-expert-input-to-capacity",
                    8)
                    .model;
  const std::int64_t cap = static_cast<std::int64_t>(std::ceil(rows * 2 / 8.0 * 1.5));
  const MoeLayerCost p = moe_layer_cost(padded, rows, 1, 4);
  EXPECT_EQ(p.routed_rows, 8 * cap);
  EXPECT_EQ(p.rows_per_local_expert, 4 * cap);
}

TEST(PlanSearch, MoeModelsGetExpertParallelLayoutsDenseModelsNone) {
  Cluster c = a100(8);
  // 6 experts on 8 GPUs: ep 2 divides both the experts and dp 2, 4 or 8; ep 4 and 8 divide no
  // expert count of 6, so they are never proposed.
  const SearchResult r =
      search_layouts(moe("--micro-batch-size 1 --global-batch-size 64", 8, 6), c, 100000);
  ASSERT_FALSE(r.ranked.empty());
  std::set<int> eps;
  for (const Candidate& cand : r.ranked) {
    const int ep = cand.cfg.expert_model_parallel_size;
    eps.insert(ep);
    EXPECT_EQ(6 % ep, 0);
    EXPECT_EQ(cand.cfg.data_parallel_size(8) % ep, 0);
    EXPECT_EQ(cand.flags.find("--expert-model-parallel-size") != std::string::npos, ep > 1);
    if (ep > 1) {
      EXPECT_GT(cand.plan.time.ep_comm, 0);
    }
  }
  EXPECT_EQ(eps, (std::set<int>{1, 2}));
  // 8 experts: every ep dividing dp is tried.
  const SearchResult r8 =
      search_layouts(moe("--micro-batch-size 1 --global-batch-size 64", 8), c, 100000);
  std::set<int> eps8;
  for (const Candidate& cand : r8.ranked) eps8.insert(cand.cfg.expert_model_parallel_size);
  EXPECT_EQ(eps8, (std::set<int>{1, 2, 4, 8}));
  // --expert-model-parallel-size given: only that ep.
  const SearchResult fixed = search_layouts(
      moe("--micro-batch-size 1 --global-batch-size 64 --expert-model-parallel-size 4", 8), c,
      100000, {.expert_model_parallel_size = 4});
  ASSERT_FALSE(fixed.ranked.empty());
  for (const Candidate& cand : fixed.ranked) {
    EXPECT_EQ(cand.cfg.expert_model_parallel_size, 4);
    EXPECT_EQ(cand.cfg.data_parallel_size(8) % 4, 0);
  }
  // A dense model: no expert parallelism.
  const SearchResult dense =
      search_layouts(gpt("--micro-batch-size 1 --global-batch-size 64", 8), c, 100000);
  ASSERT_FALSE(dense.ranked.empty());
  for (const Candidate& cand : dense.ranked) {
    EXPECT_EQ(cand.cfg.expert_model_parallel_size, 1);
    EXPECT_EQ(cand.flags.find("--expert-model-parallel-size"), std::string::npos);
    EXPECT_EQ(cand.plan.time.ep_comm, 0);
  }
}

// An expert-parallel size the experts or dp do not divide: the error of `trident train` (the
// same TrainConfig::finalize), naming the flag.
TEST(PlanSearch, AnImpossibleExpertParallelSizeIsRefusedAsTrainRefusesIt) {
  for (const auto& [flags, world, says] :
       {std::tuple{std::string("--expert-model-parallel-size 3"), 6,
                   std::string("--num-experts (8) must be divisible by "
                               "--expert-model-parallel-size (3)")},
        std::tuple{std::string("--expert-model-parallel-size 4 --tensor-model-parallel-size 2"), 4,
                   std::string("--expert-model-parallel-size 4 must divide the data-parallel "
                               "size 2")}}) {
    try {
      moe("--micro-batch-size 1 --global-batch-size 64 " + flags, world);
      FAIL() << "no exception for " << flags;
    } catch (const core::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

// A small dense model with a long sequence: 2 layers, hidden 256, 2 heads (so tp is at most 2),
// FP32.
train::TrainConfig long_gpt(std::int64_t seq, const std::string& flags, int world) {
  train::TrainConfig cfg;
  CLI::App app;
  train::add_train_options(app, cfg);
  std::vector<std::string> args;
  std::istringstream in("--num-layers 2 --hidden-size 256 --num-attention-heads 2 --seq-length " +
                        std::to_string(seq) +
                        " --tokenizer-type NullTokenizer --vocab-size 50256 --data-path x " +
                        flags);
  for (std::string a; in >> a;) args.push_back(a);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  cfg.finalize(world);
  cfg.model.vocab_size = 50257;
  return cfg;
}

// Context parallelism's ring, recomputed here from the hardware table: per layer and micro-batch
// the forward passes cp - 1 key/value blocks (B x T/cp x 2C/tp FP32) to the next rank and the
// backward cp - 1 blocks and cp gradient hops, each bytes / bw + alpha over NVLink (the cp group
// in a node). A forward or backward block overlaps its step's attention (exposed: the excess),
// the gradient hops do not. The attention per rank and micro-batch falls as 1/cp (the
// load-balanced causal split), the rest of the compute about so; the gradients are reduced over
// dp x cp = all 8 ranks, as without cp.
TEST(PlanTime, ContextParallelRingAsTheFormula) {
  const Cluster c = a100(8);
  const double bw = c.hw.intra_bw * c.hw.comm_efficiency, alpha = c.hw.intra_latency;
  const double B = 1, T = 2048, C = 2048, L = 24;
  const std::string f = "--micro-batch-size 1 --global-batch-size 16 --zero-stage 1 ";
  const TimeBreakdown t1 = predict_time(gpt(f, 8), c);
  EXPECT_EQ(t1.cp_comm, 0);
  EXPECT_EQ(t1.cp_exposed, 0);
  double previous = 0, previous_compute = 1e30;
  for (int cp : {2, 4, 8}) {
    SCOPED_TRACE("cp " + std::to_string(cp));
    const train::TrainConfig cfg = gpt(f + "--context-parallel-size " + std::to_string(cp), 8);
    const TimeBreakdown t = predict_time(cfg, c);
    const double m = 16.0 / (8 / cp);  // micro-batches: global batch / (micro x data parallel)
    EXPECT_EQ(t.micro_batches, static_cast<std::int64_t>(m));
    const double hop = B * (T / cp) * 2 * C * 4 / bw + alpha;
    const double expected = m * L * (3 * cp - 2) * hop;
    EXPECT_NEAR(t.cp_comm, expected, 1e-9 * expected);
    EXPECT_GT(t.cp_comm, previous);
    previous = t.cp_comm;
    // The step's attention (backward 2.5 x the forward), from the model's own attention time.
    const double step = t.attention / (m * L * cp * 3.5);
    const double exposed = m * L *
                           ((cp - 1) * std::max(0.0, hop - step) +
                            (cp - 1) * std::max(0.0, hop - 2.5 * step) + cp * hop);
    EXPECT_NEAR(t.cp_exposed, exposed, 1e-9 * exposed);
    EXPECT_LT(t.cp_exposed, t.cp_comm);
    // Per micro-batch and rank: the attention exactly 1/cp of one process's, all compute less.
    EXPECT_NEAR(t.attention / m, t1.attention / t1.micro_batches / cp, 1e-9 * t.attention);
    const double compute = (t.forward + t.backward) / m;
    EXPECT_LT(compute, previous_compute);
    EXPECT_LT(compute, (t1.forward + t1.backward) / t1.micro_batches / cp * 1.6);
    previous_compute = compute;
    // ZeRO-1 over dp x cp: the same 8 ranks and bytes as without cp.
    EXPECT_DOUBLE_EQ(t.dp_comm, t1.dp_comm);
    EXPECT_NEAR(t.iteration,
                t.forward + t.backward + t.recompute + t.tp_comm + t.ep_comm + t.cp_exposed +
                    t.pp_comm + t.bubble + t.dp_exposed + t.optimizer,
                1e-9 * t.iteration);
    const std::string text = format_plan(cfg, c, make_plan(cfg, c), 0);
    EXPECT_NE(text.find("x cp " + std::to_string(cp)), std::string::npos) << text;
    EXPECT_NE(text.find("CP ring"), std::string::npos) << text;
    EXPECT_NE(layout_flags(cfg).find("--context-parallel-size " + std::to_string(cp)),
              std::string::npos);
  }
  EXPECT_EQ(layout_flags(gpt(f, 8)).find("--context-parallel-size"), std::string::npos);
  // A cp group of tp x cp = 16 ranks spans two nodes: InfiniBand's bandwidth and latency.
  const Cluster c16 = a100(16);
  const double ib = c16.hw.inter_bw * c16.hw.comm_efficiency, beta = c16.hw.inter_latency;
  const TimeBreakdown t16 =
      predict_time(gpt(f + "--context-parallel-size 8 --tensor-model-parallel-size 2", 16), c16);
  const double hop16 = B * (T / 8) * 2 * (C / 2) * 4 / ib + beta;
  const double expected16 = 16 * L * (3 * 8 - 2) * hop16;
  EXPECT_NEAR(t16.cp_comm, expected16, 1e-9 * expected16);
}

// DeepSpeed-Ulysses on the same axis: per layer and micro-batch, forward and backward, an
// all-to-all of the rows' qkv (each rank sends B x T/u x 3C FP32) and one of the attention output
// (B x T/u x C), each (u-1)/u of the bytes over NVLink plus (u-1) latencies, none hidden; the
// attention per rank the same as the ring's (the whole sequence for 1/u of the heads).
TEST(PlanTime, UlyssesAllToAllsAsTheFormula) {
  const Cluster c = a100(8);
  const double bw = c.hw.intra_bw * c.hw.comm_efficiency, alpha = c.hw.intra_latency;
  const double B = 1, T = 2048, C = 2048, L = 24;
  const std::string f = "--micro-batch-size 1 --global-batch-size 16 --zero-stage 1 ";
  for (int u : {2, 4, 8}) {
    SCOPED_TRACE("u " + std::to_string(u));
    const train::TrainConfig cfg = gpt(f + "--ds-sequence-parallel-size " + std::to_string(u), 8);
    const TimeBreakdown t = predict_time(cfg, c);
    const TimeBreakdown ring =
        predict_time(gpt(f + "--context-parallel-size " + std::to_string(u), 8), c);
    const double m = 16.0 / (8 / u), n = u, rows = B * T / u * C * 4;
    auto a2a = [&](double bytes) { return (n - 1) / n * bytes / bw + (n - 1) * alpha; };
    const double expected = m * L * 2 * (a2a(3 * rows) + a2a(rows));
    EXPECT_NEAR(t.cp_comm, expected, 1e-9 * expected);
    EXPECT_NEAR(t.cp_exposed, expected, 1e-9 * expected);
    EXPECT_NEAR(t.attention, ring.attention, 1e-9 * t.attention);
    EXPECT_DOUBLE_EQ(t.dp_comm, ring.dp_comm);
    const std::string text = format_plan(cfg, c, make_plan(cfg, c), 0);
    EXPECT_NE(text.find("x ulysses " + std::to_string(u)), std::string::npos) << text;
    EXPECT_NE(layout_flags(cfg).find("--ds-sequence-parallel-size " + std::to_string(u)),
              std::string::npos);
    EXPECT_EQ(layout_flags(cfg).find("--context-parallel-size"), std::string::npos);
  }
}

// A long sequence (32768 tokens): splitting it (the ring or Ulysses) splits every activation of
// a slot, tp (at most 2 here: 2 heads) and pp only some of them, so the least memory a split
// layout needs is below any other layout's; with a memory between the two the search proposes
// only split layouts, each with its flag. Every split it tries divides world / (tp x pp), and
// 2 x the split the sequence; Ulysses is tried where the heads of a tp rank divide (U 2, tp 1).
TEST(PlanSearch, LongSequencesThatOnlyFitSplitGetContextParallelLayouts) {
  Cluster c = a100(8);
  // Flash attention for every layout (context parallelism runs it): linear in the sequence.
  const train::TrainConfig base =
      long_gpt(32768, "--micro-batch-size 1 --global-batch-size 8 --use-flash-attn", 8);
  const SearchResult all = search_layouts(base, c, 100000);
  ASSERT_FALSE(all.ranked.empty());
  double min_without = 1e30, min_with = 1e30;
  std::set<int> cps, ulysses;
  for (const Candidate& cand : all.ranked) {
    const int cp = cand.cfg.sequence_split(), tp = cand.cfg.tensor_model_parallel_size;
    (cand.cfg.ulysses() ? ulysses : cps).insert(cp);
    if (cand.cfg.ulysses()) {
      EXPECT_EQ((2 / tp) % cp, 0);
    }
    const int left = 8 / (tp * cand.cfg.pipeline_model_parallel_size);
    EXPECT_EQ(left % cp, 0);
    double& least = cp > 1 ? min_with : min_without;
    least = std::min(least, static_cast<double>(cand.plan.memory.worst().peak()));
  }
  EXPECT_EQ(cps, (std::set<int>{1, 2, 4, 8}));
  EXPECT_EQ(ulysses, (std::set<int>{2}));
  ASSERT_LT(min_with, min_without);
  // A memory between the two: only split layouts fit.
  c.hw.memory_bytes = (min_with + min_without) / 2;
  c.hw.reserved_bytes = 0;
  const SearchResult tight = search_layouts(base, c, 100000);
  ASSERT_FALSE(tight.ranked.empty());
  for (const Candidate& cand : tight.ranked) {
    EXPECT_GT(cand.cfg.sequence_split(), 1);
    EXPECT_NE(cand.flags.find(cand.cfg.ulysses() ? "--ds-sequence-parallel-size"
                                                 : "--context-parallel-size"),
              std::string::npos);
    EXPECT_GT(cand.plan.time.cp_comm, 0);
  }
  // A sequence of 12 tokens: 2 x cp must divide it, so cp 4 and 8 are never tried.
  std::set<int> short_cps;
  for (const Candidate& cand :
       search_layouts(long_gpt(12, "--micro-batch-size 1 --global-batch-size 8", 8), a100(8),
                      100000)
           .ranked)
    short_cps.insert(cand.cfg.sequence_split());
  EXPECT_EQ(short_cps, (std::set<int>{1, 2}));
}

// A given --context-parallel-size is kept (as a constraint, or set in the base configuration),
// and a given --ds-sequence-parallel-size too.
TEST(PlanSearch, AGivenContextParallelSizeIsKept) {
  const train::TrainConfig base =
      long_gpt(4096, "--micro-batch-size 1 --global-batch-size 8 --context-parallel-size 2", 8);
  for (const SearchConstraints& fixed :
       {SearchConstraints{}, SearchConstraints{.context_parallel_size = 2}}) {
    const SearchResult r = search_layouts(base, a100(8), 100000, fixed);
    ASSERT_FALSE(r.ranked.empty());
    for (const Candidate& cand : r.ranked) {
      EXPECT_EQ(cand.cfg.context_parallel_size, 2);
      EXPECT_NE(cand.flags.find("--context-parallel-size 2"), std::string::npos);
    }
  }
  // --ds-sequence-parallel-size 2: Ulysses 2 is kept.
  const SearchResult uly = search_layouts(
      long_gpt(4096, "--micro-batch-size 1 --global-batch-size 8 --ds-sequence-parallel-size 2", 8),
      a100(8), 100000);
  ASSERT_FALSE(uly.ranked.empty());
  for (const Candidate& cand : uly.ranked) {
    EXPECT_TRUE(cand.cfg.ulysses());
    EXPECT_EQ(cand.cfg.sequence_split(), 2);
    EXPECT_NE(cand.flags.find("--ds-sequence-parallel-size 2"), std::string::npos);
  }
  // Given as 1: no context parallelism.
  const SearchResult one =
      search_layouts(long_gpt(4096, "--micro-batch-size 1 --global-batch-size 8", 8), a100(8),
                     100000, {.context_parallel_size = 1});
  ASSERT_FALSE(one.ranked.empty());
  for (const Candidate& cand : one.ranked) EXPECT_EQ(cand.cfg.context_parallel_size, 1);
}

TEST(PlanHardware, KnownGpusAndAClearErrorOtherwise) {
  EXPECT_EQ(find_hardware("h100").name, "H100-SXM");
  EXPECT_EQ(find_hardware("a100-40gb").memory_bytes, 40e9);
  EXPECT_EQ(find_hardware("B200").peak_tflops, 2250);
  EXPECT_EQ(find_hardware("H200").memory_bytes, 141e9);
  try {
    find_hardware("V100");
    FAIL() << "no exception";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("known: A100-40GB"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident::plan
