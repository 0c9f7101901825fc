// The mixture-of-experts flags: Megatron-Core's (--num-experts, --moe-*) into the model config and
// the config JSON, the values trident refuses naming the flag, the layouts and precisions the
// layer does not run with yet, and Megatron-DeepSpeed's (DeepSpeed-MoE) flags mapped where its run
// is trident's, with its defaults, and refused where it is not.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "trident/model/gpt_weights.h"
#include "trident/train/compat_flags.h"
#include "trident/train/train_config.h"

namespace trident::train {
namespace {

namespace fs = std::filesystem;

// Parses `args` as `trident train` does (program name first, the flags given recorded) and
// finalizes for `world` ranks.
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

// A small model with the experts' MLP: SwiGLU without biases.
const std::vector<std::string> kBase = {
    "--num-layers",          "4",      "--hidden-size", "64",
    "--num-attention-heads", "4",      "--seq-length",  "32",
    "--data-path",           "corpus", "--swiglu",      "--disable-bias-linear"};

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> v = kBase;
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

std::string error_of(const std::vector<std::string>& args, int world = 1) {
  try {
    parse(args, world);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool warned(const TrainConfig& c, const std::string& what) {
  return std::any_of(c.warnings.begin(), c.warnings.end(),
                     [&](const std::string& w) { return w.find(what) != std::string::npos; });
}

#define EXPECT_ERROR(args, text)                                            \
  do {                                                                      \
    const std::string e_ = error_of(args);                                  \
    EXPECT_NE(e_.find(text), std::string::npos) << "error: '" << e_ << "'"; \
  } while (0)

// Megatron-Core's defaults: dense, and the router's defaults for when experts are asked for.
TEST(MoeFlags, DefaultsAreMegatronCores) {
  const TrainConfig c = parse(with({}));
  const model::ModelConfig m = c.model;
  EXPECT_EQ(m.num_experts, 0);
  EXPECT_EQ(m.moe_ffn_hidden_size, 0);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_layer_freq, 1);
  EXPECT_EQ(m.moe_router_score_function, model::MoeScoreFunction::kSoftmax);
  EXPECT_FALSE(m.moe_router_pre_softmax);
  EXPECT_EQ(m.moe_router_topk_scaling_factor, 0.0);
  EXPECT_EQ(m.moe_expert_capacity_factor, 0.0);
  EXPECT_EQ(m.moe_token_drop_policy, model::MoeDropPolicy::kProbs);
  EXPECT_FALSE(m.moe_pad_expert_input_to_capacity);
  EXPECT_EQ(m.moe_router_load_balancing_type, model::MoeLoadBalancing::kAuxLoss);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.0);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.0);
  // 0 and 1 are dense models (Megatron: 0 is None; Megatron-DeepSpeed's default is [1]).
  EXPECT_EQ(parse(with({"--num-experts", "0"})).model.num_experts, 0);
  EXPECT_EQ(parse(with({"--num-experts", "1"})).model.num_experts, 0);
  EXPECT_TRUE(c.warnings.empty());
}

// Every flag lands in the model config, and in the config JSON (checkpoint and argument table)
// with Megatron's spellings.
TEST(MoeFlags, EveryFlagReachesTheModelConfigAndTheJson) {
  const TrainConfig c = parse(with({"--num-experts",
                                    "8",
                                    "--moe-ffn-hidden-size",
                                    "96",
                                    "--moe-router-topk",
                                    "3",
                                    "--moe-layer-freq",
                                    "2",
                                    "--moe-router-score-function",
                                    "softmax",
                                    "--moe-router-pre-softmax",
                                    "--moe-router-topk-scaling-factor",
                                    "2.5",
                                    "--moe-expert-capacity-factor",
                                    "1.25",
                                    "--moe-token-drop-policy",
                                    "position",
                                    "--moe-pad-expert-input-to-capacity",
                                    "--moe-router-load-balancing-type",
                                    "seq_aux_loss",
                                    "--moe-aux-loss-coeff",
                                    "0.01",
                                    "--moe-z-loss-coeff",
                                    "0.001"}));
  const model::ModelConfig& m = c.model;
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.moe_ffn_hidden_size, 96);
  EXPECT_EQ(m.moe_ffn(), 96);
  EXPECT_EQ(m.moe_router_topk, 3);
  EXPECT_EQ(m.moe_layer_freq, 2);
  EXPECT_TRUE(m.moe_layer(0));
  EXPECT_FALSE(m.moe_layer(1));
  EXPECT_TRUE(m.moe_layer(2));
  EXPECT_EQ(m.moe_router_score_function, model::MoeScoreFunction::kSoftmax);
  EXPECT_TRUE(m.moe_router_pre_softmax);
  EXPECT_EQ(m.moe_router_topk_scaling_factor, 2.5);
  EXPECT_EQ(m.moe_expert_capacity_factor, 1.25);
  EXPECT_EQ(m.moe_token_drop_policy, model::MoeDropPolicy::kPosition);
  EXPECT_TRUE(m.moe_pad_expert_input_to_capacity);
  EXPECT_EQ(m.moe_router_load_balancing_type, model::MoeLoadBalancing::kSeqAuxLoss);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.001);
  model::ModelConfig sized = m;
  sized.vocab_size = 300;  // the tokenizer's, set by the trainer
  EXPECT_NO_THROW(sized.validate());
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();

  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j.at("num_experts"), 8);
  EXPECT_EQ(j.at("moe_ffn_hidden_size"), 96);
  EXPECT_EQ(j.at("moe_router_topk"), 3);
  EXPECT_EQ(j.at("moe_layer_freq"), 2);
  EXPECT_EQ(j.at("moe_router_score_function"), "softmax");
  EXPECT_EQ(j.at("moe_router_pre_softmax"), true);
  EXPECT_EQ(j.at("moe_router_topk_scaling_factor"), 2.5);
  EXPECT_EQ(j.at("moe_expert_capacity_factor"), 1.25);
  EXPECT_EQ(j.at("moe_token_drop_policy"), "position");
  EXPECT_EQ(j.at("moe_pad_expert_input_to_capacity"), true);
  EXPECT_EQ(j.at("moe_router_load_balancing_type"), "seq_aux_loss");
  EXPECT_EQ(j.at("moe_aux_loss_coeff"), 0.01);
  EXPECT_EQ(j.at("moe_z_loss_coeff"), 0.001);
  const std::string table = c.arguments_table();
  for (const char* line :
       {"\n  num_experts \\.+ 8\n", "\n  moe_router_load_balancing_type \\.+ seq_aux_loss\n",
        "\n  moe_token_drop_policy \\.+ position\n", "\n  moe_aux_loss_coeff \\.+ 0\\.01\n"}) {
    EXPECT_TRUE(std::regex_search(table, std::regex(line))) << line << table;
  }
}

