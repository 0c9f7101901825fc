// The `--gpu cpu` calibration cache (plan/calibration.h): what save_calibration writes,
// load_calibration reads back unchanged; a damaged file is refused with an error naming the file,
// the entry, the key and the fix, and exit code 2 (bad input), never a bare JSON error or an
// unchecked conversion. Hostile values found by writing tests/fuzz/fuzz_plan_cache.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "trident/core/error.h"
#include "trident/plan/calibration.h"
#include "trident/train/exit_codes.h"

namespace trident::plan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CalibrationCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trident-calibration-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    path_ = (dir_ / "plan-cpu.json").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static Calibration small(int threads) {
    Calibration c;
    c.threads = threads;
    c.cores = 2;
    c.grid = {8, 64};
    for (int k = 0; k < 8; ++k) {
      c.linear_fwd_s.push_back(1e-6 * (k + 1));
      c.linear_bwd_s.push_back(2e-6 * (k + 1));
    }
    c.attn_seq = {16, 64, 256};
    c.attn_head_dim = {32};
    c.attn_fwd_s = {1e-6, 1e-5, 1e-4};
    c.attn_bwd_s = {2e-6, 2e-5, 2e-4};
    c.flash_fwd_s = {1.5e-6, 1.2e-5, 0.9e-4};
    c.flash_bwd_s = {3e-6, 3e-5, 2.5e-4};
    c.layernorm_fwd = {1e-6, 1e-9};
    c.layernorm_bwd = {2e-6, 2e-9};
    c.bias_gelu_fwd = {1e-6, 3e-9};
    c.bias_gelu_bwd = {1e-6, 4e-9};
    c.add = {0.5e-6, 0.3e-9};
    c.cross_entropy = {0, 5e-9};  // fit() clamps at 0: a zero overhead is valid
    c.adamw = {1e-6, 2e-9};
    c.embedding = c.add;
    c.linear_exact["1024,768,2304"] = {0.006, 0.012};
    c.attention_exact["1,48,256,64"] = {0.002, 0.006};
    c.memory_bw = 9.5e9;
    c.peak_tflops = 0.1;
    CommCosts cc;
    cc.bytes = {4096, 65536};
    cc.all_reduce_s = {2e-5, 1.3e-4};
    cc.reduce_scatter_s = {1.2e-5, 4.3e-5};
    cc.all_gather_s = {5e-6, 2.9e-5};
    cc.p2p_s = {7e-6, 3.4e-5};
    cc.corun_gemm = 1.08;
    cc.sync_wait_s = 3e-5;
    cc.sync_wait_fraction = 0.02;
    c.comm["2,2"] = cc;
    return c;
  }

  void write(const std::string& text) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << text;
  }
  // The file save_calibration writes for small(1), with `edit` applied to its entry "1".
  void write_edited(const std::function<void(json&)>& edit) const {
    fs::remove(path_);
    save_calibration(path_, small(1));
    std::ifstream in(path_);
    json all = json::parse(in);
    edit(all["1"]);
    write(all.dump());
  }
  // The error load_calibration gives for the file as it is (empty: it loaded).
  std::string error(int threads = 1) const {
    Calibration c = small(7);
    try {
      (void)load_calibration(path_, threads, c);
    } catch (const core::DataError& e) {
      EXPECT_EQ(train::exit_code_for(e), train::kExitBadInput);
      EXPECT_EQ(c.threads, 7) << "a refused cache must leave the calibration as it was";
      return e.what();
    }
    return "";
  }
  void refused(const std::function<void(json&)>& edit, const std::string& key,
               const std::string& fragment) const {
    write_edited(edit);
    const std::string e = error();
    EXPECT_NE(e.find(path_), std::string::npos) << e;
    EXPECT_NE(e.find("key \"" + key + "\""), std::string::npos) << key << ": " << e;
    EXPECT_NE(e.find(fragment), std::string::npos) << key << ": " << e;
    EXPECT_NE(e.find("delete the file, or re-run trident plan --gpu cpu --calibrate"),
              std::string::npos)
        << e;
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(CalibrationCache, WhatIsSavedLoadsBackUnchanged) {
  save_calibration(path_, small(1));
  save_calibration(path_, small(2));  // a second thread count, next to the first
  for (const int threads : {1, 2}) {
    Calibration back;
    ASSERT_TRUE(load_calibration(path_, threads, back));
    const Calibration want = small(threads);
    EXPECT_EQ(back.threads, threads);
    EXPECT_EQ(back.grid, want.grid);
    EXPECT_EQ(back.linear_fwd_s, want.linear_fwd_s);
    EXPECT_EQ(back.flash_bwd_s, want.flash_bwd_s);
    EXPECT_EQ(back.cross_entropy.per_element_s, want.cross_entropy.per_element_s);
    EXPECT_EQ(back.linear_exact, want.linear_exact);
    EXPECT_EQ(back.attention_exact, want.attention_exact);
    EXPECT_EQ(back.peak_tflops, want.peak_tflops);
    EXPECT_EQ(back.comm, want.comm);
    ASSERT_NE(back.comm_costs(2, 2), nullptr);
    EXPECT_EQ(back.comm_costs(4, 2), nullptr);
    EXPECT_DOUBLE_EQ(back.linear_forward_s(1024, 768, 2304), 0.006);
  }
  Calibration none;
  EXPECT_FALSE(load_calibration(path_, 3, none));  // no entry: plan asks for --calibrate
  EXPECT_FALSE(load_calibration((dir_ / "absent.json").string(), 1, none));
}

// An entry of another format version (older kernels, fewer costs) is not read: plan asks for
// --calibrate again, and --calibrate measures that thread count anew. The dropout cost, the field
// version 2 added, is read back.
TEST_F(CalibrationCache, AnotherFormatVersionIsNotRead) {
  Calibration c = small(1);
  c.dropout = {1e-6, 1.1e-8};
  save_calibration(path_, c);
  Calibration back;
  ASSERT_TRUE(load_calibration(path_, 1, back));
  EXPECT_EQ(back.dropout.per_element_s, 1.1e-8);
  for (const json& v : {json(1), json("2"), json(nullptr)}) {
    write_edited([&](json& e) { e["version"] = v; });
    Calibration other = small(7);
    EXPECT_FALSE(load_calibration(path_, 1, other)) << v.dump();
    EXPECT_EQ(other.threads, 7);
  }
  write_edited([](json& e) { e.erase("version"); });
  Calibration old;
  EXPECT_FALSE(load_calibration(path_, 1, old));
}

TEST_F(CalibrationCache, FilesThatAreNotACacheAreRefused) {
  write("{\"1\": {\"threads\": 1,");
  EXPECT_NE(error().find("is not JSON"), std::string::npos);
  write("[1, 2]");
  EXPECT_NE(error().find("is not a JSON object"), std::string::npos);
  write("{\"1\": 3}");
  EXPECT_NE(error().find("entry \"1\", key \"1\": must be an object"), std::string::npos)
      << error();
  // Another thread count's entry is not looked at; saving keeps it and replaces a non-object.
  write("{\"2\": 3}");
  EXPECT_EQ(error(1), "");
  write("[1, 2]");
  save_calibration(path_, small(1));
  Calibration back;
  EXPECT_TRUE(load_calibration(path_, 1, back));
}

TEST_F(CalibrationCache, HostileValuesAreRefusedNamingTheKey) {
  refused([](json& j) { j.erase("grid"); }, "grid", "missing");
  refused([](json& j) { j["threads"] = 2; }, "threads", "must be an integer in [1, 1]");
  refused([](json& j) { j["cores"] = 1e300; }, "cores", "must be an integer in [1, 1048576]");
  refused([](json& j) { j["cores"] = 18446744073709551615ull; }, "cores", "must be an integer");
  refused([](json& j) { j["cores"] = "2"; }, "cores", "must be an integer");
  refused([](json& j) { j["grid"] = json::array(); }, "grid", "must be a list of 1 to 64 sizes");
  refused([](json& j) { j["grid"] = {64, 8}; }, "grid", "must be strictly increasing");
  refused([](json& j) { j["grid"] = {8, 8}; }, "grid", "must be strictly increasing");
  refused([](json& j) { j["grid"] = {0, 64}; }, "grid[0]", "must be an integer in [1, 2147483648]");
  refused([](json& j) { j["grid"] = {8, 1e300}; }, "grid[1]", "must be an integer");
  refused(
      [](json& j) {
        j["grid"] = json::array({1, 2, 3});
      },
      "linear_fwd_s", "must be a list of 27 times");
  refused([](json& j) { j["linear_fwd_s"][3] = 0; }, "linear_fwd_s[3]",
          "must be a finite number > 0");
  refused([](json& j) { j["linear_bwd_s"][0] = -1e-6; }, "linear_bwd_s[0]", "> 0");
  refused([](json& j) { j["linear_bwd_s"][7] = nullptr; }, "linear_bwd_s[7]", "got null");
  refused([](json& j) { j["attn_head_dim"] = {32, 64}; }, "attn_fwd_s", "must be a list of 6");
  refused([](json& j) { j["flash_fwd_s"] = "fast"; }, "flash_fwd_s", "must be a list of 3");
  refused([](json& j) { j["layernorm_fwd"] = {1e-6}; }, "layernorm_fwd",
          "must be [overhead seconds, seconds per element]");
  refused([](json& j) { j["adamw"] = {-1, 0}; }, "adamw[0]", "must be a finite number >= 0");
  refused([](json& j) { j["linear_exact"] = {1, 2}; }, "linear_exact", "must be an object");
  refused(
      [](json& j) {
        j["linear_exact"]["a,b,c"] = {1, 2};
      },
      "linear_exact.a,b,c", "is not a shape of 3 comma-separated integers");
  refused(
      [](json& j) {
        j["linear_exact"]["8,8"] = {1, 2};
      },
      "linear_exact.8,8", "is not a shape of 3");
  refused(
      [](json& j) {
        j["linear_exact"]["08,8,8"] = {1, 2};
      },
      "linear_exact.08,8,8", "is not a shape of 3");
  refused(
      [](json& j) {
        j["linear_exact"]["8,8,99999999999"] = {1, 2};
      },
      "linear_exact.8,8,99999999999", "is not a shape of 3");
  refused([](json& j) { j["linear_exact"]["8,8,8"] = {0.1}; }, "linear_exact.8,8,8",
          "must be [forward s, backward s]");
  refused([](json& j) { j["linear_exact"]["8,8,8"] = {0.1, 0}; }, "linear_exact.8,8,8[1]", "> 0");
  refused(
      [](json& j) {
        j["attention_exact"]["2,48,256,64"] = {1, 2};
      },
      "attention_exact.2,48,256,64", "(flash 0 or 1, then sizes >= 1)");
  refused([](json& j) { j["memory_bw"] = 0; }, "memory_bw", "must be a finite number > 0");
  refused([](json& j) { j["peak_tflops"] = -0.1; }, "peak_tflops", "> 0");
  refused([](json& j) { j["comm"] = {1, 2}; }, "comm", "must be an object");
  for (const std::string key : {"3,2", "2,1", "2,4", "a,2", "02,2", "2,2,2", ",2", "2,"}) {
    refused([&](json& j) { j["comm"][key] = j["comm"]["2,2"]; }, "comm." + key,
            "is not \"ranks,group\"");
  }
  refused([](json& j) { j["comm"]["2,2"] = 1; }, "comm.2,2", "must be an object");
  refused(
      [](json& j) {
        j["comm"]["2,2"]["bytes"] = {65536, 4096};
      },
      "comm.2,2.bytes", "strictly increasing");
  refused([](json& j) { j["comm"]["2,2"]["p2p_s"] = {1e-6}; }, "comm.2,2.p2p_s",
          "must be a list of 2 times");
  refused([](json& j) { j["comm"]["2,2"]["all_reduce_s"][1] = 0; }, "comm.2,2.all_reduce_s[1]",
          "> 0");
  refused([](json& j) { j["comm"]["2,2"].erase("all_gather_s"); }, "comm.2,2.all_gather_s",
          "missing");
  refused([](json& j) { j["comm"]["2,2"]["corun_gemm"] = 0.1; }, "comm.2,2.corun_gemm",
          "must lie in [0.5, 16]");
  refused([](json& j) { j["comm"]["2,2"]["sync_wait_s"] = -1e-5; }, "comm.2,2.sync_wait_s",
          "must be a finite number >= 0");
  refused([](json& j) { j["comm"]["2,2"]["sync_wait_fraction"] = "0.1"; },
          "comm.2,2.sync_wait_fraction", "must be a finite number >= 0");
  // Caches from before the ranks' interference was measured: none.
  write_edited([](json& j) {
    for (const char* k : {"corun_gemm", "sync_wait_s", "sync_wait_fraction"})
      j["comm"]["2,2"].erase(k);
  });
  EXPECT_EQ(error(), "");
  // Caches from before --calibrate-comm have no collectives: still valid.
  write_edited([](json& j) { j.erase("comm"); });
  EXPECT_EQ(error(), "");
  // Caches from before exact shapes were timed have neither map: still valid.
  write_edited([](json& j) {
    j.erase("linear_exact");
    j.erase("attention_exact");
  });
  EXPECT_EQ(error(), "");
}

}  // namespace
}  // namespace trident::plan
