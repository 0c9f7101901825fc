// Real-style launch scripts of Megatron-LM and Megatron-DeepSpeed (tests/train/launch_scripts/,
// written for these tests in those projects' style) run through trident with only the launcher
// changed, on the bundled Tiny Shakespeare with GPT-2 BPE and a tiny model. Each run must train
// the schedule Megatron would: the iterations, consumed samples, global batch sizes (ramp
// included) and the learning rate of every iteration are compared with megatron-core's own
// num-microbatches calculator and OptimizerParamScheduler (launch_scripts/megatron_schedule.py),
// skipped FP16 steps included (they must not advance the schedule).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kScripts = fs::path(TRIDENT_SOURCE_DIR) / "tests/train/launch_scripts";

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ref_python() {
  if (const char* p = std::getenv("TRIDENT_REF_PYTHON")) return p;
  return "/opt/trident-pyref/bin/python";
}

struct Step {
  long long iteration = 0, consumed = 0, gbs = 0, skipped = 0;
  double lr = 0;
};

// Megatron-LM's iteration lines (log interval 1: one per iteration).
std::vector<Step> parse_steps(const std::string& log) {
  static const std::regex re(
      R"( iteration +(\d+)/ *\d+ \| consumed samples: +(\d+) \|.*? learning rate: ([0-9.E+-]+) \| global batch size: +(\d+) \|.*number of skipped iterations: +(\d+) \|)");
  std::vector<Step> out;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    Step s;
    s.iteration = std::stoll((*it)[1]);
    s.consumed = std::stoll((*it)[2]);
    s.lr = std::stod((*it)[3]);
    s.gbs = std::stoll((*it)[4]);
    s.skipped = std::stoll((*it)[5]);
    out.push_back(s);
  }
  return out;
}

class LaunchScriptTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("trident_launch_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string cmd =
        std::string(TRIDENT_CLI) + " preprocess --input " +
        (fs::path(TRIDENT_SOURCE_DIR) / "data/tinyshakespeare/input.txt").string() +
        " --output-prefix " + (dir_ / "ts").string() +
        " --tokenizer-type GPT2BPETokenizer --vocab-file " + vocab() + " --merge-file " + merges() +
        " --append-eod --workers 1 > " + (dir_ / "preprocess.log").string() + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read(dir_ / "preprocess.log");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string vocab() {
    return (fs::path(TRIDENT_SOURCE_DIR) / "data/gpt2/gpt2-vocab.json").string();
  }
  static std::string merges() {
    return (fs::path(TRIDENT_SOURCE_DIR) / "data/gpt2/gpt2-merges.txt").string();
  }
  static std::string data() { return (dir_ / "ts_text_document").string(); }

  // Runs launch_scripts/NAME with `np` MPI ranks; returns the whole output.
  std::string run(const std::string& name, int np, const std::vector<std::string>& env,
                  const std::vector<std::string>& args = {}) {
    const fs::path out = dir_ / name;
    fs::remove_all(out);
    fs::create_directories(out);
    std::string cmd = (kScripts / "run_launch_script.sh").string() + " " + TRIDENT_CLI + " " +
                      std::to_string(np) + " " + (kScripts / name).string() + " " + out.string();
    for (const std::string& e : env) cmd += " '" + e + "'";
    if (!args.empty()) {
      cmd += " --";
      for (const std::string& a : args) cmd += " '" + a + "'";
    }
    const fs::path log = dir_ / (name + ".log");
    cmd += " > " + log.string() + " 2>&1; echo EXIT=$? >> " + log.string();
    std::system(cmd.c_str());
    return read(log);
  }

  // megatron-core's schedule for `spec`, with the iterations trident skipped.
  nlohmann::json reference(nlohmann::json spec, const std::vector<Step>& steps) {
    spec["skipped"] = nlohmann::json::array();
    for (const Step& s : steps) {
      if (s.skipped > 0) spec["skipped"].push_back(s.iteration);
    }
    const fs::path in = dir_ / "spec.json", out = dir_ / "ref.json";
    std::ofstream(in) << spec.dump();
    const std::string cmd = ref_python() + " " + (kScripts / "megatron_schedule.py").string() +
                            " " + in.string() + " " + out.string() + " > " +
                            (dir_ / "ref.log").string() + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << read(dir_ / "ref.log");
    return nlohmann::json::parse(read(out));
  }

  void expect_schedule(const std::vector<Step>& steps, const nlohmann::json& ref) {
    ASSERT_EQ(steps.size(), ref["steps"].size()) << "iterations trained vs Megatron's";
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const nlohmann::json& r = ref["steps"][i];
      SCOPED_TRACE("iteration " + std::to_string(steps[i].iteration));
      EXPECT_EQ(steps[i].iteration, r[0].get<long long>());
      EXPECT_EQ(steps[i].consumed, r[1].get<long long>());
      EXPECT_EQ(steps[i].gbs, r[2].get<long long>());
      // The log prints %.6E: compare to that precision.
      EXPECT_NEAR(steps[i].lr, r[3].get<double>(), 1e-6 * std::abs(r[3].get<double>()) + 1e-30);
    }
  }

  static fs::path dir_;
};