// Each value of the three enum flags, and the values trident does not have, refused naming the
// flag (in a model with experts: Megatron reads them only there).
TEST(MoeFlags, EnumValues) {
  const auto model_of = [](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--num-experts", "4"});
    return parse(with(extra)).model;
  };
  EXPECT_EQ(model_of({"--moe-router-score-function", "sigmoid", "--moe-aux-loss-coeff", "0"})
                .moe_router_score_function,
            model::MoeScoreFunction::kSigmoid);
  EXPECT_EQ(model_of({"--moe-router-score-function", "softmax"}).moe_router_score_function,
            model::MoeScoreFunction::kSoftmax);
  EXPECT_EQ(model_of({"--moe-token-drop-policy", "probs"}).moe_token_drop_policy,
            model::MoeDropPolicy::kProbs);
  EXPECT_EQ(model_of({"--moe-token-drop-policy", "position"}).moe_token_drop_policy,
            model::MoeDropPolicy::kPosition);
  EXPECT_EQ(
      model_of({"--moe-router-load-balancing-type", "aux_loss"}).moe_router_load_balancing_type,
      model::MoeLoadBalancing::kAuxLoss);
  EXPECT_EQ(
      model_of({"--moe-router-load-balancing-type", "seq_aux_loss"}).moe_router_load_balancing_type,
      model::MoeLoadBalancing::kSeqAuxLoss);
  EXPECT_EQ(model_of({"--moe-router-load-balancing-type", "none"}).moe_router_load_balancing_type,
            model::MoeLoadBalancing::kNone);

  const std::vector<std::string> moe = {"--num-experts", "4"};
  auto plus = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), moe.begin(), moe.end());
    return with(extra);
  };
  EXPECT_ERROR(plus({"--moe-router-score-function", "sqrtsoftplus"}),
               "--moe-router-score-function: unknown or unsupported value 'sqrtsoftplus'");
  EXPECT_ERROR(plus({"--moe-token-drop-policy", "random"}),
               "--moe-token-drop-policy: unknown value 'random' (use probs or position)");
  EXPECT_ERROR(plus({"--moe-router-load-balancing-type", "sinkhorn"}),
               "--moe-router-load-balancing-type: unknown or unsupported type 'sinkhorn'");
  EXPECT_ERROR(plus({"--moe-router-load-balancing-type", "global_aux_loss"}),
               "sinkhorn, global_aux_loss and quantile_balancing are not in trident");
  // A dense run never reads them.
  EXPECT_EQ(error_of(with({"--moe-router-load-balancing-type", "sinkhorn"})), "");
  // The expert bias (aux-loss-free balancing) goes with the sigmoid router.
  const model::ModelConfig biased =
      model_of({"--moe-router-score-function", "sigmoid", "--moe-aux-loss-coeff", "0",
                "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.002"});
  EXPECT_TRUE(biased.moe_router_enable_expert_bias);
  EXPECT_DOUBLE_EQ(biased.moe_router_bias_update_rate, 0.002);
  EXPECT_DOUBLE_EQ(model_of({}).moe_router_bias_update_rate, 1e-3);  // Megatron's default
  // The model's check (run when the model is built, before any step).
  try {
    model::ModelConfig m = model_of({"--moe-router-enable-expert-bias"});
    m.vocab_size = 300;  // the tokenizer's, set when the run builds it
    m.validate();
    ADD_FAILURE() << "the expert bias with the softmax router was accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid"),
              std::string::npos)
        << e.what();
  }
}

