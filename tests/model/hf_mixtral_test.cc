// Mixtral (transformers' MixtralForCausalLM) through `trident convert` (docs/moe.md, "Hugging
// Face"); the numerics of the imported model against transformers are hf_golden_mixtral_* and the
// bitwise round trip hf_roundtrip_mixtral.
//
// HfMixtral.*: config.json <-> trident's MoE settings, and what is refused, by name: a config
// with sliding_window, router jitter or rope_scaling, model_type qwen2 (a dense Qwen2) on import;
// each mixture-of-experts setting Mixtral cannot express on export.
//
// HfMixtralFineTune.ImportedFineTunesAndExportsBack (needs transformers, $TRIDENT_HF_PYTHON): a
// tiny random Mixtral saved by transformers is imported (into a TP2 checkpoint), fine-tuned with
// `trident train --finetune` (one process: the checkpoint reshards), and exported again. The
// export loads in transformers as MixtralForCausalLM; every tensor, read back by transformers and
// put into trident's layout by the Python map (tests/reference/hf_reference.py, not trident's
// own), equals the fine-tuned checkpoint's weight bitwise; every weight (each router and expert)
// moved in fine-tuning; transformers' logits of a prompt (float64) are within 1e-5 of trident's,
// and its greedy generate() gives trident's tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/tensor_file.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/hf_model.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/data/indexed_dataset.h"
#include "trident/model/generate.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using ckpt::HfArch;
using nlohmann::json;

// What save_pretrained writes for a small MixtralConfig (the keys trident reads and a few it
// ignores).
json mixtral_config() {
  return {{"model_type", "mixtral"},
          {"architectures", {"MixtralForCausalLM"}},
          {"vocab_size", 301},
          {"hidden_size", 32},
          {"intermediate_size", 40},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 5000.0},
          {"initializer_range", 0.02},
          {"num_local_experts", 4},
          {"num_experts_per_tok", 2},
          {"router_aux_loss_coef", 0.02},
          {"router_jitter_noise", 0.0},
          {"output_router_logits", false},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"},
          {"attention_dropout", 0.0},
          {"use_cache", true},
          {"torch_dtype", "bfloat16"}};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(HfMixtral, ConfigMapsToTheMoeSettings) {
  const ckpt::HfImport imp = ckpt::hf_config_to_trident(mixtral_config(), 0);
  const model::ModelConfig& m = imp.model;
  EXPECT_EQ(imp.arch, HfArch::kMixtral);
  EXPECT_EQ(imp.dtype, ckpt::StDType::kBF16);
  EXPECT_EQ(m.num_experts, 4);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_ffn(), 40);
  EXPECT_EQ(m.ffn(), 40);
  EXPECT_EQ(m.moe_layer_freq, 1);
  EXPECT_EQ(m.moe_router_score_function, model::MoeScoreFunction::kSoftmax);
  EXPECT_FALSE(m.moe_router_pre_softmax);
  EXPECT_EQ(m.moe_expert_capacity_factor, 0.0);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.02);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.0);
  EXPECT_EQ(m.query_groups(), 2);
  EXPECT_EQ(m.rotary_base, 5000.0);
  EXPECT_EQ(m.layernorm_epsilon, 1e-5);
  EXPECT_EQ(m.normalization, model::Normalization::kRmsNorm);
  EXPECT_EQ(m.position_embedding, model::PositionEmbedding::kRope);
  EXPECT_TRUE(m.swiglu);
  EXPECT_FALSE(m.add_bias_linear);
  EXPECT_FALSE(m.tied_output());
  EXPECT_EQ(m.seq_length, 64);
  // And back: every key config.json gave is written with its value.
  EXPECT_EQ(ckpt::hf_arch_of(m), HfArch::kMixtral);
  const json out = ckpt::trident_to_hf_config(m, HfArch::kMixtral, imp.dtype);
  const json in = mixtral_config();
  for (const auto& [key, value] : in.items()) {
    if (key == "use_cache") continue;  // not trident's
    ASSERT_TRUE(out.contains(key)) << key;
    EXPECT_EQ(out[key], value) << key;
  }
  // Tied embeddings are read; a dense Llama-shaped model stays a Llama.
  json tied = mixtral_config();
  tied["tie_word_embeddings"] = true;
  EXPECT_TRUE(ckpt::hf_config_to_trident(tied, 0).model.tied_output());
  model::ModelConfig dense = m;
  dense.num_experts = 0;
  EXPECT_EQ(ckpt::hf_arch_of(dense), HfArch::kLlama);
}