fs::path LaunchScriptTest::dir_;

void expect_ran(const std::string& log) {
  EXPECT_NE(log.find("EXIT=0"), std::string::npos) << log;
  EXPECT_NE(log.find("on test set | lm loss value: "), std::string::npos) << log;
}

TEST_F(LaunchScriptTest, Bloom176bSlurmWithInlineDeepSpeedJson) {
  // Pipeline 2 (BLOOM: 12), the batch ramp, sample-based schedule, --bf16 with the JSON's bf16.
  const std::string log = run("bloom_176b_slurm.sh", 2,
                              {"DATA_OUTPUT_PATH=" + (dir_ / "bloom_out").string(),
                               "DATA_PATH=" + data(),
                               "VOCAB_FILE=" + vocab(),
                               "MERGE_FILE=" + merges(),
                               "GPUS_PER_NODE=1",
                               "NNODES=1",
                               "PP_SIZE=2",
                               "TP_SIZE=1",
                               "MICRO_BATCH_SIZE=1",
                               "GLOBAL_BATCH_SIZE=8",
                               "RAMPUP=2 2 1_6",
                               "NLAYERS=2",
                               "NHIDDEN=64",
                               "NHEADS=4",
                               "SEQ_LEN=32",
                               "TRAIN_SAMPLES=4_8",
                               "LR_DECAY_SAMPLES=40",
                               "LR_WARMUP_SAMPLES=4",
                               "PAD_VOCAB_SIZE_TO=50304",
                               "SAVE_INTERVAL=100",
                               "EVAL_INTERVAL=4"});
  expect_ran(log);
  EXPECT_NE(log.find("vocab 50257 (padded 50304)"), std::string::npos);
  for (const char* named : {"--sync-tp-duplicated-parameters", "--distributed-backend nccl",
                            "--deepspeed-activation-checkpointing", "\"steps_per_print\""}) {
    EXPECT_NE(log.find(named), std::string::npos) << "no warning names " << named;
  }
  const std::vector<Step> steps = parse_steps(log);
  expect_schedule(steps, reference({{"global_batch_size", 8},
                                    {"micro_batch_size", 1},
                                    {"data_parallel_size", 1},
                                    {"rampup", {2, 2, 16}},
                                    {"train_samples", 48},
                                    {"lr", 6e-5},
                                    {"min_lr", 6e-6},
                                    {"lr_decay_style", "cosine"},
                                    {"lr_decay_samples", 40},
                                    {"lr_warmup_samples", 4},
                                    {"seq_length", 32}},
                                   steps));
}