// --moe-layer-freq takes an integer N (layers 0, N, 2N, ...) or Megatron's per-layer pattern, on
// the command line and in the --config file; a pattern of the wrong length and what is neither
// are refused naming the flag.
TEST(MoeFlags, LayerFreqIsAnIntegerOrAPattern) {
  EXPECT_EQ(parse(with({"--num-experts", "4", "--moe-layer-freq", "4"})).model.moe_layer_freq, 4);
  // kBase has 4 layers.
  const auto layers = [](const TrainConfig& c) {
    std::string s;
    for (std::int64_t l = 0; l < c.model.num_layers; ++l) s += c.model.moe_layer(l) ? '1' : '0';
    return s;
  };
  for (const auto& [pattern, want] :
       std::vector<std::pair<std::string, std::string>>{{"[1,0,1,0]", "1010"},
                                                        {"[0,1,1,0]", "0110"},
                                                        {"([1]*3+[0]*1)", "1110"},
                                                        {"([0]*1+[1]*1)*2", "0101"},
                                                        {" [ 1 , 1 ] + 2 * [0] ", "1100"}}) {
    const TrainConfig c = parse(with({"--num-experts", "4", "--moe-layer-freq", pattern}));
    EXPECT_EQ(layers(c), want) << pattern;
    EXPECT_EQ(c.model.moe_layer_freq, 1) << pattern;
    // The config JSON (checkpoint, arguments table) holds Megatron's list.
    std::vector<int> list;
    for (char b : want) list.push_back(b - '0');
    EXPECT_EQ(c.to_json().at("moe_layer_freq"), nlohmann::json(list)) << pattern;
  }
  // The integer after a pattern clears it (the last one given wins, as any flag).
  EXPECT_EQ(layers(parse(with({"--num-experts", "4", "--moe-layer-freq", "3"}))), "1001");
  // Megatron's check: one entry per layer.
  EXPECT_ERROR(with({"--num-experts", "4", "--moe-layer-freq", "([1]*3+[0]*1)*2"}),
               "--moe-layer-freq [1,1,1,0,1,1,1,0] has 8 entries; a pattern needs one per layer "
               "(--num-layers 4)");
  EXPECT_ERROR(with({"--num-experts", "4", "--moe-layer-freq", "[1,0]"}),
               "--moe-layer-freq [1,0] has 2 entries; a pattern needs one per layer "
               "(--num-layers 4)");
  // No layer with experts.
  EXPECT_ERROR(with({"--num-experts", "4", "--moe-layer-freq", "[0]*4"}),
               "makes no layer a mixture of experts; use --num-experts 0");
  // Neither an integer nor a pattern (no '[': an integer, as Megatron's moe_freq_type).
  for (const char* bad : {"2.5", "two", "(2)"}) {
    const std::string e = error_of(with({"--num-experts", "4", "--moe-layer-freq", bad}));
    EXPECT_NE(e.find(std::string("--moe-layer-freq: '") + bad +
                     "': an integer N (an expert layer every N-th layer, starting at layer 0) or "
                     "a pattern of 0 and 1 per layer"),
              std::string::npos)
        << e;
  }
  // A malformed pattern: the parser's message, through CLI11.
  EXPECT_ERROR(with({"--num-experts", "4", "--moe-layer-freq", "[1,2,1,0]"}),
               "--moe-layer-freq: '[1,2,1,0]': a layer's entry is 0 (dense) or 1 (experts), not 2 "
               "at character 4");
  EXPECT_ERROR(with({"--num-experts", "4", "--moe-layer-freq", "__import__('os')[0]"}),
               "--moe-layer-freq: '__import__('os')[0]': unexpected '_' at character 1");
  const fs::path toml = fs::temp_directory_path() / "trident_moe_flags_test.toml";
  std::ofstream(toml) << "num-experts = 4\nmoe-layer-freq = \"([1]*3+[0]*1)\"\n";
  EXPECT_EQ(layers(parse(with({"--config", toml.string()}))), "1110");
  std::ofstream(toml) << "num-experts = 4\nmoe-layer-freq = \"([1]*3+[0]*1\"\n";
  EXPECT_ERROR(with({"--config", toml.string()}),
               "--moe-layer-freq: '([1]*3+[0]*1': the expression ends early (a '(' is not "
               "closed)");
  std::ofstream(toml) << "num-experts = 4\nmoe-layer-freq = 2\nmoe-router-topk = 1\n"
                         "moe-router-score-function = \"sigmoid\"\nmoe-aux-loss-coeff = 0.0\n";
  const TrainConfig c = parse(with({"--config", toml.string()}));
  EXPECT_EQ(c.model.num_experts, 4);
  EXPECT_EQ(c.model.moe_layer_freq, 2);
  EXPECT_EQ(c.model.moe_router_topk, 1);
  EXPECT_EQ(c.model.moe_router_score_function, model::MoeScoreFunction::kSigmoid);
  fs::remove(toml);
}