// One transformers tensor per expert and matrix, each a distinct block of the stacked weights.
TEST(HfMixtral, EveryExpertHasItsTensors) {
  const model::ModelConfig m = ckpt::hf_config_to_trident(mixtral_config(), 0).model;
  const std::vector<ckpt::HfTensor> t = ckpt::hf_tensors(m, HfArch::kMixtral);
  // embed, norm, lm_head; per layer 2 norms, q, k, v, o, the router and 3 x 4 experts.
  EXPECT_EQ(t.size(), 3u + 2u * (2 + 4 + 1 + 3 * 4));
  std::set<std::pair<std::string, std::int64_t>> covered;
  for (const ckpt::HfTensor& x : t) {
    if (x.trident_name.find("experts") == std::string::npos) continue;
    const std::vector<std::int64_t> want = x.name.ends_with(".w2.weight")
                                               ? std::vector<std::int64_t>{32, 40}
                                               : std::vector<std::int64_t>{40, 32};
    EXPECT_EQ(x.shape, want) << x.name;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_TRUE(covered.insert({x.trident_name, x.index(i)}).second)
          << x.name << " element " << i << " is another tensor's too";
    }
  }
  // Both stacked weights of both layers, every element: 2 x (4 x 2 x 40 x 32 + 4 x 32 x 40).
  EXPECT_EQ(covered.size(), 2u * (4 * 2 * 40 * 32 + 4 * 32 * 40));
}

TEST(HfMixtral, ImportRefusesWhatTridentCannotRun) {
  const auto refusal = [](const json& c) {
    return error_of([&] { (void)ckpt::hf_config_to_trident(c, 0); });
  };
  json c = mixtral_config();
  c["sliding_window"] = 4096;
  EXPECT_NE(refusal(c).find("sliding_window = 4096 is not supported"), std::string::npos)
      << refusal(c);
  c = mixtral_config();
  c["router_jitter_noise"] = 0.1;
  EXPECT_NE(refusal(c).find("router_jitter_noise"), std::string::npos) << refusal(c);
  c = mixtral_config();
  c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_NE(refusal(c).find("rope_scaling"), std::string::npos) << refusal(c);
  c = mixtral_config();
  c["hidden_act"] = "gelu";
  EXPECT_NE(refusal(c).find("hidden_act"), std::string::npos) << refusal(c);
  c = mixtral_config();
  c["model_type"] = "gemma";  // an architecture trident does not convert
  const std::string gemma = refusal(c);
  EXPECT_NE(gemma.find("model_type 'gemma' is not supported"), std::string::npos) << gemma;
  c = mixtral_config();
  c["num_local_experts"] = 1 << 20;
  EXPECT_NE(refusal(c).find("num_local_experts 1048576"), std::string::npos) << refusal(c);
  c = mixtral_config();
  c["num_experts_per_tok"] = 5;  // more than the 4 experts
  EXPECT_FALSE(refusal(c).empty());
  EXPECT_EQ(refusal(mixtral_config()), "");
}