TEST_F(LaunchScriptTest, BloomTr11SplitPathsWithNamedValidationSets) {
  // BLOOM's own script style: the data as --train/valid-weighted-split-paths-path files (train
  // 0:0.950 of two datasets, three named validation groups on 0.950:1.0), the ramp, pipeline 2.
  // The index caches trident writes next to the data must be byte for byte those of BigScience's
  // algorithm (tests/data/reference/bigscience_split_paths.py), every validation group must be
  // evaluated and logged under its name at every evaluation, and the schedule must be Megatron's.
  const std::string lines = (dir_ / "tsl").string();
  const std::string cmd =
      std::string(TRIDENT_CLI) + " preprocess --input " +
      (fs::path(TRIDENT_SOURCE_DIR) / "data/tinyshakespeare/input.txt").string() +
      " --output-prefix " + lines + " --text-documents line --tokenizer-type GPT2BPETokenizer" +
      " --vocab-file " + vocab() + " --merge-file " + merges() + " --append-eod --workers 1 > " +
      (dir_ / "preprocess-lines.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read(dir_ / "preprocess-lines.log");
  const std::string blocks = data(), by_line = lines + "_text_document";
  const fs::path train_file = dir_ / "train-splits.txt", valid_file = dir_ / "valid-splits.txt";
  // As BigScience's load_ratios_meg_ds_format.py writes them (one line, quoted groups).
  std::ofstream(train_file) << "\"train: 0.7 0:0.950 " << blocks << ", 0.3 0:0.950 " << by_line
                            << "\"\n";
  std::ofstream(valid_file) << "\"valid: 0.7 0.950:1.0 " << blocks << ", 0.3 0.950:1.0 " << by_line
                            << "\" \"valid_blocks: 1 0.950:1.0 " << blocks
                            << "\" \"valid_lines: 1 0.950:1.0 " << by_line << "\"\n";
  const std::string log = run("bloom_tr11_176b_ml_split_paths.sh", 2,
                              {"DATA_OUTPUT_PATH=" + (dir_ / "tr11_out").string(),
                               "MEGATRON_DEEPSPEED_REPO=" + (dir_ / "tr11_repo").string(),
                               "TRAIN_DATA_PATH=" + train_file.string(),
                               "VALID_DATA_PATH=" + valid_file.string(),
                               "VOCAB_FILE=" + vocab(),
                               "MERGE_FILE=" + merges(),
                               "GPUS_PER_NODE=1",
                               "SLURM_NNODES=1",
                               "PP_SIZE=2",
                               "TP_SIZE=1",
                               "MICRO_BATCH_SIZE=1",
                               "GLOBAL_BATCH_SIZE=8",
                               "RAMPUP=2 2 1_6",
                               "NLAYERS=2",
                               "NHIDDEN=64",
                               "NHEADS=4",
                               "SEQ_LEN=32",
                               "TRAIN_SAMPLES=4_8",
                               "LR_DECAY_SAMPLES=40",
                               "LR_WARMUP_SAMPLES=4",
                               "PAD_VOCAB_SIZE_TO=50304",
                               "SAVE_INTERVAL=100",
                               "EVAL_INTERVAL=4",
                               "EVAL_ITERS=1"});
  EXPECT_NE(log.find("EXIT=0"), std::string::npos) << log;
  const std::vector<Step> steps = parse_steps(log);
  const nlohmann::json ref = reference({{"global_batch_size", 8},
                                        {"micro_batch_size", 1},
                                        {"data_parallel_size", 1},
                                        {"rampup", {2, 2, 16}},
                                        {"train_samples", 48},
                                        {"lr", 6e-5},
                                        {"min_lr", 6e-6},
                                        {"lr_decay_style", "cosine"},
                                        {"lr_decay_samples", 40},
                                        {"lr_warmup_samples", 4},
                                        {"seq_length", 32}},
                                       steps);
  expect_schedule(steps, ref);
  const long long train_iters = ref["train_iters"].get<long long>();

  // Every validation group, by name, at every evaluation and at the end (BigScience's lines).
  const std::vector<std::string> names = {"valid", "valid_blocks", "valid_lines"};
  std::map<std::string, std::vector<double>> losses;
  for (const std::string& name : names) {
    const std::regex re(
        "\\n[^\\n]*\\] " + name +
        R"( loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+) \| lm loss PPL: ([0-9.E+-]+) \| )");
    std::vector<long long> at;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
         ++it) {
      at.push_back(std::stoll((*it)[1]));
      losses[name].push_back(std::stod((*it)[2]));
      EXPECT_NEAR(std::stod((*it)[3]), std::exp(std::min(losses[name].back(), 20.0)),
                  1e-5 * std::stod((*it)[3]));
    }
    std::vector<long long> want;
    for (long long i = 4; i <= train_iters; i += 4) want.push_back(i);
    EXPECT_EQ(at, want) << name << " evaluated at other iterations";
    EXPECT_NE(log.find("] " + name + " loss at the end of training for val data | lm loss value: "),
              std::string::npos)
        << name;
  }
  EXPECT_EQ(log.find(" validation loss at "), std::string::npos)
      << "Megatron-LM's unnamed line where BigScience's named ones are expected";
  EXPECT_NE(losses["valid_blocks"], losses["valid_lines"]) << "the groups read the same data?";

  // TensorBoard: BigScience's per-name scalars.
  const fs::path tb = dir_ / "tr11_tb.json";
  const std::string read_tb =
      ref_python() + " " +
      (fs::path(TRIDENT_SOURCE_DIR) / "tests/train/reference/read_tensorboard.py").string() + " " +
      (dir_ / "tr11_out/tr11-176B-ml-logs/tensorboard/main").string() + " " + tb.string();
  ASSERT_EQ(std::system(read_tb.c_str()), 0);
  const nlohmann::json tags = nlohmann::json::parse(read(tb))["tags"];
  for (const std::string& name : names) {
    for (const char* t : {"/lm loss validation", "/lm loss validation vs samples",
                          "/lm loss validation vs tokens", "/lm loss validation ppl"}) {
      const std::string tag = "lm-loss-validation/" + name + t;
      ASSERT_TRUE(tags.contains(tag)) << tag << " missing from " << tags.dump();
      EXPECT_EQ(tags[tag].size(), losses[name].size() + 1) << tag;  // + the end of training
    }
    const std::string tag = "lm-loss-validation/" + name + "/lm loss validation";
    EXPECT_EQ(tags[tag][0][0].get<long long>(), 4);
    EXPECT_NEAR(tags[tag][0][1].get<double>(), losses[name][0], 1e-6 * losses[name][0]);
  }

  // The index caches next to the data: BigScience's names and bytes.
  nlohmann::json spec;
  spec["cases"] = {{{"name", "tr11"},
                    {"out_dir", (dir_ / "bigscience_ref").string()},
                    {"train_file", train_file.string()},
                    {"valid_file", valid_file.string()},
                    {"seq_length", 32},
                    {"seed", 42},
                    {"sizes", {48, (train_iters / 4 + 1) * 1 * 8, 8}},
                    {"num_dump", 2}}};
  std::ofstream(dir_ / "bigscience_spec.json") << spec.dump();
  const std::string ref_cmd =
      ref_python() + " " +
      (fs::path(TRIDENT_SOURCE_DIR) / "tests/data/reference/bigscience_split_paths.py").string() +
      " " + (dir_ / "bigscience_spec.json").string() + " > " + (dir_ / "bigscience.log").string() +
      " 2>&1";
  ASSERT_EQ(std::system(ref_cmd.c_str()), 0) << read(dir_ / "bigscience.log");
  const nlohmann::json summary =
      nlohmann::json::parse(read(dir_ / "bigscience_ref" / "summary.json"));
  int files = 0;
  for (const auto& [split, groups] : summary["groups"].items()) {
    for (const nlohmann::json& g : groups) {
      for (const nlohmann::json& f : g["files"]) {
        const std::string name = f.get<std::string>();
        ++files;
        EXPECT_TRUE(fs::exists(dir_ / name)) << name << " not written next to the data";
        EXPECT_TRUE(read(dir_ / name) == read(dir_ / "bigscience_ref" / name))
            << name << " differs from BigScience's";
      }
    }
  }
  EXPECT_EQ(files, 3 * (2 + 2 + 1 + 1)) << "train (2 datasets) and 3 validation groups (2, 1, 1)";
}

