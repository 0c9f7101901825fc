// The fixture of the in-process training tests: a small random corpus and the tiny-run flags.
#pragma once

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "trident/comm/self_communicator.h"
#include "trident/data/indexed_dataset.h"
#include "trident/train/trainer.h"

namespace trident::train {

namespace fs = std::filesystem;

class TrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("trident_train_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A small corpus of random token ids (NullTokenizer, vocabulary 300).
    data::IndexedDatasetBuilder builder((dir_ / "corpus").string(), data::TokenDType::kU16);
    std::mt19937 rng(7);
    for (int doc = 0; doc < 60; ++doc) {
      std::vector<std::int32_t> ids(40 + doc % 17);
      for (auto& t : ids) t = static_cast<std::int32_t>(rng() % 300);
      builder.add_sequence(ids);
      builder.end_document();
    }
    builder.finalize();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Parses the default tiny-run flags, with `flags` replacing or adding to them, exactly as
  // `trident train` does. Flags are "--name value" pairs ("--flag", "" for a bare flag).
  TrainConfig parse(std::vector<std::string> flags) {
    std::vector<std::pair<std::string, std::string>> args = {
        {"--num-layers", "2"},
        {"--hidden-size", "32"},
        {"--num-attention-heads", "4"},
        {"--seq-length", "16"},
        {"--micro-batch-size", "2"},
        {"--global-batch-size", "4"},
        {"--lr", "1e-3"},
        {"--lr-warmup-iters", "2"},
        {"--lr-decay-style", "cosine"},
        {"--tokenizer-type", "NullTokenizer"},
        {"--vocab-size", "300"},
        {"--data-path", (dir_ / "corpus").string()},
        {"--split", "90,10,0"},
        {"--log-interval", "1"},
        {"--eval-interval", "3"},
        {"--eval-iters", "1"},
        {"--peak-tflops", "1"},
        {"--seed", "5"},
        {"--hidden-dropout", "0"},
        {"--attention-dropout", "0"}};
    for (std::size_t i = 0; i + 1 < flags.size(); i += 2) {
      bool replaced = false;
      for (auto& [k, v] : args) {
        if (k == flags[i]) {
          v = flags[i + 1];
          replaced = true;
        }
      }
      if (!replaced) args.emplace_back(flags[i], flags[i + 1]);
    }
    std::vector<std::string> argv;
    for (auto& [k, v] : args) {
      argv.push_back(k);
      if (!v.empty()) argv.push_back(v);  // "" marks a flag without a value
    }
    std::reverse(argv.begin(), argv.end());  // CLI11 takes the arguments reversed
    TrainConfig cfg;
    CLI::App app;
    add_train_options(app, cfg);
    app.parse(argv);
    return cfg;
  }

  std::vector<nlohmann::json> read_metrics(const fs::path& p) {
    std::vector<nlohmann::json> out;
    std::ifstream in(p);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  int run(const TrainConfig& cfg) {
    comm::SelfCommunicator world;
    return run_training(cfg, world);
  }

  fs::path dir_;
};

}  // namespace trident::train