TEST(HfMixtral, ExportRefusesWhatMixtralCannotExpress) {
  const model::ModelConfig base = ckpt::hf_config_to_trident(mixtral_config(), 0).model;
  const std::vector<std::pair<std::string, std::function<void(model::ModelConfig&)>>> cases = {
      {"--moe-router-pre-softmax", [](model::ModelConfig& m) { m.moe_router_pre_softmax = true; }},
      {"--moe-router-score-function sigmoid",
       [](model::ModelConfig& m) {
         m.moe_router_score_function = model::MoeScoreFunction::kSigmoid;
       }},
      {"--moe-expert-capacity-factor",
       [](model::ModelConfig& m) { m.moe_expert_capacity_factor = 1.25; }},
      {"--moe-layer-freq", [](model::ModelConfig& m) { m.moe_layer_freq = 2; }},
      {"--moe-router-topk-scaling-factor",
       [](model::ModelConfig& m) { m.moe_router_topk_scaling_factor = 2.5; }},
      {"GeLU experts", [](model::ModelConfig& m) { m.swiglu = false; }},
      {"biases", [](model::ModelConfig& m) { m.add_bias_linear = true; }},
      {"--use-rope-scaling", [](model::ModelConfig& m) { m.rope_scaling = true; }},
      {"RMSNorm",
       [](model::ModelConfig& m) { m.normalization = model::Normalization::kLayerNorm; }},
  };
  for (const auto& [setting, change] : cases) {
    model::ModelConfig m = base;
    change(m);
    const std::string e = error_of([&] { (void)ckpt::hf_arch_of(m); });
    EXPECT_NE(e.find("not transformers' Mixtral"), std::string::npos) << setting << ": " << e;
    EXPECT_NE(e.find(setting), std::string::npos) << setting << ": " << e;
  }
  // Training-only settings do not change the model's function: exported as they are.
  model::ModelConfig m = base;
  m.moe_z_loss_coeff = 0.001;
  m.moe_router_load_balancing_type = model::MoeLoadBalancing::kSeqAuxLoss;
  m.moe_router_topk_scaling_factor = 1.0;
  EXPECT_EQ(ckpt::hf_arch_of(m), HfArch::kMixtral);
}

// --- Through the command line and transformers -------------------------------------------------

fs::path work_dir() {
  return fs::temp_directory_path() / ("trident_hf_mixtral_" + std::to_string(::getpid()));
}

