// Distributed training is proven by equivalence: `trident train` under mpirun in a TP x PP x DP
// layout runs 10 iterations of a tiny GPT (FP32) and must give the losses and the final weights
// of the same run on one process.
//
// Tolerances (FP32, different summation orders): every iteration's loss within 1e-6 relative;
// every parameter tensor within max |x - ref| / max |ref| <= 2e-5 after 10 AdamW steps
// (measured: losses within 1e-8, parameters within 3e-6).
// Note [Well-conditioned Adam for equivalence]: some gradients are zero in exact arithmetic (the
// key bias: softmax ignores a constant added to a row of scores), so FP32 leaves rounding noise
// there whose sign differs between layouts, and Adam turns any sign into a step of size lr. The
// runs use --adam-eps 1e-5, which damps updates from noise-level gradients (1e-9) to 1e-4 lr
// while real gradients (1e-4 and up) update normally.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/tensor_file.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/data/indexed_dataset.h"
#include "trident/model/generate.h"
#include "trident/model/param_table.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

struct Layout {
  std::string name;
  int np = 1;
  std::vector<std::string> flags;
  int tp = 1;
  // Model flags shared with the single-process reference run it is compared with.
  std::string model_flags;
  std::string shell_prefix;     // np = 1: before the command (e.g. a ulimit)
  std::string data = "corpus";  // the dataset under dir()
};

class Equivalence : public ::testing::Test {
 protected:
  static fs::path dir() {
    return fs::temp_directory_path() / ("trident_equivalence_" + std::to_string(::getpid()));
  }
  static void TearDownTestSuite() { fs::remove_all(dir()); }

  static void SetUpTestSuite() {
    fs::remove_all(dir());
    fs::create_directories(dir());
    data::IndexedDatasetBuilder builder((dir() / "corpus").string(), data::TokenDType::kU16);
    std::mt19937 rng(3);
    for (int doc = 0; doc < 200; ++doc) {
      std::vector<std::int32_t> ids(30 + doc % 23);
      // A learnable corpus: runs of increasing ids with noise.
      std::int32_t t = static_cast<std::int32_t>(rng() % 300);
      for (auto& x : ids) {
        x = (rng() % 4 == 0) ? static_cast<std::int32_t>(rng() % 300) : t;
        t = (t + 1) % 300;
      }
      builder.add_sequence(ids);
      builder.end_document();
    }
    builder.finalize();
    // Short documents, each ended by the end-of-document token (NullTokenizer: id 300): every
    // 17-token sample holds several (--reset-position-ids, --reset-attention-mask).
    data::IndexedDatasetBuilder docs((dir() / "corpus_docs").string(), data::TokenDType::kU16);
    for (int doc = 0; doc < 600; ++doc) {
      std::vector<std::int32_t> ids(2 + doc % 9);
      std::int32_t t = static_cast<std::int32_t>(rng() % 300);
      for (auto& x : ids) {
        x = (rng() % 4 == 0) ? static_cast<std::int32_t>(rng() % 300) : t;
        t = (t + 1) % 300;
      }
      ids.push_back(300);
      docs.add_sequence(ids);
      docs.end_document();
    }
    docs.finalize();
    ASSERT_EQ(train({"reference", 1, {}, 1}), 0);
  }

  static std::string run_dir(const std::string& name) { return (dir() / name).string(); }

  // Runs `trident train` (under mpirun when np > 1) and returns its exit code.
  static int train(const Layout& l) {
    const std::string cmd = command(l);
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::ifstream log(run_dir(l.name) + "/log.txt");
      std::cerr << "command failed: " << cmd << "\n" << log.rdbuf();
    }
    return rc;
  }

  // The shell command of train(l), its output going to run_dir(l.name)/log.txt.
  static std::string command(const Layout& l) {
    const std::string out = run_dir(l.name);
    fs::create_directories(out);
    std::string cmd;
    if (l.np > 1) {
      cmd = std::string(
                "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 "
                "OMP_NUM_THREADS=1 ") +
            TRIDENT_MPIEXEC + " -np " + std::to_string(l.np) + " ";
    } else {
      cmd = l.shell_prefix + "OMP_NUM_THREADS=1 ";
    }
    cmd += std::string(TRIDENT_CLI) +
           " train --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16"
           " --micro-batch-size 2 --global-batch-size 16 --train-iters 10 --lr 3e-3"
           " --lr-warmup-iters 2 --lr-decay-style cosine --min-lr 3e-4 --weight-decay 0.1"
           " --clip-grad 1.0 --adam-eps 1e-5 --init-method-std 0.05 --seed 9"
           " --tokenizer-type NullTokenizer --vocab-size 300 --split 98,2,0"
           " --data-path " +
           (dir() / l.data).string() + " --data-cache-path " + (dir() / "cache").string() +
           " --log-interval 1 --eval-interval 100 --eval-iters 0 --peak-tflops 1"
           " --hidden-dropout 0 --attention-dropout 0"
           " --make-vocab-size-divisible-by " +
           std::to_string(128 / l.tp) + " --save " + out + "/ckpt --metrics-jsonl " + out +
           "/metrics.jsonl";
    for (const std::string& f : l.flags) cmd += " " + f;
    if (!l.model_flags.empty()) cmd += " " + l.model_flags;
    cmd += " > " + out + "/log.txt 2>&1";
    return cmd;
  }

  static std::vector<double> losses(const std::string& name) {
    std::vector<double> out;
    std::ifstream in(run_dir(name) + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("split")) out.push_back(j["lm_loss"]);
    }
    return out;
  }

  // Run `name`'s losses against `ref`, each within tol relative: the largest relative difference.
  static double losses_within(const std::string& name, const std::vector<double>& ref, double tol) {
    const auto b = losses(name);
    EXPECT_EQ(b.size(), ref.size()) << name;
    double worst = 0;
    for (std::size_t i = 0; i < std::min(b.size(), ref.size()); ++i) {
      EXPECT_NEAR(b[i], ref[i], tol * ref[i]) << name << " iteration " << i + 1;
      worst = std::max(worst, std::abs(b[i] - ref[i]) / ref[i]);
    }
    return worst;
  }

  static std::vector<float> final_params(const std::string& name, model::ParamTable& table,
                                         const std::string& model_flags) {
    model::ModelConfig c;
    if (model_flags.find("--model bloom") != std::string::npos) {
      c.position_embedding = model::PositionEmbedding::kAlibi;
      c.embed_layernorm = true;
    }
    if (model_flags.find("--model llama") != std::string::npos) {  // as kLlama below
      c.normalization = model::Normalization::kRmsNorm;
      c.position_embedding = model::PositionEmbedding::kRope;
      c.swiglu = true;
      c.untie_embeddings_and_output_weights = true;
      c.add_bias_linear = false;
      const std::size_t at = model_flags.find("--num-query-groups ");
      c.num_query_groups = std::stoi(model_flags.substr(at + 19));
    }
    // The mixture-of-experts flags of kMoe / kMoeDropping below (the table's shapes).
    auto flag = [&](const std::string& f, std::int64_t otherwise) -> std::int64_t {
      const std::size_t at = model_flags.find(f + " ");
      return at == std::string::npos ? otherwise
                                     : std::stoll(model_flags.substr(at + f.size() + 1));
    };
    if (model_flags.find("--num-experts ") != std::string::npos) {
      c.swiglu = true;
      c.add_bias_linear = false;
      c.num_experts = flag("--num-experts", 0);
      c.moe_router_topk = flag("--moe-router-topk", 2);
      c.moe_ffn_hidden_size = flag("--moe-ffn-hidden-size", 0);
      // An integer or a quoted pattern ('[0,1,1,0]').
      const std::size_t freq = model_flags.find("--moe-layer-freq ");
      if (freq != std::string::npos) {
        std::string v = model_flags.substr(freq + 17);
        v = v.substr(0, v.find(' '));
        std::erase(v, '\'');
        c.set_moe_layer_freq(v);
      }
      c.moe_shared_expert_intermediate_size = flag("--moe-shared-expert-intermediate-size", 0);
      c.moe_shared_expert_gate = model_flags.find("--moe-shared-expert-gate") != std::string::npos;
      c.moe_router_enable_expert_bias =
          model_flags.find("--moe-router-enable-expert-bias") != std::string::npos;
      if (c.moe_router_enable_expert_bias) {
        c.moe_router_score_function = model::MoeScoreFunction::kSigmoid;
      }
    }
    c.num_layers = 4;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.seq_length = 16;
    c.vocab_size = 301;  // NullTokenizer: ids 0..299 plus the end-of-document id
    c.make_vocab_size_divisible_by = 128;
    table = model::build_gpt_param_table(c);
    std::vector<float> flat(static_cast<std::size_t>(table.total_numel));
    ckpt::load_full_params(run_dir(name) + "/ckpt", -1, table, flat.data());
    return flat;
  }

  // The single-process run with the same model flags (computed once per flag set).
  static std::string reference_for(const Layout& l) {
    if (l.model_flags.empty() && l.data == "corpus") return "reference";
    std::string name = "reference";
    for (char ch : l.model_flags + l.data)
      name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    if (!fs::exists(run_dir(name) + "/metrics.jsonl")) {
      EXPECT_EQ(train({name, 1, {}, 1, l.model_flags, "", l.data}), 0) << name;
    }
    return name;
  }

  // Note [Lion and the key bias]: the key part of the QKV bias has a zero gradient in exact
  // arithmetic (softmax is invariant to a constant added to a row's scores), so what each layout
  // computes there is rounding noise (~1e-9) in a different order. AdamW divides it by
  // sqrt(v) + eps and barely moves; Lion steps by lr * sign(noise), so the key bias wanders by
  // +-lr per step differently in each layout, without any effect on the loss. Its elements are
  // held to that bound (2 x the sum of the learning rates, 10 steps of at most --lr 3e-3); the
  // query and value parts keep the 2e-5 tolerance. Megatron's layout per head: [q | k | v], each
  // of the head dimension (here 8 = 32 / 4 heads).
  static void check_lion_key_bias(const std::vector<float>& a, const std::vector<float>& b,
                                  const model::ParamSpec& p, const std::string& name) {
    constexpr std::int64_t kHeadDim = 8;
    double scale = 0, worst_other = 0, worst_key = 0;
    for (std::int64_t i = 0; i < p.numel; ++i) {
      scale =
          std::max(scale, std::abs(static_cast<double>(a[static_cast<std::size_t>(p.offset + i)])));
    }
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const std::size_t k = static_cast<std::size_t>(p.offset + i);
      const double d = std::abs(static_cast<double>(a[k]) - b[k]);
      if ((i / kHeadDim) % 3 == 1) {
        worst_key = std::max(worst_key, d);
      } else {
        worst_other = std::max(worst_other, d);
      }
    }
    std::printf("%s: %s: key part max |diff| %.2e, query and value parts %.2e\n", name.c_str(),
                p.name.c_str(), worst_key, worst_other);
    EXPECT_LE(worst_key, 2 * 10 * 3e-3) << name << ": " << p.name << " (key part)";
    EXPECT_LE(worst_other, 2e-5 * scale) << name << ": " << p.name << " (query and value parts)";
  }

  void expect_equivalent(const Layout& l) {
    const std::string ref_name = reference_for(l);
    ASSERT_EQ(train(l), 0) << l.name;
    const std::vector<double> ref = losses(ref_name), got = losses(l.name);
    ASSERT_EQ(ref.size(), 10u);
    ASSERT_EQ(got.size(), 10u) << l.name;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(got[i], ref[i], 1e-6 * ref[i]) << l.name << " iteration " << i + 1;
    }
    EXPECT_LT(ref.back(), ref.front());
    model::ParamTable table;
    const std::vector<float> a = final_params(ref_name, table, l.model_flags);
    const std::vector<float> b = final_params(l.name, table, l.model_flags);
    double worst = 0;
    std::string worst_name;
    const bool lion = l.model_flags.find("--optimizer lion") != std::string::npos;
    for (const model::ParamSpec& p : table.params) {
      double diff = 0, scale = 0;
      for (std::int64_t i = 0; i < p.numel; ++i) {
        const std::size_t k = static_cast<std::size_t>(p.offset + i);
        diff = std::max(diff, std::abs(static_cast<double>(a[k]) - b[k]));
        scale = std::max(scale, std::abs(static_cast<double>(a[k])));
      }
      const double rel = scale > 0 ? diff / scale : diff;
      if (lion && p.name.ends_with("query_key_value.bias")) {
        check_lion_key_bias(a, b, p, l.name);
        continue;
      }
      EXPECT_LE(rel, 2e-5) << l.name << ": " << p.name;
      if (rel > worst) {
        worst = rel;
        worst_name = p.name;
      }
    }
    std::printf(
        "%s: max loss rel diff %.2e, worst parameter %s rel diff %.2e\n", l.name.c_str(),
        [&] {
          double w = 0;
          for (std::size_t i = 0; i < ref.size(); ++i)
            w = std::max(w, std::abs(got[i] - ref[i]) / ref[i]);
          return w;
        }(),
        worst_name.c_str(), worst);
  }
};

