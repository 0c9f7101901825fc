// Corrupt checkpoint shard headers (rank_NNNNN.json) must be rejected with DataError before any
// buffer is sized or indexed with their numbers. Regression tests for what was found in
// ckpt::load_full_params (the reader `trident generate` uses) while writing fuzz_checkpoint
// (tests/fuzz/), and for what that target found when run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/comm/self_communicator.h"
#include "trident/core/error.h"
#include "trident/model/param_table.h"

namespace trident::ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A one-layer GPT small enough to write checkpoints of in a test.
model::ModelConfig tiny_config() {
  model::ModelConfig mc;
  mc.num_layers = 1;
  mc.hidden_size = 8;
  mc.num_attention_heads = 2;
  mc.seq_length = 4;
  mc.vocab_size = 10;
  mc.make_vocab_size_divisible_by = 4;
  return mc;
}

class CheckpointInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trident_ckpt_input_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    const model::ModelConfig mc = tiny_config();
    table_ = model::build_gpt_param_table(mc);
    const std::int64_t n = table_.total_numel;
    buf_.assign(static_cast<std::size_t>(3 * n), 0.5f);
    CheckpointState st;
    st.iteration = 3;
    st.config = {{"hidden_size", 8}};
    st.layout = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
    st.coords = {{"tp", 0}, {"pp", 0}, {"dp", 0}};
    st.tables.push_back({&table_, 0});
    st.numel = n;
    st.params = {buf_.data(), 0, n};
    st.optimizer_state = {{"exp_avg", {buf_.data() + n, 0, n}},
                          {"exp_avg_sq", {buf_.data() + 2 * n, 0, n}}};
    comm::SelfCommunicator world;
    save_checkpoint(dir_.string(), st, world);
    shard_path_ = dir_ / "iter_0000003" / "rank_00000.json";
    std::ifstream in(shard_path_);
    shard_ = json::parse(in);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `shard` as the rank's header and loads; returns the error message ("" if none).
  std::string load_with(const json& shard) {
    std::ofstream(shard_path_) << shard.dump(1);
    std::vector<float> flat(static_cast<std::size_t>(table_.total_numel));
    try {
      load_full_params(dir_.string(), -1, table_, flat.data());
    } catch (const core::DataError& e) {
      return e.what();
    }
    return "";
  }
  json& first_param(json& shard) { return shard["tables"][0]["params"][0]; }

  fs::path dir_, shard_path_;
  model::ParamTable table_;
  std::vector<float> buf_;
  json shard_;
};

TEST_F(CheckpointInputTest, ValidCheckpointLoads) { EXPECT_EQ(load_with(shard_), ""); }

TEST_F(CheckpointInputTest, ParamsRangeLargerThanTheFileIsRejectedBeforeAllocating) {
  json s = shard_;
  s["numel"] = std::numeric_limits<std::int64_t>::max() / 2;
  for (json& t : s["tensors"]) {
    if (t["tensor"] == "params") t["end"] = std::numeric_limits<std::int64_t>::max() / 2;
  }
  const std::string err = load_with(s);
  EXPECT_NE(err.find("do not fit it or the"), std::string::npos) << err;
  json r = shard_;
  for (json& t : r["tensors"]) {
    if (t["tensor"] == "params") t["begin"] = 10, t["end"] = 5;  // reversed
  }
  EXPECT_NE(load_with(r).find("rank_00000.json: params elements [10, 5)"), std::string::npos);
}

TEST_F(CheckpointInputTest, ParameterOffsetOutsideTheLayoutIsRejected) {
  for (const std::int64_t offset :
       {std::int64_t{-64}, std::int64_t{1} << 40, std::numeric_limits<std::int64_t>::max()}) {
    json s = shard_;
    first_param(s)["offset"] = offset;
    const std::string err = load_with(s);
    EXPECT_NE(err.find("slice outside the rank's layout"), std::string::npos) << offset << err;
  }
}

TEST_F(CheckpointInputTest, BadTensorParallelSliceIsRejected) {
  json s = shard_;
  first_param(s)["tp_split_dim"] = 1;  // of a parameter whose local shape is the global one
  first_param(s)["shape"] = json::array({first_param(s)["global_shape"][0], 0});
  EXPECT_NE(load_with(s).find("local dimension out of range"), std::string::npos);
  json t = shard_;
  t["tp_rank"] = 5;  // a replicated tensor is fine on any tp rank; a split one is not
  first_param(t)["tp_split_dim"] = 0;
  EXPECT_NE(load_with(t).find("not this tp_rank's slice"), std::string::npos) << load_with(t);
  json u = shard_;
  first_param(u)["tp_split_dim"] = 7;
  EXPECT_NE(load_with(u).find("tp_split_dim is not -1 or a dimension of the shape"),
            std::string::npos);
  json v = shard_;
  first_param(v)["numel"] = 3;
  EXPECT_NE(load_with(v).find("numel is not the product of the shape"), std::string::npos);
}

