// ZeRO-3 memory on real processes: `mpirun -np 4 trident train` at stage 0 and stage 3 (dp 4) on a
// model whose layers dominate (8 layers, hidden 512: psi = 25.4 M parameters per rank, 16 psi =
// 407 MB of model state at stage 0). The model-state bytes the optimizer allocates (its start-up
// report) at stage 3 are a quarter of stage 0's, and the processes' peak resident set sizes show
// it. Everything that is not model state (code, libraries, MPI, activations, data) is the same in
// both runs, so
//   resident(3) = peak RSS(stage 3) - (peak RSS(stage 0) - model state(stage 0))
// is what stage 3 keeps resident for the model: its model state (a quarter of stage 0's, all of it
// written every step) plus at most its staging buffers (the received reduce-scatter piece is
// sized for a shard but filled a layer's piece at a time, so part of it is never touched):
//   model state(3) - tol <= resident(3) <= model state(3) + staging(3) + tol.
// tol = 4% of stage 0's model state (16 MB) covers what differs between two runs besides the
// model state: MPI's temporary collective buffers and allocator rounding (repeated runs differ by
// 0.2 MB in resident(3), once by 12 MB: one layer bucket, an MPI temporary of the non-blocking
// all-reduce). Measured: resident(3) = 117-130 MB within [86, 170] MB. A rank that
// materialises the whole FP32 model at initialization, as it did before (4 psi = 102 MB; the peak
// grows by 58 MB because the other buffers are not yet touched then), measured 187 MB and fails.
// (The reduce-scatter piece is sized for the largest reduced range, at most a shard.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "trident/data/indexed_dataset.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

struct RunMemory {
  std::int64_t params = 0, grads = 0, optimizer = 0, staging = 0, peak_rss = 0;
  std::int64_t model_state() const { return params + grads + optimizer; }
};

class Memory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trident_memory_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    data::IndexedDatasetBuilder builder((dir_ / "corpus").string(), data::TokenDType::kU16);
    std::mt19937 rng(3);
    for (int d = 0; d < 64; ++d) {
      std::vector<std::int32_t> ids(40);
      for (auto& t : ids) t = static_cast<std::int32_t>(rng() % 300);
      builder.add_sequence(ids);
      builder.end_document();
    }
    builder.finalize();
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunMemory run(int stage) {
    const std::string log = (dir_ / ("stage" + std::to_string(stage) + ".txt")).string();
    const std::string cmd =
        std::string(
            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
            "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 "
            "OMP_NUM_THREADS=1 ") +
        TRIDENT_MPIEXEC + " -np 4 " + TRIDENT_CLI +
        " train --num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 16"
        " --micro-batch-size 1 --global-batch-size 4 --train-iters 1 --lr 1e-4"
        " --tokenizer-type NullTokenizer --vocab-size 300 --data-path " +
        (dir_ / "corpus").string() +
        " --split 100,0,0 --eval-iters 0 --peak-tflops 1 --ddp-bucket-size 1000000"
        " --zero-stage " +
        std::to_string(stage) + " > " + log + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "see " << log;
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    RunMemory m;
    std::smatch g;
    const std::regex state(
        "parameters ([0-9]+) B, gradients ([0-9]+) B, optimizer state ([0-9]+) B; staging "
        "([0-9]+) B");
    const std::regex rss("memory: peak RSS per rank \\[([0-9 ]+)\\] B");
    EXPECT_TRUE(std::regex_search(s, g, state)) << s;
    if (!g.empty()) {
      m.params = std::stoll(g[1]);
      m.grads = std::stoll(g[2]);
      m.optimizer = std::stoll(g[3]);
      m.staging = std::stoll(g[4]);
    }
    EXPECT_TRUE(std::regex_search(s, g, rss)) << s;
    if (!g.empty()) {  // the largest rank's
      std::istringstream ranks(g[1].str());
      for (std::int64_t b = 0; ranks >> b;) m.peak_rss = std::max(m.peak_rss, b);
    }
    return m;
  }

  fs::path dir_;
};

TEST_F(Memory, Zero3OnFourRanksKeepsAQuarterOfTheModelState) {
  const RunMemory s0 = run(0), s3 = run(3);
  ASSERT_GT(s0.model_state(), 0);
  // Allocated: a quarter, up to shard padding (under 64 bytes per buffer).
  EXPECT_NEAR(static_cast<double>(s3.model_state()), s0.model_state() / 4.0, 4 * 64.0);
  // Resident.
  const double others = static_cast<double>(s0.peak_rss - s0.model_state());
  const double resident3 = static_cast<double>(s3.peak_rss) - others;
  const double quarter = s0.model_state() / 4.0;
  const double tol = 0.04 * static_cast<double>(s0.model_state());
  std::printf(
      "stage 0: model state %lld B, peak RSS %lld B; stage 3: model state %lld B, staging "
      "%lld B, peak RSS %lld B; stage 3 resident for the model %.0f B = %.3f x stage 0's "
      "model state / 4 (bounds [%.0f, %.0f] B)\n",
      static_cast<long long>(s0.model_state()), static_cast<long long>(s0.peak_rss),
      static_cast<long long>(s3.model_state()), static_cast<long long>(s3.staging),
      static_cast<long long>(s3.peak_rss), resident3, resident3 / quarter,
      0.5 * static_cast<double>(s3.model_state()),
      static_cast<double>(s3.model_state() + s3.staging) + tol);
  // The lower bound only proves the measurement sees the stage-3 state at all: stage 0's peak
  // (from which `others` is taken) includes Open MPI's temporaries for its ~400 MB all-reduce,
  // which vary by tens of MB from run to run (seen: 488-539 MB), so resident3 can read below the
  // allocated state. The upper bound is the claim (no rank holds the whole model).
  EXPECT_GE(resident3, 0.5 * static_cast<double>(s3.model_state()));
  EXPECT_LE(resident3, static_cast<double>(s3.model_state() + s3.staging) + tol);
}

}  // namespace
}  // namespace trident