TEST_F(Equivalence, DataParallel2) { expect_equivalent({"dp2", 2, {}, 1}); }
TEST_F(Equivalence, DataParallel4) { expect_equivalent({"dp4", 4, {}, 1}); }
TEST_F(Equivalence, TensorParallel2) {
  expect_equivalent({"tp2", 2, {"--tensor-model-parallel-size 2"}, 2});
}
TEST_F(Equivalence, TensorParallel4) {
  expect_equivalent({"tp4", 4, {"--tensor-model-parallel-size 4"}, 4});
}
TEST_F(Equivalence, TensorParallel2DataParallel2) {
  expect_equivalent({"tp2dp2", 4, {"--tensor-model-parallel-size 2"}, 2});
}
TEST_F(Equivalence, TensorParallel2SequenceParallel) {
  expect_equivalent({"tp2sp", 2, {"--tensor-model-parallel-size 2 --sequence-parallel"}, 2});
}
TEST_F(Equivalence, TensorParallel4SequenceParallelDataParallel2) {
  expect_equivalent({"tp4spdp2", 8, {"--tensor-model-parallel-size 4 --sequence-parallel"}, 4});
}
TEST_F(Equivalence, Pipeline2OneF1B) {
  expect_equivalent({"pp2", 2, {"--pipeline-model-parallel-size 2"}, 1});
}
TEST_F(Equivalence, Pipeline4OneF1B) {
  expect_equivalent({"pp4", 4, {"--pipeline-model-parallel-size 4"}, 1});
}
TEST_F(Equivalence, Pipeline2GPipe) {
  expect_equivalent(
      {"pp2gpipe", 2, {"--pipeline-model-parallel-size 2 --pipeline-schedule gpipe"}, 1});
}
TEST_F(Equivalence, Pipeline2Interleaved) {
  expect_equivalent({"pp2v2",
                     2,
                     {"--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"},
                     1});
}
TEST_F(Equivalence, Pipeline2UnevenSplit) {
  expect_equivalent({"pp2uneven",
                     2,
                     {"--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1"},
                     1});
}
TEST_F(Equivalence, ThreeD) {
  expect_equivalent(
      {"tp2pp2dp2", 8, {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"}, 2});
}
// ZeRO: sharded optimizer state (1), gradients (2) and parameters (3) give the same training.
// A small --ddp-bucket-size makes several buckets; 3 ranks make shards that do not divide the
// parameter count.
TEST_F(Equivalence, Zero1DataParallel2) {
  expect_equivalent({"zero1dp2", 2, {"--zero-stage 1 --ddp-bucket-size 5000"}, 1});
}
TEST_F(Equivalence, Zero2DataParallel4) {
  expect_equivalent({"zero2dp4", 4, {"--zero-stage 2"}, 1});
}
TEST_F(Equivalence, Zero3DataParallel2) {
  expect_equivalent({"zero3dp2", 2, {"--zero-stage 3"}, 1});
}
TEST_F(Equivalence, Zero3DataParallel4) {
  expect_equivalent({"zero3dp4", 4, {"--zero-stage 3"}, 1});
}
TEST_F(Equivalence, ZeroStagesOnThreeRanks) {
  for (int stage = 0; stage <= 3; ++stage) {
    expect_equivalent({"zero" + std::to_string(stage) + "dp3",
                       3,
                       {"--zero-stage " + std::to_string(stage) + " --ddp-bucket-size 3000"},
                       1,
                       "--global-batch-size 12"});
  }
}
TEST_F(Equivalence, ThreeDZero1) {
  expect_equivalent({"tp2pp2dp2zero1",
                     8,
                     {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                      "--use-distributed-optimizer"},
                     2});
}
TEST_F(Equivalence, PipelineZero2And3) {
  // DeepSpeed refuses ZeRO >= 2 with pipeline parallelism; here the per-layer reduction runs in
  // every micro-batch of the schedule (docs/parallelism.md explains the cost).
  expect_equivalent({"pp2dp2zero2", 4, {"--pipeline-model-parallel-size 2 --zero-stage 2"}, 1});
  expect_equivalent({"tp2pp2dp2zero3sp",
                     8,
                     {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                      "--zero-stage 3 --sequence-parallel"},
                     2});
}
TEST_F(Equivalence, Zero3ResumeIsBitwise) {
  ASSERT_EQ(train({"zero3_full", 2, {"--zero-stage 3"}, 1}), 0);
  // --exit-interval is a planned stop: exit code 0 (docs/failures-and-recovery.md).
  ASSERT_EQ(WEXITSTATUS(train({"zero3_part", 2, {"--zero-stage 3 --exit-interval 5"}, 1})), 0);
  ASSERT_EQ(
      train({"zero3_part", 2, {"--zero-stage 3 --load " + run_dir("zero3_part") + "/ckpt"}, 1}), 0);
  const auto a = losses("zero3_full"), b = losses("zero3_part");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
}

// The chunked head (--loss-chunk-rows: output layer, loss and the output layer's backward a chunk
// of rows at a time) against the reference's single chunk of all 32 rows (the auto size for this
// vocabulary): chunks that do not divide the rows, under tp + SP and under a pipeline with ZeRO-3.
TEST_F(Equivalence, ChunkedLossTensorParallel2SequenceParallel) {
  expect_equivalent({"chunk5_tp2sp",
                     2,
                     {"--tensor-model-parallel-size 2 --sequence-parallel --loss-chunk-rows 5"},
                     2});
}
TEST_F(Equivalence, ChunkedLossPipeline2Zero3) {
  expect_equivalent({"chunk7_pp2dp2zero3",
                     4,
                     {"--pipeline-model-parallel-size 2 --zero-stage 3 --loss-chunk-rows 7 "
                      "--pipeline-schedule gpipe"},
                     1});
}
TEST_F(Equivalence, MaterialisedLogitsDataParallel2) {
  expect_equivalent({"logits_dp2", 2, {"--loss-chunk-rows 0"}, 1});
}

// BF16 mixed precision in 3D and with ZeRO + sequence parallelism: the same losses as one BF16
// process within 1e-4 relative over 10 iterations (measured up to 2e-5): BF16 rounding of operands
// that differ in their last FP32 bits (other summation orders) can move by one BF16 ulp, and those
// differences grow slowly with training.
TEST_F(Equivalence, Bf16Layouts) {
  const std::string bf16 = "--bf16";
  const std::string ref = reference_for({"x", 1, {}, 1, bf16});
  for (const Layout& l :
       {Layout{"bf16_tp2pp2dp2",
               8,
               {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"},
               2,
               bf16},
        Layout{"bf16_tp2dp2zero2sp",
               4,
               {"--tensor-model-parallel-size 2 --zero-stage 2 --sequence-parallel"},
               2,
               bf16},
        Layout{
            "bf16_tp2chunk5", 2, {"--tensor-model-parallel-size 2 --loss-chunk-rows 5"}, 2, bf16},
        Layout{"bf16_cp2tp2sp",
               4,
               {"--context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel"},
               2,
               bf16},
        Layout{
            "bf16_uly2dp2zero1", 4, {"--ds-sequence-parallel-size 2 --zero-stage 1"}, 1, bf16}}) {
    ASSERT_EQ(train(l), 0) << l.name;
    const auto a = losses(ref), b = losses(l.name);
    ASSERT_EQ(b.size(), a.size());
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(b[i], a[i], 1e-4 * a[i]) << l.name;
      worst = std::max(worst, std::abs(b[i] - a[i]) / a[i]);
    }
    std::printf("%s: max loss rel diff %.2e\n", l.name.c_str(), worst);
  }
  EXPECT_NE(losses(ref).back(), losses("reference").back()) << "BF16 must differ from FP32";
}

// Dropout masks are keyed by global sample, position and head, so they are the same in every
// layout: a run with dropout is equivalent too.
constexpr const char* kDropout = "--hidden-dropout 0.1 --attention-dropout 0.1";
TEST_F(Equivalence, DropoutTensorParallel2SequenceParallelDataParallel2) {
  expect_equivalent(
      {"drop_tp2spdp2", 4, {"--tensor-model-parallel-size 2 --sequence-parallel"}, 2, kDropout});
}
TEST_F(Equivalence, DropoutChangesTheRun) {
  // The dropout reference really drops: its losses differ from the run without dropout.
  const std::string ref = reference_for({"x", 1, {}, 1, kDropout});
  EXPECT_NE(losses(ref)[0], losses("reference")[0]);
}
TEST_F(Equivalence, DropoutPipeline2Interleaved) {
  expect_equivalent({"drop_pp2v2",
                     2,
                     {"--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1"},
                     1,
                     kDropout});
}
TEST_F(Equivalence, BloomThreeD) {
  expect_equivalent({"bloom_tp2pp2dp2",
                     8,
                     {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"},
                     2,
                     "--model bloom"});
}
// Llama (RMSNorm, rotary with Llama 3 scaling, SwiGLU, 2 key/value groups for 4 query heads split
// across tp ranks, untied output layer, no biases): the same layout equivalence as GPT, in 3D, with
// ZeRO-3 and sequence parallelism, and interleaved pipelining with full recomputation.
constexpr const char* kLlama =
    "--model llama --group-query-attention --num-query-groups 2 --use-rope-scaling "
    "--rope-scaling-factor 4";
TEST_F(Equivalence, LlamaLayouts) {
  expect_equivalent({"llama_tp2pp2dp2",
                     8,
                     {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"},
                     2,
                     kLlama});
  expect_equivalent({"llama_tp2dp2zero3sp",
                     4,
                     {"--tensor-model-parallel-size 2 --zero-stage 3 --sequence-parallel"},
                     2,
                     kLlama});
  expect_equivalent({"llama_pp2v2recompute",
                     2,
                     {"--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 "
                      "--recompute-granularity full"},
                     1,
                     kLlama});
}

// Context parallelism (docs/long-context.md): each 16-token sequence in 2 x cp chunks of
// 16 / (2 cp), rank i holding chunks i and 2cp-1-i, attention as a ring of flash blocks merged by
// their log-sum-exp. With tensor parallelism and SP, pipelining with ZeRO-1 over the data-parallel
// ranks, ZeRO-3 over dp x cp, for GPT (learned positions), BLOOM (ALiBi: the key's global
// position) and Llama (rotary positions, grouped-query heads), and with dropout (masks keyed by
// the global token and key/query positions).
TEST_F(Equivalence, ContextParallelLayouts) {
  expect_equivalent({"cp2", 2, {"--context-parallel-size 2"}, 1});
  expect_equivalent({"cp4", 4, {"--context-parallel-size 4"}, 1});
  expect_equivalent({"cp2tp2sp",
                     4,
                     {"--context-parallel-size 2 --tensor-model-parallel-size 2 "
                      "--sequence-parallel"},
                     2});
  expect_equivalent({"cp2pp2dp2zero1",
                     8,
                     {"--context-parallel-size 2 --pipeline-model-parallel-size 2 "
                      "--zero-stage 1 --ddp-bucket-size 5000"},
                     1});
  expect_equivalent({"cp2zero3", 2, {"--context-parallel-size 2 --zero-stage 3"}, 1});
}
TEST_F(Equivalence, ContextParallelModels) {
  expect_equivalent({"bloom_cp2", 2, {"--context-parallel-size 2"}, 1, "--model bloom"});
  expect_equivalent({"bloom_cp4", 4, {"--context-parallel-size 4"}, 1, "--model bloom"});
  expect_equivalent(
      {"llama_cp2tp2", 4, {"--context-parallel-size 2 --tensor-model-parallel-size 2"}, 2, kLlama});
  expect_equivalent({"llama_cp4", 4, {"--context-parallel-size 4"}, 1, kLlama});
  expect_equivalent({"drop_cp2", 2, {"--context-parallel-size 2"}, 1, kDropout});
  expect_equivalent({"drop_cp2tp2sp",
                     4,
                     {"--context-parallel-size 2 --tensor-model-parallel-size 2 "
                      "--sequence-parallel"},
                     2,
                     kDropout});
}

// DeepSpeed-Ulysses (--ds-sequence-parallel-size U): the same chunks of the sequence per rank,
// an all-to-all before the core hands each rank all of the sequence for 1/U of its heads, and
// back after it; with data parallelism and ZeRO-1 (the gradients over dp x U), tensor
// parallelism with SP (the heads split by tp, then by U), BLOOM (each rank's ALiBi slopes),
// Llama (grouped-query heads expanded before the exchange) and dropout (masks by global head).
TEST_F(Equivalence, UlyssesLayouts) {
  expect_equivalent({"uly2", 2, {"--ds-sequence-parallel-size 2"}, 1});
  expect_equivalent({"uly4", 4, {"--ds-sequence-parallel-size 4"}, 1});
  expect_equivalent({"uly2dp2zero1",
                     4,
                     {"--ds-sequence-parallel-size 2 --zero-stage 1 --ddp-bucket-size 5000"},
                     1});
  expect_equivalent({"uly2tp2sp",
                     4,
                     {"--ds-sequence-parallel-size 2 --tensor-model-parallel-size 2 "
                      "--sequence-parallel"},
                     2});
  expect_equivalent({"bloom_uly4", 4, {"--ds-sequence-parallel-size 4"}, 1, "--model bloom"});
  expect_equivalent({"llama_uly2pp2",
                     4,
                     {"--ds-sequence-parallel-size 2 --pipeline-model-parallel-size 2"},
                     1,
                     kLlama});
  expect_equivalent({"drop_uly2", 2, {"--ds-sequence-parallel-size 2"}, 1, kDropout});
}

// --optimizer lion (the second update rule: one state array, the sign of the momentum
// interpolation as the step): sharded state (ZeRO-1 over dp 2) and 3D with ZeRO-3 and sequence
// parallelism equal one process, as AdamW's layouts do.
constexpr const char* kLion = "--optimizer lion --lion-beta1 0.95 --lion-beta2 0.98";
TEST_F(Equivalence, LionLayouts) {
  expect_equivalent({"lion_zero1dp2", 2, {"--zero-stage 1 --ddp-bucket-size 5000"}, 1, kLion});
  expect_equivalent({"lion_tp2pp2dp2zero3sp",
                     8,
                     {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                      "--zero-stage 3 --sequence-parallel"},
                     2,
                     kLion});
}
// Mixture of experts at expert parallelism 1 (docs/moe.md): 4 SwiGLU experts, top-2, with the
// load-balancing and z-losses, in every layer or every other one (dense layers between). The
// experts are ordinary weights of their layer, so data parallelism with sharded optimizer state
// (ZeRO-1) and sharded weights (ZeRO-3, the experts gathered with their layer), tensor
// parallelism inside each expert (with SP), and pipeline stages with virtual chunks and full
// recomputation, equal one process. The routing is
// deterministic and a micro-batch's routing does not depend on the layout.
constexpr const char* kMoe =
    "--swiglu --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 "
    "--moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001";
TEST_F(Equivalence, MoeLayouts) {
  expect_equivalent({"moe_zero1dp2", 2, {"--zero-stage 1 --ddp-bucket-size 5000"}, 1, kMoe});
  expect_equivalent({"moe_zero3dp2", 2, {"--zero-stage 3"}, 1, kMoe});
  // Tensor parallelism inside the experts (each expert's F split, the router replicated), with
  // sequence parallelism, and with ZeRO-3 over dp 2.
  expect_equivalent({"moe_tp2", 2, {"--tensor-model-parallel-size 2"}, 2, kMoe});
  expect_equivalent(
      {"moe_tp2sp", 2, {"--tensor-model-parallel-size 2 --sequence-parallel"}, 2, kMoe});
  expect_equivalent({"moe_tp2spdp2zero3",
                     4,
                     {"--tensor-model-parallel-size 2 --sequence-parallel --zero-stage 3"},
                     2,
                     kMoe});
  expect_equivalent({"moe_pp2v2recompute",
                     2,
                     {"--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 "
                      "--recompute-granularity full"},
                     1,
                     kMoe});
}
// With a capacity that drops tokens (1.0 x the even share, by probability; per-sequence
// load balancing) and MoE in every other layer.
constexpr const char* kMoeDropping =
    "--swiglu --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-layer-freq 2 "
    "--moe-expert-capacity-factor 1.0 --moe-token-drop-policy probs "
    "--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 0.01";
TEST_F(Equivalence, MoeDroppingLayouts) {
  expect_equivalent({"moedrop_dp2", 2, {}, 1, kMoeDropping});
  expect_equivalent({"moedrop_pp2", 2, {"--pipeline-model-parallel-size 2"}, 1, kMoeDropping});
  // The log line reports the routing, summed over the stages: the capacity drops some choices.
  std::ifstream log(run_dir("moedrop_pp2") + "/log.txt");
  const std::string text{std::istreambuf_iterator<char>(log), {}};
  const std::size_t at = text.rfind("dropped tokens: ");
  ASSERT_NE(at, std::string::npos) << text;
  const double dropped = std::stod(text.substr(at + 16));
  EXPECT_GT(dropped, 0.0);
  EXPECT_LT(dropped, 50.0);
  EXPECT_NE(text.find("load_balancing_loss: "), std::string::npos);
  EXPECT_NE(text.find("expert load max/mean: "), std::string::npos);
  std::printf("moedrop_pp2: last logged dropped share %.2f%%\n", dropped);
}
// Megatron's per-layer pattern (--moe-layer-freq '[0,1,1,0]': a dense first and last layer,
// which no integer frequency gives) under expert parallelism and pipeline stages (each stage one
// dense and one MoE layer): equal to one process.
constexpr const char* kMoePattern =
    "--swiglu --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 "
    "--moe-aux-loss-coeff 0.01 --moe-layer-freq '[0,1,1,0]'";
TEST_F(Equivalence, MoeLayerPatternLayouts) {
  expect_equivalent({"moepattern_ep2", 2, {"--expert-model-parallel-size 2"}, 1, kMoePattern});
  expect_equivalent({"moepattern_pp2", 2, {"--pipeline-model-parallel-size 2"}, 1, kMoePattern});
  // The checkpoint holds the pattern, and the layers it marks hold the experts.
  std::ifstream m(run_dir("moepattern_ep2") + "/ckpt/iter_0000010/manifest.json");
  const nlohmann::json config = nlohmann::json::parse(m).at("config");
  EXPECT_EQ(config.at("moe_layer_freq"), nlohmann::json({0, 1, 1, 0}));
  model::ParamTable table;
  (void)final_params("moepattern_ep2", table, kMoePattern);
  std::vector<std::string> routers;
  for (const model::ParamSpec& p : table.params) {
    if (p.name.ends_with("mlp.router.weight")) routers.push_back(p.name);
  }
  EXPECT_EQ(routers,
            (std::vector<std::string>{"layers.1.mlp.router.weight", "layers.2.mlp.router.weight"}));
}
// Expert parallelism (Megatron-Core's layout: the experts split over ep of the dp ranks, tokens
// moved by all-to-all, the experts' gradients reduced over the expert-data-parallel group): alone,
// with tensor and sequence parallelism, with pipeline stages and virtual chunks, over dp 4 (expert
// dp 2) with ZeRO-1 and ZeRO-3, EP 4 over 8 ranks with TP 2, and with the capacity dropping tokens.
// The losses and the final weights (the experts read from their ranks' expert shards) equal one
// process's.
TEST_F(Equivalence, MoeExpertParallelLayouts) {
  auto ep = [](std::string name, int np, std::string flags, int tp, const char* model) {
    return Layout{std::move(name), np, {std::move(flags)}, tp, model};
  };
  expect_equivalent(ep("moe_ep2", 2, "--expert-model-parallel-size 2", 1, kMoe));
  expect_equivalent(ep("moe_ep2tp2sp", 4,
                       "--expert-model-parallel-size 2 --tensor-model-parallel-size 2 "
                       "--sequence-parallel",
                       2, kMoe));
  expect_equivalent(ep("moe_ep2pp2v2", 4,
                       "--expert-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                       "--num-layers-per-virtual-pipeline-stage 1",
                       1, kMoe));
  expect_equivalent(ep("moe_ep2dp4zero1", 4,
                       "--expert-model-parallel-size 2 --zero-stage 1 --ddp-bucket-size 5000", 1,
                       kMoe));
  expect_equivalent(
      ep("moe_ep2dp4zero3", 4, "--expert-model-parallel-size 2 --zero-stage 3", 1, kMoe));
  expect_equivalent(ep("moe_ep4tp2", 8,
                       "--expert-model-parallel-size 4 --tensor-model-parallel-size 2", 2, kMoe));
  expect_equivalent(ep("moedrop_ep2", 2, "--expert-model-parallel-size 2", 1, kMoeDropping));
  expect_equivalent(
      ep("moedrop_ep2zero3", 4, "--expert-model-parallel-size 2 --zero-stage 3", 1, kMoeDropping));
  // The metrics count the experts' reductions over the expert-dp group: dp 4 / EP 2 = 2 ranks move
  // bytes, EP 2 on 2 ranks (expert dp 1) none.
  auto expert_bytes = [](const std::string& name) {
    std::ifstream in(run_dir(name) + "/metrics.jsonl");
    std::string line;
    double bytes = -1;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("expert_dp_comm_bytes_per_iteration")) {
        bytes = j["expert_dp_comm_bytes_per_iteration"];
      }
    }
    return bytes;
  };
  EXPECT_GT(expert_bytes("moe_ep2dp4zero1"), 0.0);
  EXPECT_EQ(expert_bytes("moe_ep2"), 0.0);
  // The checkpoint: each rank's shard and its experts' shard (rank world + r).
  const std::string it10 = run_dir("moe_ep2dp4zero1") + "/ckpt/iter_0000010/";
  std::ifstream m(it10 + "manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(m);
  EXPECT_EQ(manifest.at("expert_shards"), 4);
  EXPECT_EQ(manifest.at("layout").at("ep"), 2);
  for (int shard = 0; shard < 8; ++shard) {
    EXPECT_TRUE(fs::exists(it10 + "rank_0000" + std::to_string(shard) + ".bin")) << shard;
  }
}
// Shared experts with Qwen2-MoE's gate beside the routed experts: tensor parallelism with SP (the
// shared MLP split as the dense one, the gate's gradient summed over tp) and EP 2 over dp 4 with
// ZeRO-3 (the shared experts in the dense part).
constexpr const char* kMoeShared =
    "--swiglu --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 "
    "--moe-aux-loss-coeff 0.01 --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate";
TEST_F(Equivalence, MoeSharedExpertLayouts) {
  expect_equivalent({"moeshared_tp2sp",
                     2,
                     {"--tensor-model-parallel-size 2 --sequence-parallel"},
                     2,
                     kMoeShared});
  expect_equivalent({"moeshared_ep2dp4zero3",
                     4,
                     {"--expert-model-parallel-size 2 --zero-stage 3"},
                     1,
                     kMoeShared});
}
// DeepSeek-V3's auxiliary-loss-free balancing: the sigmoid router with the expert bias, moved by
// 0.01 x sign(mean - tokens) of the global batch after every step. Every layout sees the same
// global counts, so the biases and the losses equal one process's: data parallelism with ZeRO-1,
// pipeline stages (each stage moves its layers' biases), tensor parallelism, EP 2 over dp 4 with
// ZeRO-3 (the bias in the dense part's shards). The biases moved: each is a multiple of the rate
// within 10 steps of 0, and the run differs from one without the bias.
constexpr const char* kMoeBias =
    "--swiglu --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 "
    "--moe-router-score-function sigmoid --moe-router-enable-expert-bias "
    "--moe-router-bias-update-rate 0.01";
TEST_F(Equivalence, MoeExpertBiasLayouts) {
  expect_equivalent(
      {"moebias_zero1dp2", 2, {"--zero-stage 1 --ddp-bucket-size 5000"}, 1, kMoeBias});
  expect_equivalent({"moebias_pp2", 2, {"--pipeline-model-parallel-size 2"}, 1, kMoeBias});
  expect_equivalent({"moebias_tp2", 2, {"--tensor-model-parallel-size 2"}, 2, kMoeBias});
  expect_equivalent(
      {"moebias_ep2dp4zero3", 4, {"--expert-model-parallel-size 2 --zero-stage 3"}, 1, kMoeBias});
  model::ParamTable table;
  const std::vector<float> w = final_params("moebias_ep2dp4zero3", table, kMoeBias);
  int moved = 0;
  for (const model::ParamSpec& p : table.params) {
    if (!p.name.ends_with("router.expert_bias")) continue;
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const double b = w[static_cast<std::size_t>(p.offset + i)];
      EXPECT_LE(std::abs(b), 10 * 0.01 + 1e-6) << p.name;
      EXPECT_NEAR(b / 0.01, std::round(b / 0.01), 1e-3) << p.name << " " << b;
      moved += b != 0 ? 1 : 0;
    }
  }
  EXPECT_GT(moved, 0) << "no expert bias moved";
  const std::string without =
      reference_for({"x",
                     1,
                     {},
                     1,
                     "--swiglu --disable-bias-linear --num-experts 4 --moe-router-topk 2 "
                     "--moe-ffn-hidden-size 48 --moe-router-score-function sigmoid"});
  const std::string with = reference_for({"x", 1, {}, 1, kMoeBias});
  EXPECT_EQ(losses(with)[0], losses(without)[0]);  // the bias starts at 0
  EXPECT_NE(losses(with).back(), losses(without).back());
}
// An expert-parallel checkpoint resumes: stopped at iteration 5 and resumed in the same layout,
// the losses and the final checkpoint equal the uninterrupted run's bitwise; resumed in other
// layouts (EP 4 with ZeRO-3, and one process without expert parallelism: the experts resharded by
// global index), the last five losses equal it within 1e-6.
TEST_F(Equivalence, MoeExpertParallelResume) {
  const std::string layout = "--expert-model-parallel-size 2 --zero-stage 1 --ddp-bucket-size 5000";
  ASSERT_EQ(train({"moe_ep_full", 4, {layout}, 1, kMoe}), 0);
  ASSERT_EQ(WEXITSTATUS(train({"moe_ep_part", 4, {layout + " --exit-interval 5"}, 1, kMoe})), 0);
  const std::string part = run_dir("moe_ep_part") + "/ckpt";
  ASSERT_EQ(train({"moe_ep_part", 4, {layout + " --load " + part}, 1, kMoe}), 0);
  const auto a = losses("moe_ep_full"), b = losses("moe_ep_part");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
  for (int shard = 0; shard < 8; ++shard) {
    const std::string name = "/ckpt/iter_0000010/rank_0000" + std::to_string(shard) + ".bin";
    std::ifstream x(run_dir("moe_ep_full") + name, std::ios::binary),
        y(run_dir("moe_ep_part") + name, std::ios::binary);
    const std::string bx{std::istreambuf_iterator<char>(x), {}},
        by{std::istreambuf_iterator<char>(y), {}};
    EXPECT_GT(bx.size(), 8u) << name;
    EXPECT_TRUE(bx == by) << name << " differs after the resume";
  }
  // Iteration 5's checkpoint (a run stopped there) into other layouts.
  ASSERT_EQ(WEXITSTATUS(
                train({"moe_ep_stop5", 4, {layout + " --exit-interval 5 --async-save"}, 1, kMoe})),
            0);
  const std::string it5 = " --load " + run_dir("moe_ep_stop5") + "/ckpt";
  for (const Layout& other : {Layout{"moe_ep_to_ep4zero3",
                                     4,
                                     {"--expert-model-parallel-size 4 --zero-stage 3" + it5},
                                     1,
                                     kMoe},
                              Layout{"moe_ep_to_one", 1, {it5.substr(1)}, 1, kMoe}}) {
    ASSERT_EQ(train(other), 0) << other.name;
    const auto c = losses(other.name);
    ASSERT_EQ(c.size(), 5u) << other.name;
    for (std::size_t i = 0; i < c.size(); ++i) {
      EXPECT_NEAR(c[i], a[i + 5], 1e-6 * a[i + 5]) << other.name << " iteration " << i + 6;
    }
  }
}
// --fp16 with experts. trident's FP16 is its FP32 arithmetic under loss scaling: the gradients
// scaled, an iteration whose scaled gradients pass FP16's range skipped and the scale halved. From
// 2^24 with hysteresis 1 the first four iterations overflow, then six train; every layout (the
// experts' gradients in their own optimizer under expert parallelism) skips the same iterations
// and matches one FP16 process within 1e-6. A static power-of-two scale is exact: FP16 at 1024
// gives the FP32 run's losses bitwise.
TEST_F(Equivalence, MoeFp16Layouts) {
  const std::string fp16 =
      std::string(kMoe) + " --fp16 --initial-loss-scale 16777216 --hysteresis 1";
  auto skipped = [](const std::string& name) {
    std::ifstream in(run_dir(name) + "/metrics.jsonl");
    std::string line, last;
    while (std::getline(in, line)) last = line;
    return nlohmann::json::parse(last).at("skipped_iterations").get<std::int64_t>();
  };
  const std::string ref = reference_for({"x", 1, {}, 1, fp16});
  EXPECT_EQ(skipped(ref), 4);
  const auto r = losses(ref);
  ASSERT_EQ(r.size(), 10u);
  for (const Layout& l :
       {Layout{"moe_fp16_ep2", 2, {"--expert-model-parallel-size 2"}, 1, fp16},
        Layout{
            "moe_fp16_ep2dp4zero1", 4, {"--expert-model-parallel-size 2 --zero-stage 1"}, 1, fp16},
        Layout{"moe_fp16_tp2sp",
               2,
               {"--tensor-model-parallel-size 2 --sequence-parallel"},
               2,
               fp16}}) {
    ASSERT_EQ(train(l), 0) << l.name;
    EXPECT_EQ(skipped(l.name), 4) << l.name;
    const double worst = losses_within(l.name, r, 1e-6);
    std::printf("%s: max loss rel diff %.2e, 4 skipped iterations\n", l.name.c_str(), worst);
  }
  const auto fp32 = losses(reference_for({"x", 1, {}, 1, kMoe}));
  const auto fixed =
      losses(reference_for({"x", 1, {}, 1, std::string(kMoe) + " --fp16 --loss-scale 1024"}));
  ASSERT_EQ(fixed.size(), fp32.size());
  for (std::size_t i = 0; i < fp32.size(); ++i)
    EXPECT_EQ(fixed[i], fp32[i]) << "iteration " << i + 1;
}

// Group-limited routing (DeepSeek-V3): 4 experts in 2 groups of 2, each token's top 2 from its
// best group (scored by the sum of its top 2). Under EP2 each rank holds one group. Every layout
// equals one process within 1e-6, and the routing is not the unlimited one (the losses move).
TEST_F(Equivalence, MoeGroupLimitedLayouts) {
  const std::string grouped =
      std::string(kMoe) + " --moe-router-num-groups 2 --moe-router-group-topk 1";
  const auto r = losses(reference_for({"x", 1, {}, 1, grouped}));
  const auto u = losses(reference_for({"x", 1, {}, 1, kMoe}));
  ASSERT_EQ(r.size(), 10u);
  ASSERT_EQ(u.size(), 10u);
  double apart = 0;
  for (std::size_t i = 0; i < r.size(); ++i) apart = std::max(apart, std::abs(r[i] - u[i]) / u[i]);
  EXPECT_GT(apart, 1e-5) << "group-limited routing must change the routing";
  for (const Layout& l :
       {Layout{"moe_groups_ep2", 2, {"--expert-model-parallel-size 2"}, 1, grouped},
        Layout{"moe_groups_ep2dp4zero3",
               4,
               {"--expert-model-parallel-size 2 --zero-stage 3"},
               1,
               grouped},
        Layout{"moe_groups_tp2sp",
               2,
               {"--tensor-model-parallel-size 2 --sequence-parallel"},
               2,
               grouped}}) {
    ASSERT_EQ(train(l), 0) << l.name;
    const double worst = losses_within(l.name, r, 1e-6);
    std::printf("%s: max loss rel diff %.2e (grouped vs unlimited routing: %.2e)\n", l.name.c_str(),
                worst, apart);
  }
}

// The experts' optimizer offloaded (its own files beside the dense optimizer's): EP2 with the
// optimizer state on NVMe, and EP2 over dp 4 with ZeRO-3 and the weight shards on NVMe too, each
// equal to one process within 1e-6; EP2 on NVMe stopped at iteration 5 and resumed gives the
// uninterrupted run's losses and all four shard files (2 dense, 2 experts) bitwise.
TEST_F(Equivalence, MoeOffloadLayouts) {
  const std::string nvme = (dir() / "nvme").string();
  fs::create_directories(nvme);
  const std::string off = "--offload-optimizer nvme --offload-path " + nvme;
  const std::string ref = reference_for({"x", 1, {}, 1, kMoe});
  const auto r = losses(ref);
  ASSERT_EQ(r.size(), 10u);
  const std::string ep2 = "--expert-model-parallel-size 2 " + off;
  for (const Layout& l :
       {Layout{"moe_off_ep2", 2, {ep2}, 1, kMoe},
        Layout{"moe_off_ep2dp4zero3",
               4,
               {"--expert-model-parallel-size 2 --zero-stage 3 --offload-params nvme " + off},
               1,
               kMoe}}) {
    ASSERT_EQ(train(l), 0) << l.name;
    losses_within(l.name, r, 1e-6);
    std::ifstream log(run_dir(l.name) + "/log.txt");
    const std::string text{std::istreambuf_iterator<char>(log), {}};
    EXPECT_NE(text.find("the experts' optimizer state (adam) of"), std::string::npos) << l.name;
  }
  ASSERT_EQ(WEXITSTATUS(train({"moe_off_part", 2, {ep2 + " --exit-interval 5"}, 1, kMoe})), 0);
  ASSERT_EQ(
      train({"moe_off_part", 2, {ep2 + " --load " + run_dir("moe_off_part") + "/ckpt"}, 1, kMoe}),
      0);
  const auto a = losses("moe_off_ep2"), b = losses("moe_off_part");
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
  for (int shard = 0; shard < 4; ++shard) {
    const std::string name = "/ckpt/iter_0000010/rank_0000" + std::to_string(shard) + ".bin";
    std::ifstream x(run_dir("moe_off_ep2") + name, std::ios::binary),
        y(run_dir("moe_off_part") + name, std::ios::binary);
    const std::string bx{std::istreambuf_iterator<char>(x), {}},
        by{std::istreambuf_iterator<char>(y), {}};
    EXPECT_GT(bx.size(), 8u) << name;
    EXPECT_TRUE(bx == by) << name << " differs after the resume";
  }
}

// Context parallelism and checkpoints: CP2 over dp 2 with ZeRO-1 stopped at iteration 5 and
// resumed in the same layout gives the uninterrupted run bitwise (losses and every shard); its
// iteration-5 checkpoint (the shards of dp x cp = 4 ranks) resumes in one process, as CP4 with
// ZeRO-3, and as Ulysses 2, each with the last five losses within 1e-6.
TEST_F(Equivalence, ContextParallelResume) {
  const std::string layout = "--context-parallel-size 2 --zero-stage 1 --ddp-bucket-size 5000";
  ASSERT_EQ(train({"cp_full", 4, {layout}, 1}), 0);
  ASSERT_EQ(WEXITSTATUS(train({"cp_part", 4, {layout + " --exit-interval 5"}, 1})), 0);
  const std::string part = " --load " + run_dir("cp_part") + "/ckpt";
  ASSERT_EQ(train({"cp_part", 4, {layout + part}, 1}), 0);
  const auto a = losses("cp_full"), b = losses("cp_part");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
  for (int shard = 0; shard < 4; ++shard) {
    const std::string name = "/ckpt/iter_0000010/rank_0000" + std::to_string(shard) + ".bin";
    std::ifstream x(run_dir("cp_full") + name, std::ios::binary),
        y(run_dir("cp_part") + name, std::ios::binary);
    const std::string bx{std::istreambuf_iterator<char>(x), {}},
        by{std::istreambuf_iterator<char>(y), {}};
    EXPECT_GT(bx.size(), 8u) << name;
    EXPECT_TRUE(bx == by) << name << " differs after the resume";
  }
  ASSERT_EQ(WEXITSTATUS(train({"cp_stop5", 4, {layout + " --exit-interval 5"}, 1})), 0);
  const std::string it5 = " --load " + run_dir("cp_stop5") + "/ckpt";
  for (const Layout& other :
       {Layout{"cp_to_one", 1, {it5.substr(1)}, 1},
        Layout{"cp_to_cp4zero3", 4, {"--context-parallel-size 4 --zero-stage 3" + it5}, 1},
        Layout{"cp_to_uly2", 2, {"--ds-sequence-parallel-size 2" + it5}, 1}}) {
    ASSERT_EQ(train(other), 0) << other.name;
    const auto c = losses(other.name);
    ASSERT_EQ(c.size(), 5u) << other.name;
    for (std::size_t i = 0; i < c.size(); ++i) {
      EXPECT_NEAR(c[i], a[i + 5], 1e-6 * a[i + 5]) << other.name << " iteration " << i + 6;
    }
  }
}

// Mixture of experts in BF16: the experts' matmuls run by blocks of 32 rows (the last padded:
// model/layers/moe.h), so 4 experts top-2 (about 16 rows each: padded blocks) and 2 experts top-2
// (32 rows each: whole blocks). Each layout is within the BF16 bound (1e-4) of one BF16 process;
// each BF16 run is within 2e-4 of the FP32 run of the same model (the blocks hold the right rows:
// dropping one row of each padded block moves it by 5e-4)
// and differs from it.
TEST_F(Equivalence, MoeBf16Layouts) {
  const std::string two =
      "--swiglu --disable-bias-linear --num-experts 2 --moe-router-topk 2 --moe-ffn-hidden-size 48 "
      "--moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001";
  for (const std::string& model : {std::string(kMoe) + " --bf16", two + " --bf16"}) {
    const std::string ref = reference_for({"x", 1, {}, 1, model});
    const std::string fp32 = reference_for({"x", 1, {}, 1, model.substr(0, model.size() - 7)});
    const auto r = losses(ref), f = losses(fp32);
    ASSERT_EQ(r.size(), 10u);
    ASSERT_EQ(f.size(), 10u);
    double to_fp32 = 0;
    for (std::size_t i = 0; i < r.size(); ++i) {
      EXPECT_NEAR(r[i], f[i], 2e-4 * f[i]) << model << " iteration " << i + 1;
      to_fp32 = std::max(to_fp32, std::abs(r[i] - f[i]) / f[i]);
    }
    EXPECT_GT(to_fp32, 0) << "BF16 must differ from FP32";
    const bool four = model == std::string(kMoe) + " --bf16";
    std::vector<Layout> layouts = {
        {four ? "moe_bf16_ep2" : "moe2_bf16_ep2", 2, {"--expert-model-parallel-size 2"}, 1, model},
        {four ? "moe_bf16_tp2sp" : "moe2_bf16_tp2sp",
         2,
         {"--tensor-model-parallel-size 2 --sequence-parallel"},
         2,
         model}};
    if (four) {
      layouts.push_back({"moe_bf16_ep2dp4zero3",
                         4,
                         {"--expert-model-parallel-size 2 --zero-stage 3"},
                         1,
                         model + " --moe-expert-capacity-factor 1.0"});
    }
    for (const Layout& l : layouts) {
      const std::string lref = reference_for(l);
      ASSERT_EQ(train(l), 0) << l.name;
      const auto a = losses(lref), b = losses(l.name);
      ASSERT_EQ(b.size(), a.size());
      double worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_NEAR(b[i], a[i], 1e-4 * a[i]) << l.name;
        worst = std::max(worst, std::abs(b[i] - a[i]) / a[i]);
      }
      std::printf("%s: max loss rel diff %.2e (BF16 against FP32: %.2e)\n", l.name.c_str(), worst,
                  to_fp32);
    }
  }
}

// A stop at iteration 5 and a resume give the uninterrupted run's losses and final checkpoint
// bitwise: Lion's momentum is saved and restored by name ("exp_avg"), sharded over dp.
TEST_F(Equivalence, LionResumeIsBitwise) {
  const std::string layout = "--zero-stage 1 --ddp-bucket-size 5000";
  ASSERT_EQ(train({"lion_full", 2, {layout}, 1, kLion}), 0);
  ASSERT_EQ(WEXITSTATUS(train({"lion_part", 2, {layout + " --exit-interval 5"}, 1, kLion})), 0);
  ASSERT_EQ(
      train({"lion_part", 2, {layout + " --load " + run_dir("lion_part") + "/ckpt"}, 1, kLion}), 0);
  const auto a = losses("lion_full"), b = losses("lion_part");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
  for (int rank : {0, 1}) {
    const std::string shard = "/ckpt/iter_0000010/rank_0000" + std::to_string(rank) + ".bin";
    std::ifstream x(run_dir("lion_full") + shard, std::ios::binary),
        y(run_dir("lion_part") + shard, std::ios::binary);
    const std::string bx{std::istreambuf_iterator<char>(x), {}},
        by{std::istreambuf_iterator<char>(y), {}};
    EXPECT_GT(bx.size(), 8u) << shard;
    EXPECT_TRUE(bx == by) << shard << " differs after the resume";
  }
  // The manifest names the rule; the shard holds its one state array.
  std::ifstream m(run_dir("lion_full") + "/ckpt/iter_0000010/manifest.json");
  EXPECT_EQ(nlohmann::json::parse(m).at("config").at("optimizer"), "lion");
  std::ifstream j(run_dir("lion_full") + "/ckpt/iter_0000010/rank_00000.json");
  std::vector<std::string> names;
  const nlohmann::json shard = nlohmann::json::parse(j);
  for (const auto& t : shard.at("tensors")) names.push_back(t.at("tensor"));
  EXPECT_EQ(names, (std::vector<std::string>{"params", "exp_avg"}));
}
// An AdamW checkpoint cannot continue as Lion (nor the reverse): the resume is refused up front,
// naming both rules and the way out; --finetune starts Lion from its weights.
TEST_F(Equivalence, ResumeWithAnotherOptimizerIsRefused) {
  const std::string adam_ckpt = run_dir("reference") + "/ckpt";
  EXPECT_NE(train({"lion_from_adam", 1, {"--load " + adam_ckpt}, 1, kLion}), 0);
  std::ifstream log(run_dir("lion_from_adam") + "/log.txt");
  const std::string text{std::istreambuf_iterator<char>(log), {}};
  EXPECT_NE(text.find("the checkpoint was trained with --optimizer adam, this run asks for "
                      "--optimizer lion: resume with --optimizer adam, or start from its weights "
                      "with a fresh optimizer (--finetune)"),
            std::string::npos)
      << text;
  ASSERT_EQ(train({"lion_finetune", 1, {"--load " + adam_ckpt + " --finetune"}, 1, kLion}), 0);
  EXPECT_EQ(losses("lion_finetune").size(), 10u);
}

// Fewer key/value groups than tensor-parallel ranks: each group's key/value heads are replicated
// on the tp / G ranks whose query heads use them, their gradients summed over those ranks by the
// optimizer's gradient finalisation. 2 groups on TP4 with sequence parallelism; multi-query
// attention (1 group) on TP2 x DP2 with ZeRO-3.
constexpr const char* kLlamaMqa =
    "--model llama --group-query-attention --num-query-groups 1 --use-rope-scaling "
    "--rope-scaling-factor 4";
TEST_F(Equivalence, LlamaReplicatedKeyValueHeads) {
  expect_equivalent(
      {"llama_tp4sp", 4, {"--tensor-model-parallel-size 4 --sequence-parallel"}, 4, kLlama});
  expect_equivalent({"llama_mqa_tp2dp2zero3",
                     4,
                     {"--tensor-model-parallel-size 2 --zero-stage 3"},
                     2,
                     kLlamaMqa});
}

// Llama in BF16 (TP2 x PP2 against one BF16 process, the BF16 tolerance of Bf16Layouts) and with
// selective recomputation (the unfused attention's probabilities recomputed; TP2 x DP2 against
// the FP32 reference).
TEST_F(Equivalence, LlamaBf16AndSelectiveRecompute) {
  const std::string bf16 = std::string(kLlama) + " --bf16";
  const std::string ref = reference_for({"x", 1, {}, 1, bf16});
  const Layout l{"llama_bf16_tp2pp2",
                 4,
                 {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"},
                 2,
                 bf16};
  ASSERT_EQ(train(l), 0) << l.name;
  const auto a = losses(ref), b = losses(l.name);
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 1e-4 * a[i]) << l.name << " iteration " << i + 1;
    worst = std::max(worst, std::abs(b[i] - a[i]) / a[i]);
  }
  std::printf("%s: max loss rel diff %.2e\n", l.name.c_str(), worst);
  EXPECT_NE(losses(ref).back(), losses(reference_for({"x", 1, {}, 1, kLlama})).back())
      << "BF16 must differ from FP32";
  expect_equivalent({"llama_tp2dp2selective",
                     4,
                     {"--tensor-model-parallel-size 2 --recompute-granularity selective"},
                     2,
                     kLlama});
}

// Documents packed into samples (Megatron's --reset-position-ids --reset-attention-mask, with
// --eod-mask-loss): GPT (learned positions restart) in TP2 x PP2 interleaved, whose middle
// virtual stages read the tokens too; Llama (rotary positions, fused attention) in PP2 x DP2.
TEST_F(Equivalence, DocumentsInSamples) {
  const std::string docs = " --reset-position-ids --reset-attention-mask --eod-mask-loss";
  expect_equivalent({"gpt_docs_tp2pp2v2",
                     4,
                     {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                      "--num-layers-per-virtual-pipeline-stage 1"},
                     2,
                     docs,
                     "",
                     "corpus_docs"});
  expect_equivalent({"llama_docs_pp2dp2flash",
                     4,
                     {"--pipeline-model-parallel-size 2"},
                     1,
                     std::string(kLlama) + " --use-flash-attn" + docs,
                     "",
                     "corpus_docs"});
}

// The acceptance test: a tiny Llama trained by trident in TP2 x PP2, exported with
// `trident convert --to-hf`, loads in transformers (AutoModelForCausalLM.from_pretrained, as it
// is) and gives trident's logits of a prompt (within 1e-5 of the largest, transformers in float64)
// and the same 50 greedy tokens (transformers' generate() in float32 against trident's KV-cache
// generation, model/generate.h, as `trident generate` runs it).
TEST_F(Equivalence, LlamaTrainedInThreeDLoadsInTransformers) {
  const std::string run = "llama_export";
  ASSERT_EQ(train({run,
                   4,
                   {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"},
                   2,
                   std::string(kLlama) + " --max-position-embeddings 64"}),
            0);
  const std::string ckpt_dir = run_dir(run) + "/ckpt", hf = run_dir(run) + "/hf";
  const std::string convert = std::string(TRIDENT_CLI) + " convert --load " + ckpt_dir +
                              " --to-hf " + hf + " > " + run_dir(run) + "/convert.txt 2>&1";
  ASSERT_EQ(std::system(convert.c_str()), 0) << convert;
  const std::vector<std::int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12};
  const std::int64_t new_tokens = 50;
  const std::string out = run_dir(run) + "/transformers.trtf";
  const std::string check = std::string(TRIDENT_HF_PYTHON) + " " + TRIDENT_SOURCE_DIR +
                            "/tests/reference/hf_check_export.py --model " + hf +
                            " --prompt '5 6 7 8 9 10 11 12' --max-new-tokens 50 --output " + out;
  ASSERT_EQ(std::system(check.c_str()), 0) << check;
  const auto ref = testing::read_tensor_file(out);

  // trident on the same checkpoint (any layout reassembles into one rank).
  const nlohmann::json manifest = ckpt::read_manifest(ckpt_dir, -1);
  model::ModelConfig mc = ckpt::model_config_from_json(manifest.at("config"));
  mc.make_vocab_size_divisible_by *= manifest.at("layout").value("tp", 1);
  ASSERT_EQ(mc.position_embedding, model::PositionEmbedding::kRope);
  ASSERT_EQ(mc.query_groups(), 2);
  const model::ParamTable table = model::build_gpt_param_table(mc);
  std::vector<float> flat(static_cast<std::size_t>(table.total_numel));
  ckpt::load_full_params(ckpt_dir, -1, table, flat.data());
  const model::GptParams params = model::gpt_param_views(mc, table, flat.data());
  const core::ExecContext ctx;
  model::GptActivations acts;
  model::ModelRuntime rt;
  const auto T = static_cast<std::int64_t>(prompt.size());
  model::make_activations(mc, rt.shard, 1, T, acts);
  model::gpt_forward(ctx, mc, rt, params, {.tokens = prompt.data(), .training = false}, acts);
  const std::vector<double> hf_logits = testing::find_tensor(ref, "logits").to_f64();
  ASSERT_EQ(static_cast<std::int64_t>(hf_logits.size()), T * mc.vocab_size);
  double diff = 0, scale = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t v = 0; v < mc.vocab_size; ++v) {
      const double want = hf_logits[static_cast<std::size_t>(t * mc.vocab_size + v)];
      diff = std::max(diff, std::abs(acts.logits[t * mc.padded_vocab_size() + v] - want));
      scale = std::max(scale, std::abs(want));
    }
  }
  EXPECT_LE(diff / scale, 1e-5) << "logits of trident vs transformers";
  std::printf("exported Llama: logits max rel diff %.2e\n", diff / scale);

  model::Generator gen(mc, params);
  const float* logits = nullptr;
  for (std::int32_t id : prompt) logits = gen.step(ctx, id);
  std::vector<std::int64_t> mine;
  const model::SamplingConfig greedy{.temperature = 0.0f};
  for (std::int64_t i = 0; i < new_tokens; ++i) {
    const std::int32_t next =
        model::sample_token(logits, mc.vocab_size, greedy, static_cast<std::uint64_t>(i));
    mine.push_back(next);
    logits = gen.step(ctx, next);
  }
  const std::vector<std::int64_t> theirs = testing::find_tensor(ref, "generated").i64();
  EXPECT_EQ(mine, theirs) << "greedy tokens of trident vs transformers' generate()";
  std::set<std::int64_t> distinct(mine.begin(), mine.end());
  EXPECT_GT(distinct.size(), 3u) << "a degenerate generation proves little";

  // Fine-tuning from Hugging Face: the export imported again (`convert --from-hf`, into TP2) and
  // trained with --finetune gives, iteration by iteration, the losses of --finetune from the
  // trained checkpoint itself (the same weights, bitwise, after trident -> HF -> trident), starting
  // at iteration 1 with fresh data order and optimizer, below the untrained run's first loss.
  const std::string imported = run_dir(run) + "/imported";
  const std::string import_cmd =
      std::string(TRIDENT_CLI) + " convert --from-hf " + hf + " --save " + imported +
      " --seq-length 16 --tensor-model-parallel-size 2 > " + run_dir(run) + "/import.txt 2>&1";
  ASSERT_EQ(std::system(import_cmd.c_str()), 0) << import_cmd;
  const std::string llama = std::string(kLlama) + " --max-position-embeddings 64";
  for (const auto& [name, from] :
       {std::pair{"finetune_direct", ckpt_dir}, std::pair{"finetune_imported", imported}}) {
    ASSERT_EQ(
        train({name, 2, {"--tensor-model-parallel-size 2 --finetune --load " + from}, 2, llama}), 0)
        << name;
  }
  const std::vector<double> direct = losses("finetune_direct"),
                            via_hf = losses("finetune_imported"), scratch = losses(run);
  ASSERT_EQ(direct.size(), 10u) << "--finetune restarts at iteration 1";
  ASSERT_EQ(via_hf.size(), 10u);
  for (std::size_t i = 0; i < direct.size(); ++i) {
    EXPECT_EQ(direct[i], via_hf[i]) << "iteration " << i + 1;
  }
  EXPECT_LT(direct.front(), scratch.front()) << "the fine-tuning run did not start from the "
                                                "trained weights";
}