// Megatron's lists (several counts, losses, coefficients) are refused naming the flag; a negative
// capacity factor is Megatron-Core's "none" (dropless).
TEST(MoeFlags, ListsAndNegativeCapacity) {
  EXPECT_ERROR(with({"--num-experts", "8", "16"}),
               "--num-experts: '8 16': one count for every expert layer is supported "
               "(Megatron-DeepSpeed's per-layer lists are not)");
  EXPECT_EQ(parse(with({"--num-experts", "8"})).model.num_experts, 8);
  EXPECT_ERROR(
      with({"--num-experts", "4", "--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss"}),
      "--moe-router-load-balancing-type: one type is supported");
  EXPECT_ERROR(with({"--num-experts", "4", "--moe-aux-loss-coeff", "0.01", "0.001"}),
               "--moe-aux-loss-coeff: one coefficient is supported");
  EXPECT_EQ(parse(with({"--num-experts", "4", "--moe-expert-capacity-factor", "-1"}))
                .model.moe_expert_capacity_factor,
            0.0);
}

// What the layer does not run with yet: BF16 / FP16, expert parallelism; tensor parallelism
// needs F to divide.
TEST(MoeFlags, LayoutsAndPrecisionsNotBuiltYetAreRefused) {
  const std::vector<std::string> moe = with({"--num-experts", "4"});
  auto plus = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = moe;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  // Tensor parallelism splits each expert's F, which must divide.
  EXPECT_EQ(error_of(plus({"--tensor-model-parallel-size", "2"}), 2), "");
  EXPECT_NE(error_of(plus({"--tensor-model-parallel-size", "2", "--moe-ffn-hidden-size", "33"}), 2)
                .find("--moe-ffn-hidden-size (33) must be divisible by "
                      "--tensor-model-parallel-size (2)"),
            std::string::npos);
  EXPECT_EQ(error_of(with({"--tensor-model-parallel-size", "2"}), 2), "");  // dense
  EXPECT_EQ(error_of(plus({"--pipeline-model-parallel-size", "2"}), 2), "");
  // BF16 and FP16 (loss scaling; from the DeepSpeed JSON too) with experts.
  EXPECT_EQ(error_of(plus({"--bf16"})), "");
  EXPECT_EQ(error_of(plus({"--fp16"})), "");
  EXPECT_EQ(error_of(with({"--bf16"})), "");
  const fs::path ds_json = fs::temp_directory_path() / "trident_moe_flags_test_ds.json";
  std::ofstream(ds_json) << R"({"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": true}})";
  EXPECT_TRUE(parse(plus({"--deepspeed", "--deepspeed_config", ds_json.string()})).fp16);
  fs::remove(ds_json);
  // Expert parallelism (--moe-expert-parallel-size is Megatron-DeepSpeed's name: its script says
  // how it routes): the experts over ep of the dp ranks.
  for (const char* flag : {"--expert-model-parallel-size", "--moe-expert-parallel-size"}) {
    std::vector<std::string> extra;
    if (std::string(flag) == "--moe-expert-parallel-size") {
      extra = {"--expert-interval", "1", "--disable-moe-token-dropping"};
    }
    auto args = [&](std::vector<std::string> a) {
      std::vector<std::string> v = plus(std::move(a));
      v.insert(v.end(), extra.begin(), extra.end());
      return v;
    };
    EXPECT_EQ(error_of(args({flag, "1"})), "") << flag;
    EXPECT_EQ(error_of(args({flag, "2"}), 2), "") << flag;
    EXPECT_EQ(parse(args({flag, "4"}), 8).expert_model_parallel_size, 4) << flag;
    EXPECT_ERROR(args({flag, "2"}),  // one rank: dp 1
                 "--expert-model-parallel-size 2 must divide the data-parallel size 1 (1 ranks / "
                 "(tp 1 x pp 1)): the experts are split over data-parallel ranks");
    EXPECT_ERROR(args({flag, "3"}),
                 "--num-experts (4) must be divisible by --expert-model-parallel-size (3)");
  }
  EXPECT_ERROR(with({"--expert-model-parallel-size", "2"}),
               "--expert-model-parallel-size 2 needs a mixture-of-experts model (--num-experts)");
  EXPECT_EQ(error_of(plus({"--expert-model-parallel-size", "2", "--save", "/tmp/x"}), 2), "");
  // The experts' optimizer offloads as the dense one (its own files).
  EXPECT_EQ(error_of(plus({"--expert-model-parallel-size", "2", "--offload-optimizer", "cpu"}), 2),
            "");
  // Each expert is split over the tp ranks: --expert-tensor-parallel-size = tp is accepted.
  EXPECT_EQ(error_of(plus({"--expert-tensor-parallel-size", "1"})), "");
  EXPECT_EQ(
      error_of(plus({"--expert-tensor-parallel-size", "2", "--tensor-model-parallel-size", "2"}),
               2),
      "");
  EXPECT_NE(error_of(plus({"--expert-tensor-parallel-size", "2"}))
                .find("--expert-tensor-parallel-size 2: not supported by trident"),
            std::string::npos);
}

