// The time model's structure: the pipeline bubble follows (P - 1) / (v m) for uniform stages,
// tensor parallelism divides the compute, ZeRO-3 moves three times ZeRO-1's bytes per
// micro-batch, Megatron's throughput formula; --search returns only layouts that fit, best first;
// the GPU table and its error for unknown names.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <sstream>

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
