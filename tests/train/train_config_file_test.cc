// `trident train --config FILE.toml`: the file's keys are applied when `train` is a subcommand (as
// in tools/trident_main.cc), flags override them, and bad files are ParseErrors naming the key.
// Regression test for what fuzz_train_config (tests/fuzz) found: CLI11 2.1 reads a config file
// only for the main app, so the subcommand's --config was silently ignored.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trident/train/train_config.h"

namespace trident::train {
namespace {

namespace fs = std::filesystem;

// Parses `trident train <args...>` exactly as tools/trident_main.cc sets it up.
TrainConfig parse_train(std::vector<std::string> args) {
  args.insert(args.begin(), {"trident", "train"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  CLI::App app{"trident"};
  app.require_subcommand(1);
  TrainConfig cfg;
  CLI::App* sub = app.add_subcommand("train", "train");
  add_train_options(*sub, cfg);
  app.parse(static_cast<int>(argv.size()), argv.data());
  return cfg;
}

class TrainConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ =
        (fs::temp_directory_path() /
         ("trident_config_file_test_" +
          std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ".toml"))
            .string();
  }
  void TearDown() override { fs::remove(path_); }
  void write(const std::string& text) { std::ofstream(path_) << text; }
  std::string path_;
};

TEST_F(TrainConfigFileTest, SubcommandReadsTheFileAndFlagsOverrideIt) {
  write(
      "# comment\nnum-layers = 5\nhidden-size = 48\nmin-lr = 0.0002\nbf16 = true\n"
      "data-path = [\"0.3\", \"a\", \"0.7\", \"b\"]\nlr-decay-style = \"cosine\"\n");
  const TrainConfig cfg = parse_train({"--config", path_, "--hidden-size", "64"});
  EXPECT_EQ(cfg.model.num_layers, 5);
  EXPECT_EQ(cfg.model.hidden_size, 64);  // the flag wins
  EXPECT_DOUBLE_EQ(cfg.lr.min_lr, 0.0002);
  EXPECT_TRUE(cfg.bf16);
  EXPECT_EQ(cfg.data_path, (std::vector<std::string>{"0.3", "a", "0.7", "b"}));
  EXPECT_EQ(cfg.lr_decay_style, "cosine");
  // The flag may come before or after --config.
  EXPECT_EQ(parse_train({"--hidden-size", "96", "--config", path_}).model.hidden_size, 96);
}

TEST_F(TrainConfigFileTest, BadFilesAreParseErrors) {
  EXPECT_THROW(parse_train({"--config", path_ + ".absent"}), CLI::FileError);
  write("num-layerz = 3\n");
  try {
    parse_train({"--config", path_});
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const CLI::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'num-layerz' is not a `trident train` flag"),
              std::string::npos)
        << e.what();
  }
  write("num-layers = \"many\"\n");
  EXPECT_THROW(parse_train({"--config", path_}), CLI::ConversionError);
  write("[train]\nnum-layers = 3\n");
  EXPECT_THROW(parse_train({"--config", path_}), CLI::ConfigError);
}

// The ~1,000 Megatron / DeepSpeed compatibility flags (compat_flags.cc) are found by the parser,
// the
// --config reader, the digit-underscore transform and record_given_flags, the first of the table
// and the last. An empty argument is an error, not taken for anything (fuzz_train_args: with the
// flags in CLI11 option groups, CLI11 took "" for a group's name).
TEST_F(TrainConfigFileTest, CompatibilityFlagsAreFoundOnTheLineAndInTheFile) {
  write("checkpoint-activations = true\nDDP-impl = \"local\"\n");
  std::vector<std::string> args = {"trident",
                                   "train",
                                   "--config",
                                   path_,
                                   "--batch-size",
                                   "1_0",
                                   "--abort-on-unmet-fused-kernel-constraints",  // the first one
                                   "--zero-reduce-scatter"};                     // the last one
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  CLI::App app{"trident"};
  TrainConfig cfg;
  CLI::App* sub = app.add_subcommand("train", "train");
  add_train_options(*sub, cfg);
  app.parse(static_cast<int>(argv.size()), argv.data());
  record_given_flags(*sub, cfg);
  EXPECT_EQ(cfg.compat.at("--batch-size"), std::vector<std::string>{"10"});
  EXPECT_EQ(cfg.compat.at("--DDP-impl"), std::vector<std::string>{"local"});
  for (const char* f : {"--batch-size", "--DDP-impl", "--checkpoint-activations",
                        "--abort-on-unmet-fused-kernel-constraints", "--zero-reduce-scatter"}) {
    EXPECT_TRUE(cfg.compat.contains(f)) << f;
    EXPECT_TRUE(cfg.given.contains(f)) << f;
  }
  EXPECT_FALSE(cfg.given.contains("--hidden-size"));
  for (const char* extra : {"--no-such-flag", ""}) {
    std::vector<std::string> bad = args;
    bad.insert(bad.end() - 1, extra);
    argv.clear();
    for (std::string& a : bad) argv.push_back(a.data());
    EXPECT_THROW(app.parse(static_cast<int>(argv.size()), argv.data()), CLI::ExtrasError)
        << "'" << extra << "'";
  }
}

}  // namespace
}  // namespace trident::train