// Group-limited routing (DeepSeek-V3) reaches the router, with Megatron-Core's limits.
TEST(MoeFlags, GroupLimitedRouting) {
  auto plus = [](std::vector<std::string> extra) {
    std::vector<std::string> v = with({"--num-experts", "4", "--moe-router-topk", "2"});
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  const TrainConfig c =
      parse(plus({"--moe-router-num-groups", "2", "--moe-router-group-topk", "1"}));
  EXPECT_EQ(c.model.moe_router_num_groups, 2);
  EXPECT_EQ(c.model.moe_router_group_topk, 1);
  const auto moe = model::moe_config(c.model, 1);
  EXPECT_EQ(moe.router.num_groups, 2);
  EXPECT_EQ(moe.router.group_topk, 1);
  EXPECT_EQ(parse(plus({})).model.moe_router_num_groups, 0);
  EXPECT_ERROR(plus({"--moe-router-num-groups", "3", "--moe-router-group-topk", "1"}),
               "--moe-router-num-groups 3 must divide --num-experts 4");
  // Half of the pair, either way, is refused rather than ignored.
  EXPECT_ERROR(plus({"--moe-router-group-topk", "1"}),
               "--moe-router-num-groups 0 and --moe-router-group-topk 1: group-limited routing "
               "needs both");
  EXPECT_EQ(parse(plus({"--moe-router-num-groups", "1", "--moe-router-group-topk", "1"}))
                .model.moe_router_num_groups,
            0);  // one group of every expert: no limit
  EXPECT_ERROR(plus({"--moe-router-num-groups", "2"}),
               "--moe-router-num-groups 2 and --moe-router-group-topk 0: group-limited routing "
               "needs both");
  EXPECT_ERROR(plus({"--moe-router-num-groups", "4", "--moe-router-group-topk", "1"}),
               "--moe-router-group-topk 1 must be at most --moe-router-num-groups 4, divide "
               "--moe-router-topk 2, and its groups must hold 2 experts (1 per group)");
  // A dense run accepts them (Megatron reads them only with experts).
  const TrainConfig dense =
      parse(with({"--moe-router-num-groups", "2", "--moe-router-group-topk", "1"}));
  EXPECT_EQ(dense.model.moe_router_num_groups, 0);
}

// Megatron-Core flags trident does not build are refused with their reason in a model with
// experts and accepted in a dense one (Megatron reads them only with experts); kernel and
// communication switches are no-ops, said once.
TEST(MoeFlags, UnbuiltFeaturesAndNoOps) {
  const std::vector<std::pair<std::vector<std::string>, const char*>> refused = {
      {{"--moe-input-jitter-eps", "0.01"}, "random noise on the router's input"},
      {{"--moe-router-dtype", "fp64"}, "fp64 is refused"},
      {{"--moe-router-type", "sinkhorn1"}, "use --moe-router-topk"},
      {{"--moe-latent-size", "32"}, "not in trident"},
  };
  for (const auto& [flags, why] : refused) {
    std::vector<std::string> moe = with({"--num-experts", "4"}), dense = with({});
    moe.insert(moe.end(), flags.begin(), flags.end());
    dense.insert(dense.end(), flags.begin(), flags.end());
    const std::string e = error_of(moe);
    EXPECT_NE(e.find(flags[0] + (flags.size() > 1 ? " " + flags[1] : std::string()) +
                     ": not supported by trident"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find(why), std::string::npos) << e;
    EXPECT_EQ(error_of(dense), "") << flags[0];
  }
  EXPECT_EQ(error_of(with({"--num-experts", "4", "--moe-router-dtype", "fp32"})), "");
  // Megatron-DeepSpeed's Switch MLP makes experts by itself: refused in any run.
  EXPECT_ERROR(with({"--num-experts-switch", "8"}), "--num-experts-switch 8: not supported");
  const TrainConfig c =
      parse(with({"--num-experts", "4", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
                  "alltoall", "--moe-permute-fusion"}));
  EXPECT_TRUE(warned(c, "--moe-grouped-gemm: accepted, no effect in trident (kernel choice"));
  EXPECT_TRUE(warned(c, "--moe-token-dispatcher-type alltoall: accepted, no effect"));
  EXPECT_TRUE(warned(c, "--moe-permute-fusion: accepted, no effect"));
  EXPECT_EQ(c.model.num_experts, 4);
}

// The table says which refused flags a dense run accepts ("accepted in dense runs"): each is
// refused with experts, naming itself, and accepted without.
TEST(MoeFlags, TheTableSaysWhatDenseRunsAccept) {
  int dense_ok = 0;
  for (const CompatFlag& f : megatron_flag_table()) {
    if (f.status != FlagStatus::kRefused) continue;
    const bool says = f.note.find("accepted in dense runs") != std::string_view::npos;
    std::vector<std::string> flag = {std::string(f.name)};
    if (f.values != 0) flag.push_back("7");
    std::vector<std::string> moe = with({"--num-experts", "4"}), dense = with({});
    moe.insert(moe.end(), flag.begin(), flag.end());
    dense.insert(dense.end(), flag.begin(), flag.end());
    if (says) {
      ++dense_ok;
      EXPECT_EQ(error_of(dense), "") << f.name;
      EXPECT_NE(error_of(moe).find(std::string(f.name)), std::string::npos) << f.name;
    } else if (f.name.find("moe") != std::string_view::npos ||
               f.name.find("expert") != std::string_view::npos) {
      EXPECT_NE(error_of(dense), "") << f.name << " is accepted in a dense run; say so";
    }
  }
  // The 20 of issue 33, --mlp-type and --use-tutel, less --moe-shared-expert-intermediate-size,
  // --moe-router-enable-expert-bias, --moe-router-num-groups and --moe-router-group-topk (built
  // since).
  EXPECT_EQ(dense_ok, 18);
}

// Megatron-DeepSpeed's flags (DeepSpeed-MoE) where its run is trident's: top-1 is Switch routing
// (the chosen expert's softmax probability: --moe-router-pre-softmax), --moe-loss-coeff the
// Switch loss, dropless with --disable-moe-token-dropping, experts in every layer.
TEST(MoeFlags, DeepSpeedMoeFlagsMapped) {
  const std::vector<std::string> ds = {"--num-experts", "8", "--expert-interval", "1",
                                       "--disable-moe-token-dropping"};
  auto plus = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = with(ds);
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  TrainConfig c = parse(plus({"--topk", "1", "--moe-loss-coeff", "0.01", "--mlp-type", "standard",
                              "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor",
                              "2.0", "--moe-min-capacity", "4", "--create-moe-param-group"}));
  EXPECT_EQ(c.model.num_experts, 8);
  EXPECT_EQ(c.model.moe_router_topk, 1);
  EXPECT_TRUE(c.model.moe_router_pre_softmax);
  EXPECT_EQ(c.model.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(c.model.moe_router_load_balancing_type, model::MoeLoadBalancing::kAuxLoss);
  EXPECT_EQ(c.model.moe_layer_freq, 1);
  EXPECT_EQ(c.model.moe_expert_capacity_factor, 0.0);
  model::ModelConfig sized = c.model;
  sized.vocab_size = 300;
  EXPECT_NO_THROW(sized.validate());
  EXPECT_TRUE(warned(c, "DeepSpeed-MoE's torch.nn.Linear draws them uniform"));
  EXPECT_TRUE(warned(c, "--create-moe-param-group: accepted, no effect"));
  // Megatron-DeepSpeed's defaults where the script relies on them: top-1, coefficient 0.1.
  c = parse(plus({}));
  EXPECT_EQ(c.model.moe_router_topk, 1);
  EXPECT_TRUE(c.model.moe_router_pre_softmax);
  EXPECT_EQ(c.model.moe_aux_loss_coeff, 0.1);
  // Top-2 with the second expert by argmax and no DeepSpeed load-balancing loss: the softmax
  // over the two chosen (DeepSpeed's renormalised gates).
  c = parse(
      plus({"--topk", "2", "--disable-moe-top2-2nd-expert-sampling", "--moe-loss-coeff", "0"}));
  EXPECT_EQ(c.model.moe_router_topk, 2);
  EXPECT_FALSE(c.model.moe_router_pre_softmax);
  EXPECT_EQ(c.model.moe_aux_loss_coeff, 0.0);
  // Megatron-Core's flags in the same script win over Megatron-DeepSpeed's defaults.
  c = parse(with({"--num-experts", "8", "--create-moe-param-group", "--moe-router-topk", "2",
                  "--moe-layer-freq", "2", "--moe-expert-capacity-factor", "1.5",
                  "--moe-aux-loss-coeff", "0.02"}));
  EXPECT_EQ(c.model.moe_router_topk, 2);
  EXPECT_FALSE(c.model.moe_router_pre_softmax);
  EXPECT_EQ(c.model.moe_layer_freq, 2);
  EXPECT_EQ(c.model.moe_expert_capacity_factor, 1.5);
  EXPECT_EQ(c.model.moe_aux_loss_coeff, 0.02);
  // Megatron-LM's name of late 2023.
  EXPECT_EQ(parse(with({"--num-experts", "4", "--moe-frequency", "2"})).model.moe_layer_freq, 2);
}

// --expert-interval N: Megatron-DeepSpeed's experts in layers N, 2N, ... counted from 1
// (get_num_experts_per_layer: layer i + 1 divisible by N), 0-based N - 1, 2N - 1, ...: the
// pattern; its default 2 too. (kBase has 4 layers.)
TEST(MoeFlags, ExpertIntervalIsAPattern) {
  const auto layers = [](const TrainConfig& c) {
    std::string s;
    for (std::int64_t l = 0; l < c.model.num_layers; ++l) s += c.model.moe_layer(l) ? '1' : '0';
    return s;
  };
  const std::vector<std::string> ds = {"--num-experts", "8", "--disable-moe-token-dropping"};
  auto plus = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = with(ds);
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  EXPECT_EQ(layers(parse(plus({"--expert-interval", "1"}))), "1111");
  EXPECT_TRUE(parse(plus({"--expert-interval", "1"})).model.moe_layer_pattern.empty());
  EXPECT_EQ(layers(parse(plus({"--expert-interval", "2"}))), "0101");
  EXPECT_EQ(layers(parse(plus({"--expert-interval", "3"}))), "0010");
  EXPECT_EQ(layers(parse(plus({"--expert-interval", "4"}))), "0001");
  EXPECT_EQ(layers(parse(plus({}))), "0101");  // Megatron-DeepSpeed's default 2
  // Over 6 layers: 2, 4, 6 counted from 1.
  std::vector<std::string> six = plus({"--expert-interval", "2"});
  six[1] = "6";
  ASSERT_EQ(six[0], "--num-layers");
  const TrainConfig c = parse(six);
  EXPECT_EQ(layers(c), "010101");
  EXPECT_EQ(c.to_json().at("moe_layer_freq"), nlohmann::json({0, 1, 0, 1, 0, 1}));
  model::ModelConfig sized = c.model;
  sized.vocab_size = 300;
  EXPECT_NO_THROW(sized.validate());
  // --moe-layer-freq given wins (and the two together are refused, as before).
  EXPECT_EQ(layers(parse(plus({"--moe-layer-freq", "[1,1,0,0]"}))), "1100");
  EXPECT_ERROR(plus({"--expert-interval", "2", "--moe-layer-freq", "2"}),
               "--expert-interval with --moe-layer-freq: give one");
}

// Where Megatron-DeepSpeed's run is not trident's: refused, saying what differs and what to give.
TEST(MoeFlags, DeepSpeedMoeFlagsRefused) {
  const std::vector<std::string> ds = {"--num-experts", "8", "--expert-interval", "1",
                                       "--disable-moe-token-dropping"};
  auto plus = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = with(ds);
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  EXPECT_ERROR(plus({"--topk", "2", "--moe-loss-coeff", "0"}),
               "--topk 2: DeepSpeed-MoE draws each token's second expert with Gumbel noise");
  EXPECT_ERROR(plus({"--topk", "2", "--disable-moe-top2-2nd-expert-sampling"}),
               "Megatron-DeepSpeed's default --moe-loss-coeff 0.1 with top-2 routing: "
               "DeepSpeed-MoE's top-2 load-balancing loss counts the first choices only");
  EXPECT_ERROR(
      plus({"--topk", "2", "--disable-moe-top2-2nd-expert-sampling", "--moe-loss-coeff", "0.01"}),
      "--moe-loss-coeff 0.01 with top-2 routing");
  EXPECT_ERROR(
      plus({"--moe-loss-coeff", "0.01", "--moe-router-load-balancing-type", "seq_aux_loss"}),
      "is DeepSpeed-MoE's Switch loss (aux_loss)");
  // More than the layers: no layer would have experts.
  EXPECT_ERROR(
      with({"--num-experts", "8", "--disable-moe-token-dropping", "--expert-interval", "5"}),
      "--expert-interval 5 with --num-layers 4: no layer would have experts");
  // DeepSpeed-MoE's token dropping.
  EXPECT_ERROR(with({"--num-experts", "8", "--expert-interval", "1", "--topk", "1"}),
               "Megatron-DeepSpeed's mixture of experts drops tokens by default");
  EXPECT_ERROR(
      with({"--num-experts", "8", "--expert-interval", "1", "--moe-train-capacity-factor", "1.25"}),
      "--moe-train-capacity-factor 1.25: not supported by trident (DeepSpeed-MoE drops "
      "over-capacity tokens at random");
  EXPECT_ERROR(with({"--num-experts", "8", "--expert-interval", "1", "--moe-min-capacity", "4"}),
               "--moe-min-capacity 4: not supported by trident");
  EXPECT_ERROR(plus({"--mlp-type", "residual"}),
               "--mlp-type residual: not supported by trident "
               "(standard is accepted; residual (PR-MoE");
  // Both names of one setting.
  EXPECT_ERROR(plus({"--topk", "1", "--moe-router-topk", "1"}),
               "--topk with --moe-router-topk: give one");
  EXPECT_ERROR(plus({"--moe-loss-coeff", "0.1", "--moe-aux-loss-coeff", "0.1"}),
               "--moe-loss-coeff with --moe-aux-loss-coeff: give one");
  EXPECT_ERROR(plus({"--moe-expert-capacity-factor", "1.0"}),
               "--disable-moe-token-dropping with --moe-expert-capacity-factor: give one");
}

// A dense Megatron-DeepSpeed script (--num-experts 1, its default) carries its MoE flags, which
// Megatron-DeepSpeed then never reads: accepted, the model dense.
TEST(MoeFlags, DenseMegatronDeepSpeedScriptsKeepTheirMoeFlags) {
  const TrainConfig c = parse(with({"--num-experts", "1", "--topk", "2", "--expert-interval", "2",
                                    "--moe-train-capacity-factor", "1.0", "--moe-min-capacity", "4",
                                    "--moe-loss-coeff", "0.1", "--mlp-type", "residual"}));
  EXPECT_EQ(c.model.num_experts, 0);
  EXPECT_EQ(c.model.moe_aux_loss_coeff, 0.0);
  // With --deepspeed and nothing but --num-experts, Megatron-Core's defaults are said.
  TrainConfig d = parse(with({"--num-experts", "8"}), 1, false);
  d.deepspeed = true;
  apply_compat_flags(d);
  EXPECT_TRUE(
      warned(d, "--num-experts 8 with --deepspeed: trident takes Megatron-Core's defaults"));
  EXPECT_EQ(d.model.moe_router_topk, 2);
}

}  // namespace
}  // namespace trident::train
