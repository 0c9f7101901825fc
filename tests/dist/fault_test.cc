// Failures end the job instead of hanging it: one rank of `mpirun -np 4 trident train` is stalled
// (SIGSTOP) or killed (SIGKILL) mid-training. With --comm-timeout 3, a stalled peer turns into an
// error that names the collective, the group and the ranks, and the whole job exits non-zero
// within seconds; a dead rank ends the job too.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trident/data/indexed_dataset.h"
#include "trident/kernels/memory.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

class Fault : public ::testing::Test {
 protected:
  void SetUp() override {
    if (extra_flags().find("--device cuda") != std::string::npos &&
        kernels::cuda_device_count() == 0) {
      GTEST_SKIP() << "the device variant needs a CUDA device: "
                   << kernels::cuda_no_device_reason();
    }
    dir_ = fs::temp_directory_path() /
           ("trident_fault_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    data::IndexedDatasetBuilder builder((dir_ / "corpus").string(), data::TokenDType::kU16);
    std::mt19937 rng(5);
    for (int d = 0; d < 400; ++d) {
      std::vector<std::int32_t> ids(64);
      for (auto& t : ids) t = static_cast<std::int32_t>(rng() % 300);
      builder.add_sequence(ids);
      builder.end_document();
    }
    builder.finalize();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // TRIDENT_FAULT_TEST_FLAGS: more flags for the run (CTest's device variant of this test runs
  // it with --device cuda on the emulated GPUs, through the emulated NCCL).
  static std::string extra_flags() {
    const char* v = std::getenv("TRIDENT_FAULT_TEST_FLAGS");
    return v ? v : "";
  }

  // Starts training in the background; returns when rank pids are known and training runs.
  void start() {
    const std::string log = (dir_ / "log.txt").string();
    const std::string cmd =
        std::string(
            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
            "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 "
            "OMP_NUM_THREADS=1 ") +
        TRIDENT_MPIEXEC + " -np 4 " + TRIDENT_CLI +
        " train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16"
        " --micro-batch-size 2 --global-batch-size 8 --train-iters 100000 --lr 1e-3"
        " --tokenizer-type NullTokenizer --vocab-size 300 --data-path " +
        (dir_ / "corpus").string() +
        " --log-interval 1 --eval-iters 0 --peak-tflops 1 --comm-timeout 3"
        " --hidden-dropout 0 --attention-dropout 0 " +
        extra_flags() + " --metrics-jsonl " + (dir_ / "m.jsonl").string() + "; echo EXIT=$? >> " +
        log;
    std::system(("(" + cmd + ") > " + log + " 2>&1 &").c_str());
    // Wait for a few iterations, then find the ranks (processes named "trident" whose command
    // line carries our directory).
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      std::ifstream m(dir_ / "m.jsonl");
      int lines = 0;
      std::string line;
      while (std::getline(m, line)) ++lines;
      if (lines >= 3) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream comm(e.path() / "comm");
      std::string c;
      std::getline(comm, c);
      std::ifstream cmdline(e.path() / "cmdline");
      std::string args((std::istreambuf_iterator<char>(cmdline)), {});
      if (c == "trident" && args.find(dir_.string()) != std::string::npos) {
        pids_.push_back(std::stoi(name));
      }
    }
  }

  // Waits for the job to end; returns the log, or "" on timeout (and kills the ranks).
  std::string wait_for_exit(double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
      std::ifstream in(dir_ / "log.txt");
      std::string log((std::istreambuf_iterator<char>(in)), {});
      if (log.find("EXIT=") != std::string::npos) return log;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (int pid : pids_) ::kill(pid, SIGKILL);
    return "";
  }

  fs::path dir_;
  std::vector<int> pids_;
};

TEST_F(Fault, StalledRankEndsTheJobWithTheCollectiveNamed) {
  start();
  ASSERT_EQ(pids_.size(), 4u) << "could not find the 4 ranks";
  const auto t0 = Clock::now();
  ::kill(pids_[1], SIGSTOP);  // a rank stops answering mid-step
  const std::string log = wait_for_exit(60);
  ::kill(pids_[1], SIGKILL);
  ASSERT_FALSE(log.empty()) << "the job hung";
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, 30.0);
  EXPECT_EQ(log.find("EXIT=0"), std::string::npos) << log;
  EXPECT_NE(log.find("timed out"), std::string::npos) << log;
  // The message names the operation, its group and the ranks it waited for.
  EXPECT_NE(log.find("group '"), std::string::npos) << log;
  EXPECT_NE(log.find("global ranks"), std::string::npos) << log;
}

TEST_F(Fault, DeadRankEndsTheJob) {
  start();
  ASSERT_EQ(pids_.size(), 4u);
  ::kill(pids_[2], SIGKILL);
  const std::string log = wait_for_exit(60);
  ASSERT_FALSE(log.empty()) << "the job hung";
  EXPECT_EQ(log.find("EXIT=0"), std::string::npos) << log;
}

}  // namespace
}  // namespace trident