TEST_F(LaunchScriptTest, MegatronDeepSpeedZeroTokensFp16) {
  // ZeRO-1 over 2 data-parallel ranks, FP16 with DeepSpeed's scaler (2^11), token schedule.
  const std::string log =
      run("megatron_deepspeed_zero.sh", 2,
          {"SEQ_LEN=32", "NUM_LAYERS=2", "HIDDEN_SIZE=64", "NUM_HEADS=4", "GLOBAL_BATCH_SIZE=4",
           "TRAIN_TOKENS=768", "TRAIN_SAMPLES=100", "LR_WARMUP_TOKENS=256", "LR_DECAY_TOKENS=768",
           "NUM_GPUS=2", "MICRO_BATCH_SIZE=1", "LOG_INTERVAL=1", "EVAL_ITERS=1", "EVAL_INTERVAL=3",
           "DATA_PATH=" + data(), "VOCAB_PATH=" + vocab(), "MERGE_PATH=" + merges(),
           "TEMPLATE_JSON=" + (kScripts / "ds_config_gpt_TEMPLATE.json").string(),
           "OUTPUT_HOME=" + (dir_ / "mds_out").string()});
  expect_ran(log);
  EXPECT_NE(log.find("loss scale: 2048.0"), std::string::npos) << "2^initial_scale_power";
  EXPECT_NE(log.find("ZeRO stage 1, dp 2"), std::string::npos);
  const std::vector<Step> steps = parse_steps(log);
  // --train-tokens 768 = 6 iterations of 4 x 32 tokens (--train-samples would allow 25).
  expect_schedule(steps, reference({{"global_batch_size", 4},
                                    {"micro_batch_size", 1},
                                    {"data_parallel_size", 2},
                                    {"rampup", nullptr},
                                    {"train_samples", 100},
                                    {"train_tokens", 768},
                                    {"lr", 6e-4},
                                    {"min_lr", 1e-6},
                                    {"lr_decay_style", "cosine"},
                                    {"lr_warmup_tokens", 256},
                                    {"lr_decay_tokens", 768},
                                    {"seq_length", 32}},
                                   steps));
}