// Found by fuzz_checkpoint: a manifest without "iteration" escaped as a bare nlohmann exception
// (no file named); a float where an integer belongs (1e300) was converted with undefined
// behaviour.
TEST_F(CheckpointInputTest, MalformedManifestAndFloatsAreNamed) {
  const fs::path manifest = dir_ / "iter_0000003" / "manifest.json";
  std::ifstream in(manifest);
  const json m = json::parse(in);
  auto load_manifest = [&](const json& j) {
    std::ofstream(manifest) << j.dump(1);
    std::vector<float> flat(static_cast<std::size_t>(table_.total_numel));
    try {
      load_full_params(dir_.string(), -1, table_, flat.data());
    } catch (const core::DataError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json no_iteration = m;
  no_iteration.erase("iteration");
  EXPECT_NE(load_manifest(no_iteration).find("malformed manifest (no \"iteration\")"),
            std::string::npos);
  json float_iteration = m;
  float_iteration["iteration"] = 1e300;
  EXPECT_NE(load_manifest(float_iteration).find("\"iteration\" is 1e+300, not an integer"),
            std::string::npos)
      << load_manifest(float_iteration);
  // A key given twice (written by hand: a JSON library cannot produce one) kept the last value.
  {
    std::string text = m.dump();
    text.insert(1, "\"iteration\": 99, ");
    std::ofstream(manifest) << text;
    std::vector<float> flat(static_cast<std::size_t>(table_.total_numel));
    try {
      load_full_params(dir_.string(), -1, table_, flat.data());
      ADD_FAILURE() << "a manifest naming \"iteration\" twice was accepted";
    } catch (const core::DataError& e) {
      EXPECT_NE(std::string(e.what()).find("\"iteration\" appears twice"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("manifest.json"), std::string::npos) << e.what();
    }
  }
  json not_object = json::array({1, 2});
  EXPECT_NE(load_manifest(not_object).find("not a trident checkpoint"), std::string::npos);
  std::ofstream(manifest) << m.dump(1);
  json s = shard_;
  first_param(s)["offset"] = 1e300;
  EXPECT_NE(load_with(s).find("unexpected number 1e+300 where integers are expected"),
            std::string::npos)
      << load_with(s);
}

// The optimizer's state arrays travel by the names the update rule gives them: a state with
// another number of arrays saves and loads; a checkpoint of another optimizer is refused by name
// in both directions (a tensor the run does not keep, a tensor the run needs and the file lacks).
TEST(CheckpointOptimizerState, ArraysAreSavedAndLoadedByName) {
  const fs::path dir = fs::temp_directory_path() / "trident_ckpt_named_state_test";
  fs::remove_all(dir);
  const model::ModelConfig mc = tiny_config();
  const model::ParamTable table = model::build_gpt_param_table(mc);
  const std::int64_t n = table.total_numel;
  const auto state = [&](std::vector<std::vector<float>>& bufs,
                         const std::vector<std::string>& names) {
    CheckpointState st;
    st.iteration = 1;
    st.config = model_config_to_json(mc);
    st.layout = {{"tp", 1}, {"pp", 1}, {"dp", 1}};
    st.coords = {{"tp", 0}, {"pp", 0}, {"dp", 0}};
    st.tables.push_back({&table, 0});
    st.numel = n;
    bufs.assign(names.size() + 1, std::vector<float>(static_cast<std::size_t>(n), 0.0f));
    st.params = {bufs[0].data(), 0, n};
    for (std::size_t i = 0; i < names.size(); ++i) {
      st.optimizer_state.push_back({names[i], {bufs[i + 1].data(), 0, n}});
    }
    return st;
  };
  comm::SelfCommunicator world;
  std::vector<std::vector<float>> saved;
  CheckpointState out = state(saved, {"momentum"});  // a one-array rule
  for (std::size_t i = 0; i < saved.size(); ++i) {
    for (std::int64_t e = 0; e < n; ++e) saved[i][static_cast<std::size_t>(e)] = i * 1000.0f + e;
  }
  save_checkpoint(dir.string(), out, world);
  std::vector<std::vector<float>> loaded;
  CheckpointState in = state(loaded, {"momentum"});
  load_checkpoint(dir.string(), -1, in, world);
  EXPECT_EQ(loaded, saved);
  const auto error = [&](const std::vector<std::string>& names) {
    std::vector<std::vector<float>> b;
    CheckpointState st = state(b, names);
    try {
      load_checkpoint(dir.string(), 1, st, world);
    } catch (const core::DataError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({"exp_avg", "exp_avg_sq"}).find("unknown tensor 'momentum'"), std::string::npos);
  EXPECT_NE(error({"momentum", "exp_avg_sq"}).find("no tensor 'exp_avg_sq'"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trident::ckpt