// `trident generate` reassembles a TP x PP checkpoint and decodes greedily the same tokens as from
// the one-process checkpoint.
TEST_F(Equivalence, GenerateFromThreeDCheckpoint) {
  ASSERT_EQ(train({"gen_tp2pp2",
                   4,
                   {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"},
                   2}),
            0);
  auto generate = [&](const std::string& run) {
    const std::string out = run_dir(run) + "/generated.txt";
    const std::string cmd = std::string(TRIDENT_CLI) + " generate --load " + run_dir(run) +
                            "/ckpt --prompt '5 6 7 8' --max-new-tokens 8 --temperature 0 > " + out +
                            " 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(out);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string a = generate("reference"), b = generate("gen_tp2pp2");
  EXPECT_GT(a.size(), std::string("5 6 7 8").size());
  EXPECT_EQ(a, b);
}

TEST_F(Equivalence, ThreeDSequenceParallelInterleaved) {
  expect_equivalent({"tp2pp2dp2spv2",
                     8,
                     {"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                      "--sequence-parallel --num-layers-per-virtual-pipeline-stage 1"},
                     2});
}

// --offload-optimizer nvme (docs/offload.md): the Adam moments streamed from files through a
// window of 4096-element chunks (several per rank, boundaries inside parameters) give bitwise the
// losses and the final checkpoint (weights and both moments) of the same layout in memory.
class Offload : public Equivalence {
 protected:
  // what: --offload-optimizer nvme (moments), --offload-params nvme (params, ZeRO-3) or both.
  enum What { kMoments = 1, kParams = 2, kBoth = 3 };
  static std::string offload_flags(const std::string& name, What what = kMoments) {
    const std::string disk = run_dir(name + "_disk");
    fs::create_directories(disk);
    return std::string(what & kMoments ? "--offload-optimizer nvme " : "") +
           (what & kParams ? "--offload-params nvme " : "") + "--offload-path " + disk +
           " --offload-window-mib 0.1";
  }
  // The run without offload (once per suite: later tests reuse it).
  static void baseline(const Layout& l) {
    if (!fs::exists(run_dir(l.name) + "/metrics.jsonl")) {
      ASSERT_EQ(train(l), 0) << l.name;
    }
  }
  static std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void expect_same_checkpoint(const std::string& a, const std::string& b) {
    const fs::path da = fs::path(run_dir(a)) / "ckpt" / "iter_0000010";
    const fs::path db = fs::path(run_dir(b)) / "ckpt" / "iter_0000010";
    int shards = 0;
    for (const auto& e : fs::directory_iterator(da)) {
      if (e.path().extension() != ".bin") continue;
      ++shards;
      const std::string x = read_bytes(e.path()), y = read_bytes(db / e.path().filename());
      EXPECT_GT(x.size(), 8u);
      EXPECT_TRUE(x == y) << b << ": " << e.path().filename() << " differs from " << a;
    }
    EXPECT_GT(shards, 0) << da;
  }
  static void expect_bitwise(const Layout& l, What what = kMoments) {
    baseline(l);
    Layout o = l;
    o.name = l.name + (what == kMoments ? "_offload" : what == kParams ? "_poffload" : "_boffload");
    o.flags.push_back(offload_flags(o.name, what));
    ASSERT_EQ(train(o), 0) << o.name;
    const std::vector<double> a = losses(l.name), b = losses(o.name);
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(b.size(), 10u);
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(a[i], b[i]) << o.name << " iteration " << i + 1;
    expect_same_checkpoint(l.name, o.name);
    // The log names the window and the I/O rates; the files are gone after the run.
    const std::string log = read_bytes(run_dir(o.name) + "/log.txt");
    const std::string rule =
        l.model_flags.find("--optimizer lion") != std::string::npos ? "(lion)" : "(adam)";
    EXPECT_NE(
        log.find(what == kMoments  ? "offload: optimizer state " + rule + " of"
                 : what == kParams ? "offload: weight shard (--offload-params nvme) of"
                                   : "offload: weight shard and optimizer state " + rule + " of"),
        std::string::npos)
        << log;
    EXPECT_NE(log.find("MiB/s), waiting for I/O"), std::string::npos) << log;
    if (what & kParams) {
      // The weights were read ahead of the gathers, following the recorded order.
      EXPECT_NE(log.find("offload: weights read ahead of the gathers"), std::string::npos) << log;
    }
    EXPECT_TRUE(fs::is_empty(run_dir(o.name + "_disk")));
  }
};

TEST_F(Offload, OneProcess) { expect_bitwise({"reference", 1, {}, 1}); }
// Lion's one state array streamed from its file, sharded over dp 2 (ZeRO-1), and with ZeRO-3's
// weight shard offloaded too.
TEST_F(Offload, Lion) {
  expect_bitwise({"lion_zero1dp2", 2, {"--zero-stage 1 --ddp-bucket-size 5000"}, 1, kLion});
  expect_bitwise({"lion_zero3dp2", 2, {"--zero-stage 3"}, 1, kLion}, kBoth);
}
TEST_F(Offload, Zero1DataParallel2) {
  expect_bitwise({"zero1dp2", 2, {"--zero-stage 1 --ddp-bucket-size 5000"}, 1});
}
TEST_F(Offload, Zero3DataParallel2) { expect_bitwise({"zero3dp2", 2, {"--zero-stage 3"}, 1}); }
TEST_F(Offload, TensorParallel2DataParallel2) {
  expect_bitwise({"tp2dp2", 4, {"--tensor-model-parallel-size 2"}, 2});
}
TEST_F(Offload, PipelineZero2) {
  expect_bitwise({"pp2dp2zero2", 4, {"--pipeline-model-parallel-size 2 --zero-stage 2"}, 1});
}

TEST_F(Offload, Bf16Zero1) { expect_bitwise({"bf16zero1dp2", 2, {"--bf16 --zero-stage 1"}, 1}); }

// Saved at iteration 5 with the moments on disk (the shard streamed from the mapped files),
// resumed with them on disk again: bitwise the uninterrupted run without offload.
TEST_F(Offload, ResumeIsBitwise) {
  const Layout full{"zero1dp2", 2, {"--zero-stage 1 --ddp-bucket-size 5000"}, 1};
  baseline(full);
  const std::string flags = "--zero-stage 1 --ddp-bucket-size 5000 " + offload_flags("resume");
  ASSERT_EQ(WEXITSTATUS(train({"offload_resume", 2, {flags + " --exit-interval 5"}, 1})), 0);
  ASSERT_EQ(
      train({"offload_resume", 2, {flags + " --load " + run_dir("offload_resume") + "/ckpt"}, 1}),
      0);
  const auto a = losses("zero1dp2"), b = losses("offload_resume");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
  expect_same_checkpoint("zero1dp2", "offload_resume");
}

// --offload-params nvme (ZeRO-3's weight shard in a file, read ahead of each gather, streamed
// by the step), alone and with the moments beside it: bitwise the same layout in memory.
TEST_F(Offload, ParamsZero3DataParallel2) {
  expect_bitwise({"zero3dp2", 2, {"--zero-stage 3"}, 1}, kParams);
  expect_bitwise({"zero3dp2", 2, {"--zero-stage 3"}, 1}, kBoth);
}
TEST_F(Offload, ParamsTensorParallel2DataParallel2SequenceParallel) {
  expect_bitwise({"tp2dp2zero3sp",
                  4,
                  {"--tensor-model-parallel-size 2 --zero-stage 3 --sequence-parallel"},
                  2},
                 kBoth);
}
// Pipeline (1F1B interleaves the micro-batches' forward and backward gathers) with full
// recompute (a layer's weights gathered again before its backward): the order of the gathers is
// not forward-then-backward, and the read-ahead follows it.
TEST_F(Offload, ParamsPipelineZero3Recompute) {
  expect_bitwise({"pp2dp2zero3rc",
                  4,
                  {"--pipeline-model-parallel-size 2 --zero-stage 3 --recompute-granularity full "
                   "--recompute-method uniform"},
                  1},
                 kParams);
}
TEST_F(Offload, ParamsBf16Zero3) {
  expect_bitwise({"bf16zero3dp2", 2, {"--bf16 --zero-stage 3"}, 1}, kBoth);
}

// Saved at 5 with the weight shard and the moments on disk (streamed from the mapped files),
// resumed with both on disk: bitwise the uninterrupted run without offload. Then the same
// checkpoint resumed in another layout (TP 2, one data-parallel rank, both offloaded: the load
// reshards into the files' mappings) gives the uninterrupted run's losses (another layout: within
// the equivalence tolerance).
TEST_F(Offload, ParamsResumeIsBitwiseAndReshards) {
  const Layout full{"zero3dp2", 2, {"--zero-stage 3"}, 1};
  baseline(full);
  const std::string flags = "--zero-stage 3 " + offload_flags("presume", kBoth);
  ASSERT_EQ(WEXITSTATUS(train({"poffload_resume", 2, {flags + " --exit-interval 5"}, 1})), 0);
  const std::string saved = run_dir("poffload_resume") + "/ckpt";
  fs::copy(saved, run_dir("poffload_saved5"), fs::copy_options::recursive);
  ASSERT_EQ(train({"poffload_resume", 2, {flags + " --load " + saved}, 1}), 0);
  const auto a = losses("zero3dp2"), b = losses("poffload_resume");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;
  expect_same_checkpoint("zero3dp2", "poffload_resume");

  const std::string other = "--tensor-model-parallel-size 2 --zero-stage 3 " +
                            offload_flags("preshard", kBoth) + " --load " +
                            run_dir("poffload_saved5");
  ASSERT_EQ(train({"poffload_reshard", 2, {other}, 2}), 0);
  EXPECT_NE(read_bytes(run_dir("poffload_reshard") + "/log.txt").find("ckpt: resharding"),
            std::string::npos);
  const auto c = losses("poffload_reshard");
  ASSERT_EQ(c.size(), 5u) << "iterations 6-10";
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_LE(std::abs(c[i] - a[i + 5]) / a[i + 5], 1e-5) << "iteration " << i + 6;
  }
}

// A rank killed with SIGKILL leaves its offload files behind (no destructor runs); their locks
// died with it, so a relaunch with the same --offload-path removes them (saying so), trains
// to the end and leaves the directory empty.
TEST_F(Offload, KilledRunLeavesFilesTheRelaunchRemoves) {
  const std::string flags = "--zero-stage 3 " + offload_flags("killed", kBoth);
  const fs::path disk = run_dir("killed_disk");
  Layout l{"killed", 1, {flags}, 1};
  const std::string pidfile = run_dir("killed") + "/pid";
  fs::create_directories(run_dir("killed"));
  const std::string cmd = command(l) + " & echo $! > " + pidfile;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  pid_t pid = 0;
  for (int i = 0; i < 200 && pid == 0; ++i) {
    std::ifstream in(pidfile);
    in >> pid;
    if (pid == 0) ::usleep(50000);
  }
  ASSERT_GT(pid, 0);
  // Until it has trained an iteration (its files exist), then SIGKILL.
  bool trained = false;
  for (int i = 0; i < 1200 && !trained; ++i) {
    trained = losses("killed").size() >= 1;
    if (!trained) ::usleep(50000);
  }
  ASSERT_TRUE(trained) << read_bytes(run_dir("killed") + "/log.txt");
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  for (int i = 0; i < 200 && ::kill(pid, 0) == 0; ++i) ::usleep(50000);
  int left = 0;
  for (const auto& e : fs::directory_iterator(disk)) left += e.path().extension() == ".bin";
  EXPECT_EQ(left, 3) << "the killed run's weight and moment files";
  l.name = "killed_relaunch";
  ASSERT_EQ(train(l), 0);
  const std::string log = read_bytes(run_dir("killed_relaunch") + "/log.txt");
  EXPECT_NE(log.find("left behind by a run that ended without cleaning up"), std::string::npos)
      << log;
  EXPECT_EQ(losses("killed_relaunch").size(), 10u);
  EXPECT_TRUE(fs::is_empty(disk));
}

// An evaluation pass after a step at ZeRO-3 uses the updated weights (it used to reuse the
// embedding, head and layer-0 weights gathered before the step: validation losses 3e-3 off),
// also when the shard is read from disk.
TEST_F(Offload, Zero3EvaluationSeesTheUpdatedWeights) {
  const std::string eval = "--eval-interval 5 --eval-iters 1";
  ASSERT_EQ(train({"eval_reference", 1, {eval}, 1}), 0);
  ASSERT_EQ(
      train(
          {"eval_zero3", 2, {eval + " --zero-stage 3 " + offload_flags("eval_zero3", kParams)}, 1}),
      0);
  const auto valid = [](const std::string& name) {
    std::vector<double> out;
    std::ifstream in(run_dir(name) + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j.value("split", "") == "valid") out.push_back(j["lm_loss"]);
    }
    return out;
  };
  const auto a = valid("eval_reference"), b = valid("eval_zero3");
  ASSERT_EQ(a.size(), 3u) << "iterations 5 and 10, and the final validation";
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(a[i] - b[i]) / a[i], 1e-6) << "validation " << i;
  }
}