TEST_F(LaunchScriptTest, MegatronLmGpt3Fp16SkippedStepsDoNotAdvanceTheSchedule) {
  // Tensor parallel 2, Megatron's FP16 scaler from 2^32: the first steps overflow and are
  // skipped; the schedule must stand still through them.
  const std::string log =
      run("megatron_lm_gpt3_175b.sh", 2,
          {"NUM_LAYERS=2", "HIDDEN_SIZE=32", "NUM_HEADS=4", "SEQ_LEN=16", "GLOBAL_BATCH_SIZE=4",
           "TRAIN_ITERS=16", "LR_DECAY_ITERS=1_6", "TP=2", "PP=1", "LOG_INTERVAL=1",
           "EVAL_INTERVAL=8", "EVAL_ITERS=1", "SAVE_INTERVAL=100"},
          {(dir_ / "g3_ckpt").string(), (dir_ / "g3_tb").string(), vocab(), merges(), data()});
  expect_ran(log);
  const std::vector<Step> steps = parse_steps(log);
  int skipped = 0;
  for (const Step& s : steps) skipped += s.skipped > 0;
  EXPECT_GT(skipped, 0) << "expected FP16 overflows from a 2^32 loss scale";
  EXPECT_LT(skipped, static_cast<int>(steps.size())) << "every step skipped: nothing compared";
  // TensorBoard's reader sees Megatron's scalars, the same values as the log lines.
  const fs::path tb = dir_ / "g3_tb.json";
  const std::string cmd =
      ref_python() + " " +
      (fs::path(TRIDENT_SOURCE_DIR) / "tests/train/reference/read_tensorboard.py").string() + " " +
      (dir_ / "g3_tb").string() + " " + tb.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const nlohmann::json tags = nlohmann::json::parse(read(tb))["tags"];
  for (const char* t : {"learning-rate", "learning-rate vs samples", "batch-size", "loss-scale",
                        "grad-norm", "lm loss", "lm loss vs samples", "lm loss validation"}) {
    EXPECT_TRUE(tags.contains(t)) << t << " missing from " << tags.dump();
  }
  ASSERT_EQ(tags["learning-rate"].size(), steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(tags["learning-rate"][i][0].get<long long>(), steps[i].iteration);
    EXPECT_NEAR(tags["learning-rate"][i][1].get<double>(), steps[i].lr, 1e-6 * steps[i].lr + 1e-12);
    EXPECT_EQ(tags["learning-rate vs samples"][i][0].get<long long>(), steps[i].consumed);
    EXPECT_EQ(tags["batch-size"][i][1].get<double>(), static_cast<double>(steps[i].gbs));
  }
  // lm loss only for the iterations whose update was applied (as Megatron's total_loss_dict).
  EXPECT_EQ(tags["lm loss"].size(), steps.size() - static_cast<std::size_t>(skipped));
  expect_schedule(steps, reference({{"global_batch_size", 4},
                                    {"micro_batch_size", 1},
                                    {"data_parallel_size", 1},
                                    {"rampup", nullptr},
                                    {"train_iters", 16},
                                    {"lr", 6e-5},
                                    {"min_lr", 6e-6},
                                    {"lr_decay_style", "cosine"},
                                    {"lr_warmup_fraction", 0.001},
                                    {"lr_decay_iters", 16},
                                    {"seq_length", 16}},
                                   steps));
}

