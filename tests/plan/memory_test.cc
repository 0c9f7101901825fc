// trident plan's memory per rank equals what trident allocates: for every layout the equivalence
// tests train (tests/dist/equivalence_test.cc) and a few more (recomputation, flash attention,
// BF16), each rank of an in-process world builds the trainer's RankModel, ZeroOptimizer and
// GptPipeline, and the arena capacities they allocated are compared byte for byte with the
// planner's prediction for that rank's pipeline stage.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "trident/comm/thread_communicator.h"
#include "trident/core/error.h"
#include "trident/parallel/parallel_context.h"
#include "trident/plan/plan.h"
#include "trident/train/pipeline.h"
#include "trident/train/rank_model.h"
#include "trident/train/train_config.h"
#include "trident/train/zero_optimizer.h"

namespace trident::plan {
namespace {

// The model of the equivalence tests.
const char* kModel =
    "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2"
    " --global-batch-size 16 --tokenizer-type NullTokenizer --vocab-size 300 --data-path x";

// Llama's variant flags (docs/hf-import.md), on the same sizes.
const char* kLlama =
    "--normalization RMSNorm --swiglu --position-embedding-type rope --group-query-attention "
    "--untie-embeddings-and-output-weights --disable-bias-linear "
    "--make-vocab-size-divisible-by 64";

// A mixture of experts in every layer (docs/moe.md), 4 experts of F 48, top 2 (no biases, as
// the experts need, with SwiGLU).
const char* kMoe =
    "--swiglu --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48";

train::TrainConfig parse(const std::string& flags, int world) {
  train::TrainConfig cfg;
  CLI::App app;
  train::add_train_options(app, cfg);
  std::vector<std::string> args;
  std::istringstream in(flags);
  for (std::string a; in >> a;) args.push_back(a);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  cfg.finalize(world);
  cfg.model.vocab_size = cfg.null_tokenizer_vocab_size + 1;  // NullTokenizer adds the EOD id
  return cfg;
}

struct Actual {
  train::MemoryReport mem;
  std::vector<int> slots;
  std::vector<std::int64_t> slot_bytes;
  int pp_rank = 0;
};

// What each rank of a `world`-rank job allocates, built as run_training builds it (with expert
// parallelism as Trainer::build_model: the dense part and the experts in optimizers of their own,
// the experts' over the expert-data-parallel group, the two memory reports summed; with context
// parallelism the chunks' shards hold the rank's cp coordinates, the optimizer shards over
// dp x cp and the pipeline's slots hold seq_length / cp tokens, as Trainer::build_model and
// GptPipeline::add_slots do).
std::vector<Actual> allocate(const train::TrainConfig& cfg, int world) {
  std::vector<Actual> out(static_cast<std::size_t>(world));
  comm::run_on_threads(
      world,
      [&](comm::Communicator& w) {
        auto layout = parallel::ParallelLayout::from_world_size(
            w.size(), cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size);
        layout.ep_size = cfg.expert_model_parallel_size;
        layout.cp_size = cfg.sequence_split();
        layout.validate();
        parallel::ParallelContext par(w, layout);
        const train::PipelineSplit split{
            .pp_size = layout.pp_size,
            .num_chunks = cfg.virtual_pipeline_chunks(),
            .first_stage_layers = cfg.decoder_first_pipeline_num_layers,
            .last_stage_layers = cfg.decoder_last_pipeline_num_layers};
        const bool ep = layout.ep_size > 1;
        auto model_of = [&](model::ParamPart part) {
          return train::RankModel(
              cfg.model, split, layout.tp_size, par.coord().tp, par.coord().pp,
              cfg.sequence_parallel,
              {.ep_size = layout.ep_size, .ep_rank = layout.ep_rank(par.coord()), .part = part});
        };
        train::RankModel rm = model_of(model::ParamPart::kAll);
        rm.set_context_parallel(layout.cp_size, layout.cp_rank(par.coord()), cfg.ulysses());
        std::optional<train::RankModel> dense, experts;
        if (ep) {
          dense.emplace(model_of(model::ParamPart::kDense));
          experts.emplace(model_of(model::ParamPart::kExperts));
        }
        train::ZeroConfig zero{.stage = cfg.zero_stage,
                               .bucket_size = cfg.ddp_bucket_size,
                               .bf16 = cfg.bf16,
                               .offload = cfg.offload,
                               .offload_params = cfg.offload_params == "nvme"};
        train::ZeroOptimizer opt(ep ? *dense : rm, par, cfg.optimizer, zero);
        std::optional<train::ZeroOptimizer> expert_opt;
        if (ep) {
          zero.experts = true;
          expert_opt.emplace(*experts, par, cfg.optimizer, zero);
        }
        std::vector<model::ModelRuntime> runtimes;
        for (const train::ModelChunk& ch : rm.chunks()) {
          model::ModelRuntime rt;
          rt.shard = ch.shard;
          rt.tp = &par.tp();
          if (ep) {
            rt.ep = &par.ep();
            rt.ep_host = &par.ep_host();
          }
          if (layout.cp_size > 1) rt.cp = &par.cp();
          runtimes.push_back(rt);
        }
        opt.install_hooks(runtimes);
        std::vector<std::unique_ptr<train::MergedLayerWeights>> merged;
        if (expert_opt) expert_opt->merge_hooks(runtimes, merged);
        train::GptPipeline ex(rm, par, parallel::parse_pipeline_schedule(cfg.pipeline_schedule),
                              static_cast<int>(cfg.num_micro_batches(w.size())),
                              cfg.micro_batch_size, runtimes);
        Actual& a = out[static_cast<std::size_t>(w.rank())];
        a.mem = opt.memory();
        if (expert_opt) {
          const train::MemoryReport e = expert_opt->memory();
          a.mem.param_bytes += e.param_bytes;
          a.mem.grad_bytes += e.grad_bytes;
          a.mem.optimizer_bytes += e.optimizer_bytes;
          a.mem.staging_bytes += e.staging_bytes;
        }
        a.pp_rank = par.coord().pp;
        for (int c = 0; c < static_cast<int>(rm.chunks().size()); ++c) {
          a.slots.push_back(ex.slots_of(c));
          a.slot_bytes.push_back(ex.activation_bytes_per_slot(c));
        }
      },
      comm::WaitPolicy{.timeout_s = 60.0});
  return out;
}

struct Case {
  std::string name;
  int np;
  std::string flags;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << c.np << " ranks)"; }

class PlanMemory : public ::testing::TestWithParam<Case> {};

TEST_P(PlanMemory, EqualsTheTrainersAllocation) {
  const Case& c = GetParam();
  const train::TrainConfig cfg = parse(std::string(kModel) + " " + c.flags, c.np);
  std::vector<Actual> actual;
  try {
    actual = allocate(cfg, c.np);
  } catch (const core::Unavailable& e) {
    GTEST_SKIP() << "this CPU cannot run the layout: " << e.what();
  }
  const MemoryPlan plan = predict_memory(cfg, c.np);
  ASSERT_EQ(static_cast<int>(plan.stages.size()), cfg.pipeline_model_parallel_size);
  for (int r = 0; r < c.np; ++r) {
    const Actual& a = actual[static_cast<std::size_t>(r)];
    const RankMemory& p = plan.stages[static_cast<std::size_t>(a.pp_rank)];
    SCOPED_TRACE("rank " + std::to_string(r) + " (pp " + std::to_string(a.pp_rank) + ")");
    EXPECT_EQ(p.parameters, a.mem.param_bytes);
    EXPECT_EQ(p.gradients, a.mem.grad_bytes);
    EXPECT_EQ(p.optimizer, a.mem.optimizer_bytes);
    EXPECT_EQ(p.offloaded, a.mem.offloaded_bytes);
    EXPECT_EQ(p.staging, a.mem.staging_bytes);
    EXPECT_EQ(p.slots_per_chunk, a.slots);
    EXPECT_EQ(p.slot_bytes, a.slot_bytes);
    EXPECT_GT(p.total(), 0);
  }
}

// The layouts of tests/dist/equivalence_test.cc (and a few more model variants).
INSTANTIATE_TEST_SUITE_P(
    EquivalenceLayouts, PlanMemory,
    ::testing::Values(
        Case{"single", 1, "--make-vocab-size-divisible-by 128"},
        Case{"dp2", 2, "--make-vocab-size-divisible-by 128"},
        Case{"dp4", 4, "--make-vocab-size-divisible-by 128"},
        Case{"tp2", 2, "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2"},
        Case{"tp4", 4, "--make-vocab-size-divisible-by 32 --tensor-model-parallel-size 4"},
        Case{"tp2dp2", 4, "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2"},
        Case{"tp2sp", 2,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--sequence-parallel"},
        Case{"tp4spdp2", 8,
             "--make-vocab-size-divisible-by 32 --tensor-model-parallel-size 4 "
             "--sequence-parallel"},
        Case{"pp2", 2, "--pipeline-model-parallel-size 2"},
        Case{"pp4", 4, "--pipeline-model-parallel-size 4"},
        Case{"pp2gpipe", 2, "--pipeline-model-parallel-size 2 --pipeline-schedule gpipe"},
        Case{"pp2v2", 2,
             "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"},
        Case{"pp2uneven", 2,
             "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1"},
        Case{"tp2pp2dp2", 8,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2"},
        Case{"zero1dp2", 2, "--zero-stage 1 --ddp-bucket-size 5000"},
        Case{"zero2dp4", 4, "--zero-stage 2"}, Case{"zero3dp2", 2, "--zero-stage 3"},
        Case{"zero3dp4", 4, "--zero-stage 3"},
        Case{"zero0dp3", 3, "--zero-stage 0 --ddp-bucket-size 3000 --global-batch-size 12"},
        Case{"zero1dp3", 3, "--zero-stage 1 --ddp-bucket-size 3000 --global-batch-size 12"},
        Case{"zero2dp3", 3, "--zero-stage 2 --ddp-bucket-size 3000 --global-batch-size 12"},
        Case{"zero3dp3", 3, "--zero-stage 3 --ddp-bucket-size 3000 --global-batch-size 12"},
        Case{"tp2pp2dp2zero1", 8,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2 --zero-stage 1"},
        Case{"pp2dp2zero2", 4, "--pipeline-model-parallel-size 2 --zero-stage 2"},
        // --offload-optimizer nvme: the window in memory, the moments' files on disk.
        Case{"offload_single", 1,
             "--make-vocab-size-divisible-by 128 --offload-optimizer nvme --offload-path /tmp "
             "--offload-window-mib 0.1"},
        Case{"offload_zero3dp2", 2,
             "--zero-stage 3 --offload-optimizer nvme --offload-path /tmp --offload-window-mib 1"},
        Case{"offload_tp2pp2dp2zero1", 8,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2 --zero-stage 1 --offload-optimizer nvme "
             "--offload-path /tmp"},
        // --optimizer lion: one state array (AdamW's two moments are the other cases').
        Case{"lion_zero1dp2", 2, "--optimizer lion --zero-stage 1 --ddp-bucket-size 5000"},
        Case{"lion_offload_both_zero3dp2", 2,
             "--optimizer lion --zero-stage 3 --offload-params nvme --offload-optimizer nvme "
             "--offload-path /tmp --offload-window-mib 1"},
        // --offload-params nvme: the weight shard on disk, the read-ahead buffers in memory.
        Case{"poffload_zero3dp2", 2,
             "--zero-stage 3 --offload-params nvme --offload-path /tmp --offload-window-mib 1"},
        Case{"poffload_both_tp2pp2dp2zero3bf16", 8,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2 --zero-stage 3 --bf16 --offload-params nvme "
             "--offload-optimizer nvme --offload-path /tmp"},
        Case{"tp2pp2dp2zero3sp", 8,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2 --zero-stage 3 --sequence-parallel"},
        Case{"tp2pp2dp2spv2", 8,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2 --sequence-parallel "
             "--num-layers-per-virtual-pipeline-stage 1"},
        Case{"bloom_tp2pp2dp2", 8,
             "--make-vocab-size-divisible-by 64 --model bloom --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2"},
        Case{"drop_tp2spdp2", 4,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--sequence-parallel --hidden-dropout 0.1 --attention-dropout 0.1"},
        Case{"recompute_full_pp2", 2,
             "--pipeline-model-parallel-size 2 --recompute-granularity full"},
        Case{"recompute_selective_tp2", 2,
             "--make-vocab-size-divisible-by 64 --tensor-model-parallel-size 2 "
             "--recompute-granularity selective"},
        Case{"flash_zero3dp2", 2, "--use-flash-attn --zero-stage 3"},
        Case{"bf16_tp2pp2dp2", 8,
             "--make-vocab-size-divisible-by 64 --bf16 --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 2"},
        Case{"bf16_tp2dp2zero2sp", 4,
             "--make-vocab-size-divisible-by 64 --bf16 --tensor-model-parallel-size 2 "
             "--zero-stage 2 --sequence-parallel"},
        Case{"bf16_zero3dp2", 2, "--bf16 --zero-stage 3"},
        // Llama: RMSNorm, SwiGLU, rotary, untied output, no biases; grouped-query attention
        // (2 groups over TP 2), multi-query with its key/value heads replicated on both TP
        // ranks (ZeRO-3 shards them), and GQA in 3D with SP.
        Case{"llama_tp2gqa", 2,
             std::string(kLlama) + " --num-query-groups 2 --tensor-model-parallel-size 2"},
        Case{"llama_mqa_tp2dp2zero3", 4,
             std::string(kLlama) +
                 " --num-query-groups 1 --tensor-model-parallel-size 2 --zero-stage 3"},
        Case{"llama_tp2pp2dp2sp", 8,
             std::string(kLlama) + " --num-query-groups 2 --tensor-model-parallel-size 2 "
                                   "--pipeline-model-parallel-size 2 --sequence-parallel"},
        // Mixture of experts (4 experts, top 2), without and with expert parallelism
        // (tests/dist/equivalence_test.cc's MoeExpertParallelLayouts): the dense part over dp,
        // the experts over the expert-data-parallel group, the expert activations sized for the
        // rows the ep group may send (MoeConfig::max_local_rows).
        Case{"moe_dp2", 2, std::string(kMoe) + " --zero-stage 1"},
        Case{"moe_ep2", 2, std::string(kMoe) + " --expert-model-parallel-size 2"},
        Case{"moe_ep2dp4zero1", 4,
             std::string(kMoe) + " --expert-model-parallel-size 2 --zero-stage 1"},
        Case{"moe_ep2dp4zero2", 4,
             std::string(kMoe) + " --expert-model-parallel-size 2 --zero-stage 2"},
        Case{"moe_ep2dp4zero3", 4,
             std::string(kMoe) + " --expert-model-parallel-size 2 --zero-stage 3"},
        Case{"moe_ep4zero3", 4,
             std::string(kMoe) + " --expert-model-parallel-size 4 --zero-stage 3"},
        Case{"moe_ep2tp2sp", 4,
             std::string(kMoe) + " --expert-model-parallel-size 2 --tensor-model-parallel-size 2 "
                                 "--sequence-parallel --make-vocab-size-divisible-by 64"},
        Case{"moe_ep4tp2", 8,
             std::string(kMoe) +
                 " --expert-model-parallel-size 4 --tensor-model-parallel-size 2 --zero-stage 1 "
                 "--make-vocab-size-divisible-by 64"},
        Case{"moe_ep2pp2v2_recompute", 4,
             std::string(kMoe) +
                 " --expert-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                 "--num-layers-per-virtual-pipeline-stage 1 --recompute-granularity full"},
        Case{"moe_ep2_capacity_pad_freq2", 2,
             std::string(kMoe) +
                 " --expert-model-parallel-size 2 --moe-layer-freq 2 "
                 "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity"},
        Case{"moe_llama_ep2dp4zero3", 4,
             std::string(kLlama) +
                 " --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 "
                 "--num-query-groups 2 --expert-model-parallel-size 2 --zero-stage 3"},
        // Context parallelism (tests/dist/equivalence_test.cc's ContextParallelLayouts and
        // Models): seq_length / cp tokens a rank and the ring's buffers in each slot, ZeRO over
        // dp x cp.
        Case{"cp2", 2, "--make-vocab-size-divisible-by 128 --context-parallel-size 2"},
        Case{"cp4", 4, "--make-vocab-size-divisible-by 128 --context-parallel-size 4"},
        Case{"cp2tp2sp", 4,
             "--make-vocab-size-divisible-by 64 --context-parallel-size 2 "
             "--tensor-model-parallel-size 2 --sequence-parallel"},
        Case{"cp2pp2dp2zero1", 8,
             "--context-parallel-size 2 --pipeline-model-parallel-size 2 --zero-stage 1 "
             "--ddp-bucket-size 5000"},
        Case{"cp2zero3", 2, "--context-parallel-size 2 --zero-stage 3"},
        Case{"cp2dp2zero2bf16", 4, "--context-parallel-size 2 --zero-stage 2 --bf16"},
        Case{"bloom_cp4", 4, "--model bloom --context-parallel-size 4"},
        Case{"llama_cp2tp2", 4,
             std::string(kLlama) + " --num-query-groups 2 --context-parallel-size 2 "
                                   "--tensor-model-parallel-size 2"},
        Case{"drop_cp2recompute", 2,
             "--context-parallel-size 2 --hidden-dropout 0.1 --attention-dropout 0.1 "
             "--recompute-granularity full"},
        // DeepSpeed-Ulysses on the same axis (UlyssesLayouts): its exchange buffers instead of
        // the ring's, and the attention output over the whole sequence.
        Case{"uly2", 2, "--ds-sequence-parallel-size 2"},
        Case{"uly2dp2zero1", 4,
             "--ds-sequence-parallel-size 2 --zero-stage 1 --ddp-bucket-size 5000"},
        Case{"uly2tp2sp", 4,
             "--make-vocab-size-divisible-by 64 --ds-sequence-parallel-size 2 "
             "--tensor-model-parallel-size 2 --sequence-parallel"},
        Case{"bloom_uly4zero3", 4, "--model bloom --ds-sequence-parallel-size 4 --zero-stage 3"},
        Case{"llama_uly2pp2", 4,
             std::string(kLlama) + " --num-query-groups 2 --ds-sequence-parallel-size 2 "
                                   "--pipeline-model-parallel-size 2"}),
    [](const auto& p) { return p.param.name; });

// Shapes of the prediction that follow from the schedules (independent of the tables).
TEST(PlanMemoryShape, OneFOneBKeepsPMinusStageSlotsGPipeKeepsAll) {
  train::TrainConfig cfg = parse(std::string(kModel) + " --pipeline-model-parallel-size 4", 4);
  MemoryPlan p = predict_memory(cfg, 4);
  const std::int64_t m = cfg.num_micro_batches(4);
  ASSERT_GE(m, 4);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(p.stages[s].slots_per_chunk, std::vector<int>{4 - s});
  EXPECT_EQ(p.worst_stage, 0);
  cfg =
      parse(std::string(kModel) + " --pipeline-model-parallel-size 4 --pipeline-schedule gpipe", 4);
  p = predict_memory(cfg, 4);
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(p.stages[s].slots_per_chunk, std::vector<int>{static_cast<int>(m)});
}

TEST(PlanMemoryShape, ZeroStagesShrinkTheStatesAsTheFormulasSay) {
  // A model large enough that padding is negligible: 4 psi / dp per sharded buffer.
  const std::string big =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 16 "
      "--micro-batch-size 1 --global-batch-size 8 --tokenizer-type NullTokenizer --vocab-size 1000 "
      "--data-path x";
  std::int64_t states[4];
  for (int z = 0; z < 4; ++z) {
    const auto cfg = parse(big + " --zero-stage " + std::to_string(z), 8);
    states[z] = predict_memory(cfg, 8).worst().states();
  }
  const double psi = static_cast<double>(states[0]) / 16.0;
  EXPECT_NEAR(states[1], 8 * psi + 8 * psi / 8, 0.01 * psi);
  EXPECT_NEAR(states[2], 4 * psi + 12 * psi / 8, 0.01 * psi);
  EXPECT_NEAR(states[3], 16 * psi / 8, 0.01 * psi);
}

}  // namespace
}  // namespace trident::plan