int run(const std::string& cmd, const fs::path& log) {
  const std::string full = cmd + " > " + log.string() + " 2>&1";
  const int rc = std::system(full.c_str());
  if (rc != 0) {
    std::ifstream in(log);
    std::cerr << "command failed: " << full << "\n" << in.rdbuf();
  }
  return rc;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

TEST(HfMixtralCli, RefusalsNameTheSetting) {
  const fs::path dir = work_dir() / "refusals";
  fs::create_directories(dir);
  for (const auto& [key, value, expect] :
       {std::tuple<std::string, json, std::string>{"sliding_window", 4096, "sliding_window"},
        {"model_type", "gemma", "model_type 'gemma' is not supported"}}) {
    json c = mixtral_config();
    c[key] = value;
    const fs::path hf = dir / key;
    fs::create_directories(hf);
    std::ofstream(hf / "config.json") << c.dump(2);
    const fs::path log = dir / (key + ".txt");
    const std::string cmd = std::string(TRIDENT_CLI) + " convert --from-hf " + hf.string() +
                            " --save " + (dir / (key + "_ckpt")).string() + " > " + log.string() +
                            " 2>&1";
    EXPECT_NE(std::system(cmd.c_str()), 0) << cmd;
    const std::string out = read_file(log);
    EXPECT_NE(out.find(expect), std::string::npos) << out;
  }
  fs::remove_all(dir);
}

// The tiny Mixtral of tests/reference/hf_roundtrip.py (4 layers, hidden 32, 4 heads in 2
// key/value groups, 4 experts of F 40, top 2, router_aux_loss_coef 0.02, rope_theta 5000) with
// NullTokenizer's 301 ids.
constexpr const char* kModelFlags =
    " --num-layers 4 --hidden-size 32 --num-attention-heads 4 --ffn-hidden-size 40"
    " --max-position-embeddings 64 --seq-length 16 --model llama --group-query-attention"
    " --num-query-groups 2 --rotary-base 5000 --layernorm-epsilon 1e-5 --num-experts 4"
    " --moe-router-topk 2 --moe-ffn-hidden-size 40 --moe-aux-loss-coeff 0.02"
    " --tokenizer-type NullTokenizer --vocab-size 300";

// A learnable corpus (runs of increasing ids with noise) in NullTokenizer's ids.
void write_corpus(const fs::path& prefix) {
  data::IndexedDatasetBuilder b(prefix.string(), data::TokenDType::kU16);
  std::mt19937 rng(5);
  for (int doc = 0; doc < 100; ++doc) {
    std::vector<std::int32_t> ids(30 + doc % 17);
    std::int32_t t = static_cast<std::int32_t>(rng() % 300);
    for (auto& x : ids) {
      x = (rng() % 4 == 0) ? static_cast<std::int32_t>(rng() % 300) : t;
      t = (t + 1) % 300;
    }
    b.add_sequence(ids);
    b.end_document();
  }
  b.finalize();
}

TEST(HfMixtralFineTune, ImportedFineTunesAndExportsBack) {
  const fs::path dir = work_dir() / "finetune";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string py = std::string(TRIDENT_HF_PYTHON) + " " + TRIDENT_SOURCE_DIR;
  const std::string cli = std::string("OMP_NUM_THREADS=1 ") + TRIDENT_CLI;
  const fs::path hf_in = dir / "hf_in", imported = dir / "imported", tuned = dir / "tuned",
                 hf_out = dir / "hf_out";
  ASSERT_EQ(run(py + "/tests/reference/hf_tiny_model.py --variant mixtral --vocab 301 --out " +
                    hf_in.string(),
                dir / "make.txt"),
            0);
  ASSERT_EQ(run(cli + " convert --from-hf " + hf_in.string() + " --save " + imported.string() +
                    " --seq-length 16 --tensor-model-parallel-size 2",
                dir / "import.txt"),
            0);
  write_corpus(dir / "corpus");
  ASSERT_EQ(run(cli + " train" + kModelFlags + " --finetune --load " + imported.string() +
                    " --save " + tuned.string() + " --data-path " + (dir / "corpus").string() +
                    " --data-cache-path " + (dir / "cache").string() +
                    " --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --lr 3e-3"
                    " --min-lr 3e-3 --split 100,0,0 --log-interval 1 --eval-iters 0"
                    " --make-vocab-size-divisible-by 128 --hidden-dropout 0"
                    " --attention-dropout 0 --metrics-jsonl " +
                    (dir / "metrics.jsonl").string(),
                dir / "train.txt"),
            0);
  // --finetune starts at iteration 1: four training records, finite losses.
  std::vector<double> losses;
  {
    std::ifstream in(dir / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (!j.contains("split")) losses.push_back(j.at("lm_loss"));
    }
  }
  ASSERT_EQ(losses.size(), 4u);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  std::printf("fine-tuning losses %.4f %.4f %.4f %.4f\n", losses[0], losses[1], losses[2],
              losses[3]);
  ASSERT_EQ(run(cli + " convert --load " + tuned.string() + " --to-hf " + hf_out.string(),
                dir / "export.txt"),
            0);
  const json hf_config = json::parse(read_file(hf_out / "config.json"));
  EXPECT_EQ(hf_config.at("model_type"), "mixtral");
  EXPECT_EQ(hf_config.at("num_local_experts"), 4);
  EXPECT_EQ(hf_config.at("num_experts_per_tok"), 2);
  EXPECT_EQ(hf_config.at("router_aux_loss_coef"), 0.02);

  // The fine-tuned and the imported weights, whole (each checkpoint reassembles from its layout).
  const json manifest = ckpt::read_manifest(tuned.string(), -1);
  const model::ModelConfig mc = ckpt::model_config_from_json(manifest.at("config"));
  ASSERT_EQ(mc.num_experts, 4);
  ASSERT_EQ(manifest.at("iteration"), 4);
  const model::ParamTable table = model::build_gpt_param_table(mc);
  std::vector<float> tuned_w(static_cast<std::size_t>(table.total_numel)), start(tuned_w.size());
  ckpt::load_full_params(tuned.string(), -1, table, tuned_w.data());
  ckpt::load_full_params(imported.string(), -1, table, start.data());

  const std::vector<std::int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12};
  const fs::path out = dir / "transformers.trtf", params = dir / "params.trtf";
  ASSERT_EQ(run(py + "/tests/reference/hf_check_export.py --model " + hf_out.string() +
                    " --prompt '5 6 7 8 9 10 11 12' --max-new-tokens 20 --output " + out.string() +
                    " --expect-class MixtralForCausalLM --trident-params " + params.string() +
                    " --vocab-padded " + std::to_string(mc.padded_vocab_size()),
                dir / "check.txt"),
            0);
  const auto theirs = testing::read_tensor_file(params.string());
  ASSERT_EQ(theirs.size(), table.params.size());
  for (const model::ParamSpec& p : table.params) {
    const std::vector<float> w = testing::find_tensor(theirs, p.name).f32();
    ASSERT_EQ(static_cast<std::int64_t>(w.size()), p.numel) << p.name;
    const float* mine = tuned_w.data() + p.offset;
    EXPECT_EQ(std::memcmp(w.data(), mine, w.size() * sizeof(float)), 0)
        << p.name << ": transformers' tensor is not trident's weight bitwise";
    double moved = 0;
    for (std::int64_t i = 0; i < p.numel; ++i) {
      moved = std::max(moved, std::abs(static_cast<double>(mine[i]) - start[p.offset + i]));
    }
    EXPECT_GT(moved, 0.0) << p.name << " did not change in fine-tuning";
  }

  // transformers' logits and greedy tokens against trident's on the fine-tuned weights.
  const auto ref = testing::read_tensor_file(out.string());
  const model::GptParams gp = model::gpt_param_views(mc, table, tuned_w.data());
  const core::ExecContext ctx;
  model::GptActivations acts;
  const model::ModelRuntime rt;
  const auto T = static_cast<std::int64_t>(prompt.size());
  model::make_activations(mc, rt.shard, 1, T, acts);
  model::gpt_forward(ctx, mc, rt, gp, {.tokens = prompt.data(), .training = false}, acts);
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
  std::printf("fine-tuned Mixtral, exported: logits max rel diff %.2e\n", diff / scale);

  model::Generator gen(mc, gp);
  const float* logits = nullptr;
  for (std::int32_t id : prompt) logits = gen.step(ctx, id);
  std::vector<std::int64_t> mine;
  const model::SamplingConfig greedy{.temperature = 0.0f};
  for (std::int64_t i = 0; i < 20; ++i) {
    const std::int32_t next =
        model::sample_token(logits, mc.vocab_size, greedy, static_cast<std::uint64_t>(i));
    mine.push_back(next);
    logits = gen.step(ctx, next);
  }
  EXPECT_EQ(mine, testing::find_tensor(ref, "generated").i64())
      << "greedy tokens of trident vs transformers' generate()";
  fs::remove_all(work_dir());
}

// A model trained with a router Mixtral does not have is refused by --to-hf, naming the flag.
TEST(HfMixtralCli, ExportRefusesPreSoftmaxRouter) {
  const fs::path dir = work_dir() / "pre_softmax";
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_corpus(dir / "corpus");
  const std::string cli = std::string("OMP_NUM_THREADS=1 ") + TRIDENT_CLI;
  ASSERT_EQ(run(cli + " train" + kModelFlags + " --moe-router-pre-softmax --save " +
                    (dir / "ckpt").string() + " --data-path " + (dir / "corpus").string() +
                    " --data-cache-path " + (dir / "cache").string() +
                    " --micro-batch-size 2 --global-batch-size 2 --train-iters 1 --lr 1e-3"
                    " --split 100,0,0 --eval-iters 0",
                dir / "train.txt"),
            0);
  const fs::path log = dir / "export.txt";
  const std::string cmd = cli + " convert --load " + (dir / "ckpt").string() + " --to-hf " +
                          (dir / "hf").string() + " > " + log.string() + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0) << cmd;
  const std::string out = read_file(log);
  EXPECT_NE(out.find("not transformers' Mixtral: --moe-router-pre-softmax"), std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir / "hf" / "config.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trident