// --offload-params nvme without ZeRO-3 is refused, naming the flag and the fix.
TEST_F(Offload, ParamsNeedZero3) {
  Layout l{"poffload_zero1", 1, {"--zero-stage 1 " + offload_flags("poffload_zero1", kParams)}, 1};
  EXPECT_NE(train(l), 0);
  const std::string log = read_bytes(run_dir("poffload_zero1") + "/log.txt");
  EXPECT_NE(log.find("--offload-params nvme needs --zero-stage 3"), std::string::npos) << log;
}

// A disk that cannot hold the moments (the file size limit stands in for a full disk) stops the
// run before the first step with the reason and the fix.
TEST_F(Offload, FullDiskIsAClearError) {
  Layout l{"offload_full", 1, {offload_flags("offload_full")}, 1};
  // (PMIx's hash store: its default shared-memory store would hit the limit first.)
  l.shell_prefix = "ulimit -f 64; PMIX_MCA_gds=hash ";
  const int rc = train(l);
  EXPECT_NE(rc, 0);
  const std::string log = read_bytes(run_dir("offload_full") + "/log.txt");
  EXPECT_NE(log.find("cannot reserve"), std::string::npos) << log;
  EXPECT_NE(log.find("--offload-path"), std::string::npos) << log;
}

}  // namespace
}  // namespace trident
