// Hyperparameters as the user wrote them: doubles from the flags to the configuration, checkpoint
// and argument table (the kernels take float); the table prints them as Megatron does (Python's
// repr: 0.9, 0.999, 1e-08); the configuration JSON round-trips, and checkpoints written when the
// values were single precision (0.8999999761581421, 9.999999747378752e-06) still load and resume.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "train_fixture.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/train/train_config.h"

namespace trident::train {
namespace {

TEST(PythonFloatRepr, KnownValues) {
  // Each right-hand side is what Python 3 prints for repr(float(...)).
  const std::pair<double, const char*> cases[] = {
      {0.9, "0.9"},
      {0.999, "0.999"},
      {1e-8, "1e-08"},
      {1e-5, "1e-05"},
      {6e-4, "0.0006"},
      {0.0001, "0.0001"},
      {0.1, "0.1"},
      {0.95, "0.95"},
      {1.0, "1.0"},
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {-2.5, "-2.5"},
      {4294967296.0, "4294967296.0"},
      {1e15, "1000000000000000.0"},
      {1e16, "1e+16"},
      {1.5e16, "1.5e+16"},
      {123456789012345678.0, "1.2345678901234568e+17"},
      {0.1 + 0.2, "0.30000000000000004"},
      {static_cast<double>(0.9f), "0.8999999761581421"},
      {static_cast<double>(1e-8f), "9.99999993922529e-09"},
      {2.5e-5, "2.5e-05"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {std::numeric_limits<double>::infinity(), "inf"},
      {-std::numeric_limits<double>::infinity(), "-inf"},
      {std::nan(""), "nan"},
  };
  for (const auto& [x, want] : cases) EXPECT_EQ(python_float_repr(x), want) << want;
}

// Against Python itself on random doubles: random bit patterns (every exponent) and values a user
// types (a few digits times a power of ten).
TEST(PythonFloatRepr, EqualsPythonsRepr) {
  std::mt19937_64 rng(11);
  std::vector<double> xs;
  for (int i = 0; i < 3000; ++i) {
    const double x = std::bit_cast<double>(rng());
    if (std::isfinite(x)) xs.push_back(x);
  }
  for (int i = 0; i < 3000; ++i) {
    const double digits = static_cast<double>(rng() % 100000);
    const int exp10 = static_cast<int>(rng() % 40) - 25;
    xs.push_back(digits * std::pow(10.0, exp10) * ((rng() & 1) ? 1 : -1));
  }
  const std::string in = testing::TempDir() + "trident_repr_in.txt";
  {
    std::ofstream f(in);
    char buf[64];
    for (double x : xs) {
      std::snprintf(buf, sizeof(buf), "%a\n", x);
      f << buf;
    }
  }
  const std::string cmd =
      "python3 -c 'import sys\nfor l in open(sys.argv[1]): print(repr(float.fromhex(l)))' " + in;
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  ASSERT_EQ(::pclose(p), 0) << "python3 is needed (scripts/install-deps)";
  std::vector<std::string> want;
  std::size_t at = 0;
  for (std::size_t nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1) {
    want.push_back(out.substr(at, nl - at));
  }
  ASSERT_EQ(want.size(), xs.size());
  int differ = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (python_float_repr(xs[i]) != want[i] && ++differ <= 10) {
      ADD_FAILURE() << "python " << want[i] << " vs " << python_float_repr(xs[i]);
    }
  }
  EXPECT_EQ(differ, 0);
}

TEST_F(TrainTest, HyperparametersAreDoublesAsWritten) {
  const TrainConfig c =
      parse({"--adam-beta1", "0.9", "--adam-beta2", "0.999", "--adam-eps", "1e-8", "--weight-decay",
             "0.1", "--clip-grad", "0.3", "--init-method-std", "0.006", "--layernorm-epsilon",
             "1e-5", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"});
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.optimizer.clip_grad, 0.3);
  EXPECT_EQ(c.model.init_method_std, 0.006);
  EXPECT_EQ(c.model.layernorm_epsilon, 1e-5);
  EXPECT_EQ(c.model.hidden_dropout, 0.1);
  EXPECT_EQ(c.model.attention_dropout, 0.1);
  // The table, as Megatron prints these (Python's str of the argparse values).
  const std::string table = c.arguments_table();
  for (const char* line :
       {"  adam_beta1 \\.+ 0\\.9\n", "  adam_beta2 \\.+ 0\\.999\n", "  adam_eps \\.+ 1e-08\n",
        "  weight_decay \\.+ 0\\.1\n", "  clip_grad \\.+ 0\\.3\n", "  lr \\.+ 0\\.001\n",
        "  init_method_std \\.+ 0\\.006\n", "  layernorm_epsilon \\.+ 1e-05\n",
        "  initial_loss_scale \\.+ 4294967296\\.0\n", "  bf16 \\.+ False\n",
        "  lr_warmup_iters \\.+ 2\n", "  rampup_batch_size \\.+ \\[\\]\n"}) {
    EXPECT_TRUE(std::regex_search(table, std::regex(line))) << line << "\n" << table;
  }
  EXPECT_EQ(table.find("0.89999998"), std::string::npos) << table;
}

// The configuration a checkpoint stores reads back to the same doubles.
TEST_F(TrainTest, ConfigJsonRoundTrips) {
  TrainConfig c = parse({"--init-method-std", "0.0123456789", "--layernorm-epsilon", "3.3e-6",
                         "--position-embedding-type", "rope", "--rotary-base", "1234.56"});
  c.finalize(1);
  c.model.vocab_size = 300;
  const nlohmann::json j = nlohmann::json::parse(c.to_json().dump());
  EXPECT_EQ(j.at("adam_beta2").get<double>(), 0.999);
  const model::ModelConfig m = ckpt::model_config_from_json(j);
  EXPECT_EQ(m.init_method_std, 0.0123456789);
  EXPECT_EQ(m.layernorm_epsilon, 3.3e-6);
  EXPECT_EQ(m.rotary_base, 1234.56);
  std::string why;
  EXPECT_TRUE(ckpt::architecture_matches(j, c.to_json(), &why)) << why;
}

// The trainer's settings are one list (train_config.cc, Settings): every `trident train` flag
// that is a setting (not --config, not a compatibility flag) has its key in the config JSON the
// checkpoint and the start-up arguments table read, holding the value the flag gave.
TEST_F(TrainTest, EverySettingFlagIsInTheConfigJson) {
  TrainConfig c =
      parse({"--async-save", "--save-retain", "3", "--device", "cpu", "--kill-switch-path",
             "/tmp/stop-here", "--offload-window-mib", "96", "--log-throughput"});
  c.finalize(1);
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j.at("async_save"), true);
  EXPECT_EQ(j.at("save_retain"), 3);
  EXPECT_EQ(j.at("device"), "cpu");
  EXPECT_EQ(j.at("kill_switch_path"), "/tmp/stop-here");
  EXPECT_EQ(j.at("offload_window_mib"), 96.0);
  EXPECT_EQ(j.at("log_throughput"), true);
  EXPECT_EQ(j.at("null_tokenizer_vocab_size"), 300);  // --vocab-size: the NullTokenizer's

  CLI::App app;
  TrainConfig fresh;
  add_train_options(app, fresh);
  const nlohmann::json defaults = fresh.to_json();
  int settings = 0;
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_lnames().empty()) continue;
    const std::string name = o->get_lnames()[0];
    // Compatibility flags (add_compat_options) land in cfg.compat, printed apart.
    if (name == "config" || name == "help" || o->get_group().starts_with("Megatron / DeepSpeed"))
      continue;
    std::string key = name;
    std::replace(key.begin(), key.end(), '-', '_');
    if (name == "vocab-size") key = "null_tokenizer_vocab_size";
    if (name == "disable-bias-linear") key = "add_bias_linear";  // the model's key
    EXPECT_TRUE(defaults.contains(key)) << "--" << name << " has no '" << key << "' in to_json";
    ++settings;
  }
  EXPECT_GT(settings, 120);
}