TEST_F(LaunchScriptTest, MegatronLmGpt3StepBatchSizeSchedule) {
  // Megatron-LM's current GPT-3 example: --step-batch-size-schedule with token thresholds (here
  // 0, 500 and 1600 tokens of 32: samples 0, 15 and 50) next to --global-batch-size (its last
  // stage), 2 data-parallel ranks, FP16 from a 2^32 loss scale (the first steps are skipped). The
  // example's unquoted bash array splits the schedule into words, which trident joins back.
  // Batch sizes, consumed samples and learning rates must be megatron-core 0.19.2's
  // StepBatchsizeNumMicroBatchesCalculator's, with Megatron's scheduler.
  const std::string log =
      run("megatron_lm_gpt3_175b_step_schedule.sh", 2,
          {"NUM_LAYERS=2", "HIDDEN_SIZE=32", "NUM_HEADS=4", "SEQ_LEN=32", "GLOBAL_BATCH_SIZE=8",
           "STEP_SCHEDULE=0:2 0.5K:4 1.6k:8", "TRAIN_ITERS=40", "LR_DECAY_ITERS=40", "TP=1", "PP=1",
           "LOG_INTERVAL=1", "EVAL_INTERVAL=20", "EVAL_ITERS=1", "SAVE_INTERVAL=100"},
          {(dir_ / "s3_ckpt").string(), (dir_ / "s3_tb").string(), vocab(), merges(), data()});
  expect_ran(log);
  EXPECT_NE(log.find("> using step batch size schedule: 0:2 0.5K:4 1.6k:8"), std::string::npos);
  EXPECT_NE(log.find(">= 1,600 tokens (50 samples) -> batch_size=8, num_microbatches=4"),
            std::string::npos);
  EXPECT_NE(log.find("Megatron-LM refuses the pair"), std::string::npos)
      << "no warning says that Megatron-LM refuses --global-batch-size with the schedule";
  const std::vector<Step> steps = parse_steps(log);
  std::set<long long> sizes;
  int skipped = 0;
  for (const Step& st : steps) {
    sizes.insert(st.gbs);
    skipped += st.skipped > 0;
  }
  EXPECT_EQ(sizes, (std::set<long long>{2, 4, 8})) << "every stage must be trained";
  EXPECT_LT(skipped + 10, static_cast<int>(steps.size())) << "too few applied steps to compare";
  expect_schedule(steps, reference({{"global_batch_size", 8},
                                    {"micro_batch_size", 1},
                                    {"data_parallel_size", 2},
                                    {"step_batch_size_schedule", "0:2 0.5K:4 1.6k:8"},
                                    {"train_iters", 40},
                                    {"lr", 6e-5},
                                    {"min_lr", 6e-6},
                                    {"lr_decay_style", "cosine"},
                                    {"lr_warmup_fraction", 0.001},
                                    {"lr_decay_iters", 40},
                                    {"seq_length", 32}},
                                   steps));
}

TEST_F(LaunchScriptTest, MegatronLm2021OldFlagNames) {
  // Pipeline 2, the 2021 names (--checkpoint-activations, --DDP-impl, --data-impl, ...).
  const std::string log =
      run("megatron_lm_2021_gpt_mp.sh", 2,
          {"TP=1", "PP=2", "NUM_LAYERS=2", "HIDDEN=32", "HEADS=4", "MBS=1", "GBS=4", "SEQ=16",
           "ITERS=4", "DECAY_ITERS=4", "CHECKPOINT_PATH=" + (dir_ / "m21_ckpt").string(),
           "DATA_PATH=" + data(), "VOCAB=" + vocab(), "MERGES=" + merges(), "LOG_INTERVAL=1",
           "SAVE_INTERVAL=100", "EVAL_INTERVAL=2", "EVAL_ITERS=1"});
  expect_ran(log);
  EXPECT_NE(log.find("--DDP-impl local: accepted, no effect"), std::string::npos);
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(recompute_granularity \.+ full)")));
  EXPECT_EQ(parse_steps(log).size(), 4u);
}

}  // namespace
