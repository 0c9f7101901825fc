// Megatron / DeepSpeed compatibility: the flag table, old names mapped to their meaning, no-ops
// warned about by name, refusals with reasons, integers with '_', the DeepSpeed JSON, sample-based
// schedules, launcher environments and foreign checkpoint directories.
#include "trident/train/compat_flags.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "trident/core/error.h"
#include "trident/optim/lr_schedule.h"
#include "trident/train/deepspeed_config.h"
#include "trident/train/launch_env.h"
#include "trident/train/metrics.h"
#include "trident/train/train_config.h"

namespace trident::train {
namespace {

namespace fs = std::filesystem;

// Parses `args` as `trident train` does (program name first) and finalizes for `world` ranks.
TrainConfig parse(std::vector<std::string> args, int world = 1, bool finalize = true) {
  TrainConfig cfg;
  CLI::App app;
  add_train_options(app, cfg);
  std::vector<const char*> argv = {"train"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  record_given_flags(app, cfg);
  if (finalize) cfg.finalize(world);
  return cfg;
}

const std::vector<std::string> kBase = {"--num-layers",          "2",     "--hidden-size", "64",
                                        "--num-attention-heads", "4",     "--seq-length",  "32",
                                        "--data-path",           "corpus"};

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> v = kBase;
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

bool warned(const TrainConfig& c, const std::string& what) {
  return std::any_of(c.warnings.begin(), c.warnings.end(),
                     [&](const std::string& w) { return w.find(what) != std::string::npos; });
}

std::string error_of(const std::vector<std::string>& args, int world = 1) {
  try {
    parse(args, world);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(CompatFlags, TableIsConsistentWithTheRegisteredFlags) {
  TrainConfig cfg;
  CLI::App app;
  add_train_options(app, cfg);
  std::set<std::string_view> names;
  std::map<FlagStatus, int> count;
  for (const CompatFlag& f : megatron_flag_table()) {
    EXPECT_TRUE(names.insert(f.name).second) << "twice: " << f.name;
    ++count[f.status];
    EXPECT_FALSE(f.meaning.empty()) << f.name;
    if (f.status != FlagStatus::kImplemented) {
      EXPECT_FALSE(f.note.empty()) << f.name;
    }
    // Every flag of the table is accepted by `trident train` (implemented ones natively).
    EXPECT_NO_THROW(app.get_option(std::string(f.name))) << f.name;
  }
  // The table is the union of Megatron-LM's pretrain_gpt.py flags 2021-2026 and
  // Megatron-DeepSpeed's: a thousand and more. Spot-check names from both.
  EXPECT_GT(names.size(), 1000u);
  for (const char* n :
       {"--train-samples", "--rampup-batch-size", "--DDP-impl", "--deepspeed_config",
        "--pp-partition-method", "--fp8-format", "--num-experts",
        "--use-rotary-position-embeddings", "--swiglu", "--tensorboard-dir", "--local_rank"}) {
    EXPECT_TRUE(names.contains(n)) << n;
  }
  EXPECT_GT(count[FlagStatus::kImplemented], 80);
}

TEST(CompatFlags, DocsTableIsTheGeneratedOne) {
  std::ifstream in("docs/flags.md");
  ASSERT_TRUE(in.good()) << "docs/flags.md missing (tests run in the source directory)";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), flag_table_markdown())
      << "docs/flags.md is stale: build/tools/trident train --print-flag-table > docs/flags.md";
}

TEST(CompatFlags, OldNamesMapToTheirMeaning) {
  const TrainConfig c =
      parse(with({"--checkpoint-activations", "--DDP-impl", "local", "--distributed-backend",
                  "nccl", "--data-impl", "mmap", "--num-workers", "2", "--optimizer", "adam",
                  "--override-lr-scheduler", "--model-parallel-size", "1",
                  "--distributed-timeout-minutes", "2", "--local_rank=0"}));
  EXPECT_EQ(c.recompute_granularity, "full");
  EXPECT_EQ(c.recompute_method, "uniform");
  EXPECT_DOUBLE_EQ(c.comm_timeout, 120.0);
  // Each no-op gets one warning naming it (and its value).
  EXPECT_TRUE(warned(c, "--DDP-impl local: accepted, no effect"));
  EXPECT_TRUE(warned(c, "--distributed-backend nccl"));
  EXPECT_TRUE(warned(c, "--num-workers 2"));
  EXPECT_TRUE(warned(c, "--local_rank 0"));
  EXPECT_FALSE(warned(c, "--data-impl"));  // mmap is what trident reads: nothing to say
  EXPECT_EQ(std::count_if(c.warnings.begin(), c.warnings.end(),
                          [](const std::string& w) { return w.find("--DDP-impl") == 0; }),
            1);
}

// The no-ops reviewed for issue 35 (docs/flags.md): those whose Megatron run differs are now
// mapped, refused or warned about with what differs.
TEST(CompatFlags, ReviewedNoOps) {
  // Mapped: Megatron's GPT takes --encoder-num-layers / --encoder-seq-length as its sizes.
  const std::vector<std::string> no_sizes = {"--hidden-size", "64",    "--num-attention-heads", "4",
                                             "--data-path",   "corpus"};
  std::vector<std::string> args = no_sizes;
  for (const char* a :
       {"--encoder-num-layers", "3", "--encoder-seq-length", "48", "--max-position-embeddings",
        "64", "--padded-vocab-size", "51200", "--disable-log-loss-scale-to-tensorboard"}) {
    args.push_back(a);
  }
  const TrainConfig m = parse(args);
  EXPECT_EQ(m.model.num_layers, 3);
  EXPECT_EQ(m.model.seq_length, 48);
  EXPECT_EQ(m.pad_vocab_size_to, 51200);
  EXPECT_TRUE(m.no_log_loss_scale_to_tensorboard);
  EXPECT_NE(error_of(with({"--encoder-num-layers", "3"})).find("give one"), std::string::npos);
  EXPECT_NE(error_of(with({"--encoder-seq-length", "32"})).find("give one"), std::string::npos);
  // Refused: what Megatron would do instead of this run.
  EXPECT_NE(error_of(with({"--ckpt-convert-format", "torch"})).find("trident convert"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--no-rope-freq", "4", "--position-embedding-type", "rope"}))
                .find("RoPE in every layer"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--swiglu", "--glu-linear-offset", "1.0"})).find("no offset"),
            std::string::npos);
  EXPECT_EQ(error_of(with({"--swiglu", "--glu-linear-offset", "0"})), "");
  // --add-qkv-bias: the QKV projection keeps its bias, alone with --disable-bias-linear (Qwen2).
  EXPECT_EQ(error_of(with({"--add-qkv-bias"})), "");
  EXPECT_TRUE(parse(with({"--add-qkv-bias"})).model.qkv_bias());
  const TrainConfig qkv = parse(with({"--add-qkv-bias", "--swiglu", "--disable-bias-linear"}));
  EXPECT_TRUE(qkv.model.add_qkv_bias && qkv.model.qkv_bias() && !qkv.model.add_bias_linear);
  EXPECT_FALSE(parse(with({"--swiglu", "--disable-bias-linear"})).model.qkv_bias());
  EXPECT_TRUE(parse(with({"--add-qkv-bias", "--model", "llama"})).model.qkv_bias());
  // Accepted, with a warning naming what differs from Megatron's run.
  const TrainConfig d = parse(with({"--no-bias-gelu-fusion", "--fp16-lm-cross-entropy",
                                    "--no-save-optim", "--non-persistent-save-interval", "100"}));
  EXPECT_TRUE(warned(d,
                     "--no-bias-gelu-fusion: accepted, but the run differs from Megatron's: "
                     "Megatron's MLP then uses the exact (erf) GeLU"));
  EXPECT_TRUE(warned(d, "--fp16-lm-cross-entropy: accepted, but the run differs"));
  EXPECT_TRUE(warned(d, "--no-save-optim: accepted, but the run differs"));
  EXPECT_TRUE(warned(d, "--non-persistent-save-interval 100: accepted, but the run differs"));
  EXPECT_NE(d.arguments_table().find("[no-op, differs]"), std::string::npos);
  // The table's counts: every no-op of the review is accounted for.
  std::map<FlagStatus, int> count;
  for (const CompatFlag& f : megatron_flag_table()) ++count[f.status];
  // (813 at the review; --lion-beta1 and --lion-beta2 are implemented since, with --optimizer
  // lion; with the mixture of experts, 12 --moe-* flags are implemented, 6 mapped and 22 refused
  // in a model with experts: MoeFlags below; --moe-shared-expert-gate and
  // --moe-router-bias-update-rate are implemented since; --cp-comm-type is checked since
  // context parallelism: p2p accepted, the other kinds refused; --add-qkv-bias is implemented
  // since the QKV bias can be kept alone.)
  EXPECT_EQ(count[FlagStatus::kNoOp] + count[FlagStatus::kNoOpDiffers], 767);
  EXPECT_EQ(count[FlagStatus::kNoOpDiffers], 8);
}

TEST(CompatFlags, RefusedFlagsNameTheReason) {
  EXPECT_NE(error_of(with({"--squared-relu"})).find("trident's MLP is GeLU"), std::string::npos);
  EXPECT_NE(error_of(with({"--fp8-format", "hybrid"})).find("no FP8"), std::string::npos);
  EXPECT_NE(error_of(with({"--rotary-interleaved"})).find("rotates halves"), std::string::npos);
  // The Llama family's flags are trident's own (docs/llama.md).
  EXPECT_EQ(error_of(with({"--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
                           "--position-embedding-type", "rope", "--group-query-attention",
                           "--num-query-groups", "2"})),
            "");
  EXPECT_NE(error_of(with({"--normalization", "RMSNorm2"})).find("--normalization"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--optimizer", "sgd"}))
                .find("--optimizer sgd: trident has adam (AdamW, Megatron's adam) and lion"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--data-impl", "lazy"})).find("--data-impl lazy"), std::string::npos);
  // Context parallelism is trident's own flag (docs/long-context.md); its ring is p2p.
  EXPECT_EQ(error_of(with({"--context-parallel-size", "1"})), "");
  EXPECT_EQ(error_of(with({"--cp-comm-type", "p2p"})), "");
  EXPECT_NE(error_of(with({"--cp-comm-type", "a2a"})).find("--cp-comm-type a2a"),
            std::string::npos);
  EXPECT_EQ(error_of(with({"--kv-channels", "16"})), "");  // 64 / 4
  EXPECT_NE(error_of(with({"--kv-channels", "32"})), "");
}

// --context-parallel-size's limits name the problem and the way out (docs/long-context.md).
TEST(CompatFlags, ContextParallelLimits) {
  EXPECT_EQ(error_of(with({"--context-parallel-size", "2"}), 2), "");
  const TrainConfig c = parse(with({"--context-parallel-size", "2"}), 4);
  EXPECT_EQ(c.data_parallel_size(4), 2);     // world / (tp x pp x cp)
  EXPECT_TRUE(c.model.use_flash_attention);  // the ring runs the fused core
  EXPECT_NE(error_of(with({"--context-parallel-size", "2"}), 3)
                .find("--context-parallel-size 2 must divide the 3 ranks"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--context-parallel-size", "2", "--seq-length", "30"}), 2)
                .find("must be divisible by 2 x --context-parallel-size (4)"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--context-parallel-size", "2", "--reset-attention-mask"}), 2)
                .find("--reset-position-ids / --reset-attention-mask is not supported yet"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--context-parallel-size", "2", "--num-experts", "4"}), 2)
                .find("with a mixture-of-experts model is not supported yet"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--context-parallel-size", "0"}), 2).find(">= 1"), std::string::npos);
  // DeepSpeed-Ulysses: the same split, the heads of a tp rank divided among the ranks.
  const TrainConfig u = parse(with({"--ds-sequence-parallel-size", "4"}), 8);
  EXPECT_EQ(u.sequence_split(), 4);
  EXPECT_TRUE(u.ulysses());
  EXPECT_EQ(u.data_parallel_size(8), 2);
  EXPECT_NE(
      error_of(with({"--ds-sequence-parallel-size", "2", "--tensor-model-parallel-size", "4"}), 8)
          .find("the 1 attention heads of a tensor-parallel rank"),
      std::string::npos);
  EXPECT_NE(error_of(with({"--ds-sequence-parallel-size", "2", "--context-parallel-size", "2"}), 4)
                .find("both split the sequence: choose one"),
            std::string::npos);
}

TEST(CompatFlags, IntegersWithUnderscores) {
  EXPECT_EQ(strip_digit_underscores("9_765_625"), "9765625");
  EXPECT_EQ(strip_digit_underscores("1_0.5e-3"), "10.5e-3");
  EXPECT_EQ(strip_digit_underscores("a_b"), "a_b");
  EXPECT_EQ(strip_digit_underscores("1__0"), "1__0");  // Python refuses it too
  const TrainConfig c =
      parse(with({"--train-samples", "1_000", "--global-batch-size", "1_0", "--micro-batch-size",
                  "2", "--rampup-batch-size", "2", "2", "1_00"}));
  EXPECT_EQ(c.train_samples, 1000);
  EXPECT_EQ(c.global_batch_size, 10);
  EXPECT_EQ(c.rampup_batch_size, (std::vector<std::int64_t>{2, 2, 100}));
}

TEST(CompatFlags, MegatronDefaults) {
  const TrainConfig c = parse(kBase);
  EXPECT_FLOAT_EQ(c.model.hidden_dropout, 0.1f);
  EXPECT_FLOAT_EQ(c.model.attention_dropout, 0.1f);
  EXPECT_EQ(c.eval_iters, 100);
  const std::string table = c.arguments_table();
  EXPECT_NE(table.find("------------------------ arguments ------------------------"),
            std::string::npos);
  EXPECT_TRUE(std::regex_search(table, std::regex(R"(\n  hidden_dropout \.+ 0\.1\n)"))) << table;
}

TEST(SampleSchedule, TrainSamplesWithRampCountsAsMegatron) {
  // No ramp: train_samples // global batch.
  TrainConfig c = parse(with({"--train-samples", "100", "--global-batch-size", "8",
                              "--micro-batch-size", "1", "--lr-warmup-samples", "10"}));
  EXPECT_EQ(c.train_iters, 12);
  EXPECT_DOUBLE_EQ(c.lr_steps.warmup_iters, 10);
  EXPECT_DOUBLE_EQ(c.lr_steps.decay_iters, 100);
  // Iterations are converted to samples: warm-up 5 iterations x 8.
  c = parse(with({"--train-iters", "20", "--global-batch-size", "8", "--micro-batch-size", "1",
                  "--lr-warmup-iters", "5"}));
  EXPECT_DOUBLE_EQ(c.lr_steps.warmup_iters, 40);
  EXPECT_DOUBLE_EQ(c.lr_steps.decay_iters, 160);
  c = parse(with({"--train-iters", "20", "--global-batch-size", "8", "--micro-batch-size", "1",
                  "--lr-warmup-fraction", "0.25"}));
  EXPECT_DOUBLE_EQ(c.lr_steps.warmup_iters, 40);
  EXPECT_NE(error_of(with({"--train-iters", "20", "--train-samples", "100"})).find("not both"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--train-samples", "100", "--lr-warmup-iters", "5"})).find("samples"),
            std::string::npos);
}

TEST(SampleSchedule, StepBatchSizeScheduleFlags) {
  // seq-length 32: 320 tokens are 10 samples. As Megatron-LM, the global batch size outside the
  // schedule is micro x dp, and --train-samples counts iterations until the samples are reached.
  TrainConfig c = parse(with({"--step-batch-size-schedule", "0:2 320:4", "--micro-batch-size", "1",
                              "--train-samples", "23", "--lr-warmup-samples", "4"}),
                        2);
  ASSERT_EQ(c.step_schedule.size(), 2u);
  EXPECT_EQ(c.step_schedule[1].threshold, 10);
  EXPECT_EQ(c.global_batch_size, 2);
  EXPECT_EQ(c.train_iters, 9);  // 5 x 2 = 10, then 4 x 4 = 26: the last passes 23
  // The words of an unquoted schedule are joined back (Megatron-LM's GPT-3 example).
  c = parse(with({"--step-batch-size-schedule", "0:2", "320:4", "--micro-batch-size", "1",
                  "--train-iters", "5"}),
            2);
  EXPECT_EQ(c.step_batch_size_schedule, "0:2 320:4");
  // --global-batch-size: only the last stage, with a warning that Megatron-LM refuses the pair.
  c = parse(with({"--step-batch-size-schedule", "0:2 320:4", "--global-batch-size", "4",
                  "--micro-batch-size", "1", "--train-iters", "5", "--lr-decay-iters", "5"}),
            2);
  EXPECT_TRUE(warned(c, "Megatron-LM refuses the pair"));
  EXPECT_DOUBLE_EQ(c.lr_steps.decay_iters, 20);  // 5 iterations x 4
  EXPECT_NE(error_of(with({"--step-batch-size-schedule", "0:2 320:4", "--global-batch-size", "8",
                           "--micro-batch-size", "1"}),
                     2)
                .find("whose last batch size is 4"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--step-batch-size-schedule", "0:2 320:4", "--rampup-batch-size", "2",
                           "2", "10"}))
                .find("not both"),
            std::string::npos);
  EXPECT_NE(
      error_of(with({"--step-batch-size-schedule", "0:2 320:4", "--decrease-batch-size-if-needed"}))
          .find("--decrease-batch-size-if-needed"),
      std::string::npos);
  EXPECT_NE(error_of(with({"--step-batch-size-schedule", "64:2 320:4"})).find("start at 0"),
            std::string::npos);
}

TEST(SplitPathsFlags, BigScienceDataFlagsAndTheirExclusions) {
  const std::vector<std::string> base = {"--num-layers",          "2", "--hidden-size", "64",
                                         "--num-attention-heads", "4", "--seq-length",  "32"};
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = base;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  const std::string dir =
      fs::temp_directory_path() / ("trident-split-flags-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = dir + "/valid-splits.txt";
  std::ofstream(file) << "\"valid: 1 0.95:1 A\" \"valid_b: 1 0.95:1 B\"\n";
  // The -path file is read into the groups; several validation groups, one training group.
  TrainConfig c = parse(args({"--train-weighted-split-paths", "train: 1 0:0.95 A, 2 0:0.95 B",
                              "--valid-weighted-split-paths-path", file}));
  EXPECT_EQ(c.train_weighted_split_paths,
            (std::vector<std::string>{"train: 1 0:0.95 A, 2 0:0.95 B"}));
  EXPECT_EQ(c.valid_weighted_split_paths,
            (std::vector<std::string>{"valid: 1 0.95:1 A", "valid_b: 1 0.95:1 B"}));
  c = parse(args({"--train-weighted-split-paths", "train: 1 0:0.95 A",
                  "--valid-weighted-split-paths", "v1: 1 0.95:1 A", "v2: 1 0.95:1 A"}));
  EXPECT_EQ(c.valid_weighted_split_paths.size(), 2u);
  // BigScience's exclusions and the grammar's errors, before anything runs.
  EXPECT_NE(
      error_of(args({"--train-weighted-split-paths", "train: 1 0:0.95 A", "--data-path", "corpus"}))
          .find("mutually exclusive"),
      std::string::npos);
  EXPECT_NE(
      error_of(args({"--train-weighted-split-paths", "train: 1 0:0.95 A", "--split", "98,2,0"}))
          .find("mutually exclusive"),
      std::string::npos);
  EXPECT_NE(error_of(args({"--valid-weighted-split-paths-path", file}))
                .find("need --train-weighted-split-paths"),
            std::string::npos);
  EXPECT_NE(error_of(args({"--train-weighted-split-paths", "train: 1 0:0.95 A",
                           "--valid-weighted-split-paths", "v: 1 0.95:1 A",
                           "--valid-weighted-split-paths-path", file}))
                .find("give one of them"),
            std::string::npos);
  EXPECT_NE(error_of(args({"--train-weighted-split-paths", "a: 1 0:0.95 A", "b: 1 0:0.95 B"}))
                .find("takes one group"),
            std::string::npos);
  EXPECT_NE(
      error_of(args({"--train-weighted-split-paths", "train: 1 0.95:0.5 A"})).find("reversed"),
      std::string::npos);
  EXPECT_NE(error_of(args({"--train-weighted-split-paths-path", dir + "/missing.txt"}))
                .find("missing.txt: cannot read"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(SampleSchedule, SkippedStepsDoNotAdvanceTheScheduler) {
  optim::LrSchedule s{.lr = 1.0, .min_lr = 0.0, .warmup_iters = 10, .decay_iters = 20};
  optim::MegatronLrScheduler sched(
      {.samples = s, .warmup_tokens = std::nullopt, .decay_tokens = std::nullopt});
  EXPECT_DOUBLE_EQ(sched.lr(), 0.0);
  sched.step(4, 0);
  EXPECT_DOUBLE_EQ(sched.lr(), 0.4);
  // A skipped step: the trainer does not call step(); the rate stays.
  EXPECT_DOUBLE_EQ(sched.lr(), 0.4);
  sched.step(6, 0);
  EXPECT_DOUBLE_EQ(sched.lr(), 1.0);
  sched.step(5, 0);
  EXPECT_DOUBLE_EQ(sched.lr(), 0.5);
}

TEST(DeepSpeedJson, BatchSizesClippingZeroAndTheFp16Scaler) {
  TrainConfig c = parse(with({"--fp16", "--loss-scale", "12", "--clip-grad", "1.0"}), 4, false);
  apply_deepspeed_json(c, nlohmann::json::parse(R"({
      "train_batch_size": 32, "gradient_accumulation_steps": 2,
      "gradient_clipping": 1.0, "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8},
      "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
               "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1},
      "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8}},
      "steps_per_print": 10, "flops_profiler": {"enabled": false}})"),
                       4, "ds.json");
  EXPECT_EQ(c.micro_batch_size, 4);  // 32 / (2 x dp 4)
  EXPECT_EQ(c.global_batch_size, 32);
  EXPECT_EQ(c.zero_stage, 1);
  EXPECT_EQ(c.ddp_bucket_size, 500000000);
  EXPECT_DOUBLE_EQ(c.initial_loss_scale, 4096.0);
  EXPECT_EQ(c.loss_scale_window, 500);
  // --loss-scale 12 under --deepspeed: DeepSpeed's dynamic scale from 2^12, not a static 12.
  EXPECT_DOUBLE_EQ(c.loss_scale, 0.0);
  EXPECT_TRUE(warned(c, "--loss-scale 12 ignored under --deepspeed"));
  EXPECT_FLOAT_EQ(c.optimizer.beta2, 0.95f);
  EXPECT_TRUE(warned(c, "\"steps_per_print\""));
  EXPECT_TRUE(warned(c, "\"flops_profiler\""));
  EXPECT_TRUE(warned(c, "\"optimizer.params.lr\""));
}

// --optimizer lion and its betas (Megatron's flag names), in the config's JSON; Lion's betas may be
// 1 (a momentum that never decays) where AdamW's may not.
TEST(CompatFlags, OptimizerLion) {
  TrainConfig c =
      parse(with({"--optimizer", "lion", "--lion-beta1", "0.95", "--lion-beta2", "0.98"}));
  EXPECT_EQ(c.optimizer.kind, optim::OptimizerKind::kLion);
  EXPECT_DOUBLE_EQ(c.optimizer.lion_beta1, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.lion_beta2, 0.98);
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j.at("optimizer"), "lion");
  EXPECT_DOUBLE_EQ(j.at("lion_beta1").get<double>(), 0.95);
  EXPECT_EQ(parse(with({})).optimizer.kind, optim::OptimizerKind::kAdamW);
  EXPECT_EQ(parse(with({})).to_json().at("optimizer"), "adam");
  EXPECT_EQ(parse(with({"--optimizer", "adamw"})).optimizer.kind, optim::OptimizerKind::kAdamW);
  EXPECT_NE(error_of(with({"--optimizer", "lion", "--lion-beta2", "1.5"}))
                .find("--lion-beta2 must be in [0, 1]"),
            std::string::npos);
  EXPECT_EQ(error_of(with({"--optimizer", "lion", "--lion-beta1", "1"})), "");
}

// A DeepSpeed config's Lion (or FusedLion) selects --optimizer lion; its betas are Lion's.
TEST(DeepSpeedJson, LionOptimizer) {
  TrainConfig c = parse(with({}), 1, false);
  apply_deepspeed_json(c, nlohmann::json::parse(R"({"train_batch_size": 4,
      "optimizer": {"type": "FusedLion", "params": {"betas": [0.9, 0.95], "weight_decay": 0.1}}})"),
                       1, "ds.json");
  c.finalize(1);
  EXPECT_EQ(c.optimizer.kind, optim::OptimizerKind::kLion);
  EXPECT_DOUBLE_EQ(c.optimizer.lion_beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);  // AdamW's untouched
  for (const char* type : {"Lion", "lion", "DeepSpeedCPULion"}) {
    TrainConfig e = parse(with({}), 1, false);
    apply_deepspeed_json(
        e, nlohmann::json::parse(std::string(R"({"optimizer": {"type": ")") + type + "\"}}"), 1,
        "ds.json");
    e.finalize(1);
    EXPECT_EQ(e.optimizer.kind, optim::OptimizerKind::kLion) << type;
  }
  TrainConfig d = parse(with({"--optimizer", "adam"}), 1, false);
  try {
    apply_deepspeed_json(d, nlohmann::json::parse(R"({"optimizer": {"type": "Lion"}})"), 1,
                         "ds.json");
    ADD_FAILURE() << "a DeepSpeed Lion under --optimizer adam was accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("contradicts --optimizer adam"), std::string::npos)
        << e.what();
  }
}

TEST(DeepSpeedJson, ContradictionsAreRefused) {
  auto err = [](std::vector<std::string> flags, const char* json) {
    TrainConfig c = parse(with(flags), 2, false);
    try {
      apply_deepspeed_json(c, nlohmann::json::parse(json), 2, "ds.json");
    } catch (const core::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err({"--global-batch-size", "16"}, R"({"train_batch_size": 32})")
                .find("contradicts --global-batch-size 16"),
            std::string::npos);
  EXPECT_NE(err({"--zero-stage", "2"}, R"({"zero_optimization": {"stage": 1}})")
                .find("contradicts --zero-stage"),
            std::string::npos);
  EXPECT_NE(err({"--bf16"}, R"({"fp16": {"enabled": true}})").find("--bf16 contradicts"),
            std::string::npos);
  EXPECT_NE(err({}, R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 4})")
                .find("!= train_micro_batch_size_per_gpu"),
            std::string::npos);
  EXPECT_NE(err({}, R"({"scheduler": {"type": "WarmupLR"}})").find("Remove the block"),
            std::string::npos);
  EXPECT_EQ(err({"--global-batch-size", "32"}, R"({"train_batch_size": 32})"), "");
}

// A key given twice in the file: DeepSpeed refuses it (its config reader's object_pairs_hook), and
// so does trident, naming the key; before, the second value won silently.
TEST(DeepSpeedJson, AKeyGivenTwiceIsRefused) {
  const fs::path p = fs::temp_directory_path() / ("trident_ds_dup_" + std::to_string(::getpid()));
  std::ofstream(p) << R"({"train_batch_size": 32, "zero_optimization": {"stage": 1, "stage": 3}})";
  TrainConfig c = parse(with({"--deepspeed", "--deepspeed_config", p.string()}), 2, false);
  try {
    apply_deepspeed_config(c, 2);
    ADD_FAILURE() << "accepted";
  } catch (const core::InvalidArgument& e) {
    const std::string m = e.what();
    for (const char* piece : {"--deepspeed_config", "\"stage\"", "twice", "/zero_optimization"}) {
      EXPECT_NE(m.find(piece), std::string::npos) << m;
    }
  }
  fs::remove(p);
}

// Found by fuzz_deepspeed_config (inputs in tests/fuzz/regressions/fuzz_deepspeed_config/):
// values of the wrong type escaped as bare JSON errors, and huge numbers were converted to
// integers with undefined behaviour (or wrapped: a stage of 2^32 + 1 read as 1).
TEST(DeepSpeedJson, HostileValuesAreRefusedNamingTheKey) {
  auto err = [](const char* json) {
    TrainConfig c = parse(with({}), 2, false);
    try {
      apply_deepspeed_json(c, nlohmann::json::parse(json), 2, "ds.json");
    } catch (const core::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto refused = [&](const char* json, const char* fragment) {
    const std::string e = err(json);
    EXPECT_NE(e.find(fragment), std::string::npos) << json << " -> " << e;
    EXPECT_NE(e.find("ds.json"), std::string::npos) << e;
  };
  refused(R"({"train_batch_size": 1e300})", "\"train_batch_size\" must be an integer in [1, ");
  refused(R"({"train_batch_size": -8})", "\"train_batch_size\" must be an integer");
  refused(R"({"zero_optimization": {"stage": 4294967297}})",
          "\"zero_optimization.stage\" must be an integer in [0, 3]");
  refused(R"({"fp16": {"enabled": true, "initial_scale_power": 5000}})",
          "\"fp16.initial_scale_power\" must be an integer in [0, 63]");
  refused(R"({"train_micro_batch_size_per_gpu": 2147483649, "gradient_accumulation_steps": 2})",
          "must be an integer in [1, 2147483648]");
  refused(R"({"train_micro_batch_size_per_gpu": 2147483648, "gradient_accumulation_steps": 2})",
          "exceeds 2^31 sequences per step");
  refused(R"({"fp16": true})", "\"fp16\" must be an object");
  refused(R"({"bf16": {"enabled": "yes"}})", "\"bf16.enabled\" must be true or false");
  refused(R"({"optimizer": "AdamW"})", "\"optimizer\" must be an object");
  refused(R"({"optimizer": {"type": 3}})", "\"optimizer.type\" must be a string");
  refused(R"({"optimizer": {"type": "AdamW", "params": [1]}})",
          "\"optimizer.params\" must be an object");
  refused(R"({"zero_optimization": {"offload_optimizer": {"device": 1}}})",
          "\"zero_optimization.offload_optimizer.device\" must be a string");
  EXPECT_EQ(err(R"({"train_batch_size": 8, "bf16": {"enabled": true}})"), "");
}

// ZeRO-Offload / ZeRO-Infinity blocks map onto --offload-optimizer / --offload-path; parameter
// offload to NVMe is refused by name (not implemented), to the CPU is the identity.
TEST(DeepSpeedJson, OffloadBlocks) {
  TrainConfig c = parse(with({}), 2, false);
  apply_deepspeed_json(c, nlohmann::json::parse(R"({"zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "pin_memory": true,
                            "buffer_count": 4},
      "offload_param": {"device": "cpu"}}})"),
                       2, "ds.json");
  c.finalize(2);
  EXPECT_EQ(c.offload.device, optim::OffloadDevice::kNvme);
  EXPECT_EQ(c.offload.path, "/tmp");
  EXPECT_TRUE(warned(c, "\"zero_optimization.offload_optimizer.buffer_count\""));
  EXPECT_EQ(c.offload_params, "none");

  TrainConfig legacy = parse(with({}), 2, false);
  apply_deepspeed_json(legacy,
                       nlohmann::json::parse(R"({"zero_optimization": {"cpu_offload": true}})"), 2,
                       "ds.json");
  legacy.finalize(2);
  EXPECT_EQ(legacy.offload.device, optim::OffloadDevice::kCpu);

  auto err = [](std::vector<std::string> flags, const char* json) {
    TrainConfig t = parse(with(flags), 2, false);
    try {
      apply_deepspeed_json(t, nlohmann::json::parse(json), 2, "ds.json");
      t.finalize(2);
    } catch (const core::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // offload_param nvme is --offload-params nvme (its nvme_path the shared --offload-path):
  // ZeRO-3 only, refused otherwise with the flag's name and the fix.
  EXPECT_NE(err({}, R"({"zero_optimization": {"offload_param": {"device": "nvme",
                        "nvme_path": "/tmp"}}})")
                .find("--offload-params nvme needs --zero-stage 3"),
            std::string::npos);
  TrainConfig z3 = parse(with({}), 2, false);
  apply_deepspeed_json(z3, nlohmann::json::parse(R"({"zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": "/tmp", "buffer_size": 1e8},
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})"),
                       2, "ds.json");
  z3.finalize(2);
  EXPECT_EQ(z3.offload_params, "nvme");
  EXPECT_EQ(z3.offload.device, optim::OffloadDevice::kNvme);
  EXPECT_EQ(z3.offload.path, "/tmp");
  EXPECT_TRUE(warned(z3, "\"zero_optimization.offload_param.buffer_size\""));
  EXPECT_NE(err({"--zero-stage", "3"},
                R"({"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/a"},
                    "offload_optimizer": {"device": "nvme", "nvme_path": "/b"}}})")
                .find("give both the same nvme_path"),
            std::string::npos);
  EXPECT_NE(err({}, R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})")
                .find("needs --offload-path"),
            std::string::npos);
  EXPECT_NE(err({"--offload-optimizer", "cpu"},
                R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})")
                .find("contradicts --offload-optimizer cpu"),
            std::string::npos);
  EXPECT_NE(err({}, R"({"zero_optimization": {"offload_optimizer": {"device": "disk"}}})")
                .find("must be none, cpu or nvme"),
            std::string::npos);
  EXPECT_NE(err({"--offload-optimizer", "nvme", "--offload-path", "/tmp", "--async-save"}, "{}")
                .find("drop --async-save"),
            std::string::npos);
}

TEST(DeepSpeedJson, ClipGradWithoutGradientClippingIsOff) {
  TrainConfig c = parse(with({"--clip-grad", "1.0"}), 1, false);
  apply_deepspeed_json(c, nlohmann::json::parse("{}"), 1, "ds.json");
  EXPECT_FLOAT_EQ(c.optimizer.clip_grad, 0.0f);
  EXPECT_TRUE(warned(c, "DeepSpeed does not clip"));
}

const char* fake_env(const char* name) {
  static const std::map<std::string, const char*> env = {
      {"WORLD_SIZE", "8"}, {"RANK", "3"}, {"TORCHELASTIC_RUN_ID", "x"}};
  auto it = env.find(name);
  return it == env.end() ? nullptr : it->second;
}
const char* no_env(const char*) { return nullptr; }

TEST(LaunchEnv, TorchrunEnvironmentAroundAnMpiWorldOfOne) {
  const std::string msg = launcher_mismatch(1, fake_env);
  EXPECT_NE(msg.find("torchrun"), std::string::npos);
  EXPECT_NE(msg.find("mpirun -np 8"), std::string::npos);
  EXPECT_EQ(launcher_mismatch(8, fake_env), "");  // MPI started 8: fine
  EXPECT_EQ(launcher_mismatch(1, no_env), "");
}

TEST(LaunchEnv, ForeignCheckpointDirectories) {
  const fs::path d = fs::temp_directory_path() / ("trident_foreign_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "megatron" / "iter_0000010" / "mp_rank_00");
  std::ofstream(d / "megatron" / "latest_checkpointed_iteration.txt") << "10";
  std::ofstream(d / "megatron" / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt") << "x";
  EXPECT_NE(describe_foreign_checkpoint((d / "megatron").string()).find("Megatron-LM checkpoint"),
            std::string::npos);
  fs::create_directories(d / "mds" / "global_step10");
  std::ofstream(d / "mds" / "latest_checkpointed_iteration.txt") << "10";
  std::ofstream(d / "mds" / "global_step10" / "layer_01-model_00-model_states.pt") << "x";
  EXPECT_NE(describe_foreign_checkpoint((d / "mds").string()).find("Megatron-DeepSpeed"),
            std::string::npos);
  fs::create_directories(d / "ds");
  std::ofstream(d / "ds" / "latest") << "global_step10";
  EXPECT_NE(describe_foreign_checkpoint((d / "ds").string()).find("DeepSpeed checkpoint"),
            std::string::npos);
  fs::create_directories(d / "trident" / "iter_0000010");
  std::ofstream(d / "trident" / "latest_checkpointed_iteration.txt") << "10";
  std::ofstream(d / "trident" / "iter_0000010" / "manifest.json") << "{}";
  EXPECT_EQ(describe_foreign_checkpoint((d / "trident").string()), "");
  EXPECT_EQ(describe_foreign_checkpoint((d / "empty").string()), "");
  fs::remove_all(d);
}

TEST(LogLines, MegatronAndMegatronDeepSpeedFormats) {
  IterationLog l{.iteration = 10,
                 .train_iters = 200,
                 .consumed_samples = 160,
                 .consumed_tokens = 160 * 1024,
                 .iter_ms = 850.12,
                 .tflops_per_rank = 1.5,
                 .lr = 5e-4,
                 .global_batch_size = 16,
                 .lm_loss = 7.901234,
                 .loss_scale = 1.0,
                 .grad_norm = 1.2345,
                 .skipped = 0,
                 .nan = 0,
                 .samples_per_s = 18.8,
                 .seq_length = 1024};
  EXPECT_TRUE(std::regex_match(
      iteration_log_line(l),
      std::regex(
          R"( \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration       10/     200 \| consumed samples:          160 \| elapsed time per iteration \(ms\): 850\.1 \| learning rate: 5\.000000E-04 \| global batch size:    16 \| lm loss: 7\.901234E\+00 \| loss scale: 1\.0 \| grad norm: 1\.234 \| number of skipped iterations:   0 \| number of nan iterations:   0 \|)")))
      << iteration_log_line(l);
  l.megatron_deepspeed = true;
  EXPECT_EQ(iteration_log_line(l),
            " iteration       10/     200 | consumed samples:          160 | consumed tokens:  "
            "     163840 | elapsed time per iteration (s): 0.85 | learning rate: 5.000E-04 | "
            "global batch size:    16 | lm loss: 7.901234E+00 | loss scale: 1.0 | grad norm: "
            "1.234 | number of skipped iterations:   0 | number of nan iterations:   0 | "
            "samples per second: 18.800 | TFLOPs: 1.50 |");
}

}  // namespace
}  // namespace trident::train

namespace trident::train {
namespace {

TEST(CompatFlags, PretrainedFromHfAndVirtualStages) {
  const fs::path d = fs::temp_directory_path() / ("trident_hf_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::ofstream(d / "tokenizer.json") << "{}";
  TrainConfig c =
      parse(with({"--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", d.string()}));
  EXPECT_EQ(c.tokenizer_type, "HuggingFaceTokenizer");
  EXPECT_EQ(c.tokenizer_model, (d / "tokenizer.json").string());
  EXPECT_NE(error_of(with({"--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path",
                           (d / "missing").string()}))
                .find("no "),
            std::string::npos);
  fs::remove_all(d);
  // 8 layers, pp 2, 2 virtual stages per rank: 2 layers per virtual stage, interleaved.
  c = parse({"--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4",
             "--data-path", "corpus", "--pipeline-model-parallel-size", "2",
             "--virtual-pipeline-model-parallel-size", "2"},
            2);
  EXPECT_EQ(c.num_layers_per_virtual_pipeline_stage, 2);
  EXPECT_EQ(c.pipeline_schedule, "interleaved");
  EXPECT_NE(error_of(with({"--no-pipeline-parallel", "--pipeline-model-parallel-size", "2"}), 2)
                .find("--no-pipeline-parallel"),
            std::string::npos);
}

}  // namespace
}  // namespace trident::train