// A checkpoint written while the settings were floats holds their float values (rotary_base
// 1234.56 as 1234.56005859375): it still matches a run given the same flags, and resumes with the
// uninterrupted run's losses, bitwise.
TEST_F(TrainTest, CheckpointsWithSinglePrecisionValuesStillLoad) {
  const std::vector<std::string> flags = {
      "--position-embedding-type", "rope", "--rotary-base", "1234.56", "--adam-beta2", "0.95"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), flags.begin(), flags.end());
    return parse(more);
  };
  const std::string full = (dir_ / "full.jsonl").string(), part = (dir_ / "part.jsonl").string();
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(with({"--train-iters", "6", "--metrics-jsonl", full})), 0);
  ASSERT_EQ(run(with({"--train-iters", "6", "--metrics-jsonl", part, "--save", ckpt,
                      "--exit-interval", "3"})),
            0);
  // Rewrite the manifest as the single-precision build wrote it: every real setting rounded to
  // float.
  const fs::path manifest = dir_ / "ckpt/iter_0000003/manifest.json";
  nlohmann::json m;
  std::ifstream(manifest) >> m;
  int rounded = 0;
  for (auto& [k, v] : m["config"].items()) {
    if (v.is_number_float() && static_cast<double>(static_cast<float>(v.get<double>())) != v) {
      v = static_cast<double>(static_cast<float>(v.get<double>()));
      ++rounded;
    }
  }
  EXPECT_EQ(m["config"]["rotary_base"].get<double>(), 1234.56005859375);
  EXPECT_EQ(m["config"]["adam_beta2"].get<double>(), static_cast<double>(0.95f));
  EXPECT_GE(rounded, 5);  // rotary_base, adam_beta2, adam_eps, init_method_std, epsilon, ...
  std::ofstream(manifest) << m.dump(1);
  ASSERT_EQ(
      run(with({"--train-iters", "6", "--metrics-jsonl", part, "--save", ckpt, "--load", ckpt})),
      0);
  std::vector<double> a, b;
  for (const auto& r : read_metrics(full))
    if (!r.contains("split")) a.push_back(r["lm_loss"]);
  for (const auto& r : read_metrics(part))
    if (!r.contains("split")) b.push_back(r["lm_loss"]);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace trident::train
