// Checkpoints and recovery with real processes and real files (`trident` under mpirun):
//  - resume in any layout: saved in TP2 x PP2 x DP2 with ZeRO-1 at iteration 10 of 20, resumed in
//    TP1 x PP4 x DP2, TP4 x PP1 x DP2 with sequence parallelism, DP8 with ZeRO-3 and PP2 x DP2
//    interleaved, and converted offline (`trident convert`) to DP2 ZeRO-2: iterations 11-20 give
//    the uninterrupted single-process run's losses within 1e-5 relative;
//  - resume in another layout with default flags: a TP2 checkpoint (vocabulary padded to 512
//    rows) resumed in TP1, TP4 and PP2 adopts its padding and matches the uninterrupted TP2 run
//    within 1e-5; padding chosen otherwise (--make-vocab-size-divisible-by, or `trident convert`)
//    drops the extra padding rows or adds copies of the last row, loudly;
//  - clean stops: every planned stop (SIGTERM / SIGUSR1 with --exit-signal-handler, the kill
//    switch, --exit-duration-in-mins, --exit-interval, the end of training) saves and exits 0 on
//    every rank under mpirun, without Open MPI's abort banner; with --exit-codes distinct they exit
//    10-13, and `trident supervise` turns those on for its command; a wrong flag exits 2 under
//    mpirun;
//  - a second job on a running job's --save directory is refused with exit code 4;
//  - kill -9 of a random rank at a random moment, ten trials (4 ranks, TP2 x DP2): `trident
//    supervise` relaunches, the final losses and weights equal the uninterrupted run's bitwise,
//    and every checkpoint left verifies; a kill during a save leaves the tracker on a complete one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
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
  // --make-vocab-size-divisible-by so that every layout pads the vocabulary to the same 384 rows
  // (pad = false: the default padding, 128 x TP).
  static std::string train_cmd(int np, int tp, const std::string& flags, int iters = 20,
                               bool pad = true) {
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
           path("cache") + " " +
           (pad ? "--make-vocab-size-divisible-by " + std::to_string(128 / tp) + " " : "") + flags;
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
  // Whether the run's output holds Open MPI's banner for a job that did not end normally ("...
  // returned a non-zero exit code. Per user-direction, the job has been aborted.") or an abort.
  static bool abort_banner(const std::string& log) {
    std::string lower = log;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower.find("abort") != std::string::npos ||
           lower.find("non-zero exit") != std::string::npos ||
           lower.find("non-zero status") != std::string::npos;
  }

  // Starts `cmd` (with the MPI environment, output into <name>.log) in its own process group.
  static pid_t spawn(const std::string& name, const std::string& cmd, const std::string& env = "") {
    const std::string line =
        std::string(kMpiEnv) + env + " exec " + cmd + " > " + path(name + ".log") + " 2>&1";
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    return pid;
  }
  // Waits for a spawned command; its exit code, or -1 after `seconds` (its group is killed).
  static int wait_code(pid_t pid, double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (Clock::now() < deadline) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  // The pids of the `trident train` processes whose command line mentions `marker`.
  static std::vector<int> train_pids(const std::string& marker) {
    std::vector<int> pids;
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream comm(e.path() / "comm");
      std::string c;
      std::getline(comm, c);
      std::ifstream cmdline(e.path() / "cmdline");
      std::string args((std::istreambuf_iterator<char>(cmdline)), {});
      // argv[1] == "train": a rank, not `trident supervise` (whose arguments hold the same).
      const std::size_t first = args.find('\0');
      if (c == "trident" && first != std::string::npos &&
          args.compare(first, 7, std::string("\0train\0", 7)) == 0 &&
          args.find(marker) != std::string::npos) {
        pids.push_back(std::stoi(name));
      }
    }
    return pids;
  }
  // Waits until the metrics file has `n` training records (false after `seconds`).
  static bool wait_for_records(const std::string& metrics, std::size_t n, double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
      if (fs::exists(metrics) && losses(metrics).size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

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
      EXPECT_EQ(code, 0) << log_of("save_3d");  // --exit-interval: a planned stop exits 0
      EXPECT_FALSE(abort_banner(log_of("save_3d"))) << log_of("save_3d");
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

  // A TP2 run with default flags (vocabulary 301 padded to 512 rows, a multiple of 128 x 2):
  // the uninterrupted 20 iterations, and its checkpoint of iteration 10 (once).
  static const std::map<std::int64_t, double>& reference_tp2() {
    static std::map<std::int64_t, double> ref;
    if (ref.empty()) {
      EXPECT_EQ(run("ref_tp2",
                    train_cmd(2, 2, "--metrics-jsonl " + path("ref_tp2.jsonl"), 20, /*pad=*/false)),
                0)
          << log_of("ref_tp2");
      ref = last_loss_per_iteration(path("ref_tp2.jsonl"));
    }
    return ref;
  }
  static std::string saved_tp2() {
    const std::string ckpt = path("ckpt_tp2");
    if (!fs::exists(ckpt)) {
      EXPECT_EQ(run("save_tp2",
                    train_cmd(2, 2, "--save " + ckpt + " --exit-interval 10", 20, /*pad=*/false)),
                0)
          << log_of("save_tp2");
    }
    return ckpt;
  }

  // The word embedding's rows of iteration 10 of a checkpoint whose vocabulary is padded to `rows`.
  static std::vector<float> embedding_rows(const std::string& ckpt, std::int64_t rows) {
    model::ModelConfig c;
    c.num_layers = 4;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.seq_length = 16;
    c.vocab_size = 301;
    c.make_vocab_size_divisible_by = rows;
    const model::ParamTable table = model::build_gpt_param_table(c);
    std::vector<float> flat(static_cast<std::size_t>(table.total_numel));
    ckpt::load_full_params(ckpt, 10, table, flat.data());
    const model::ParamSpec& e = table.find("embedding.word_embeddings.weight");
    EXPECT_EQ(e.global_shape[0], rows);
    return std::vector<float>(flat.begin() + e.offset, flat.begin() + e.offset + e.numel);
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

// Resume in another layout with default flags: the TP2 checkpoint's 512 rows split over TP1, TP4
// and PP2, so each adopts them and continues the uninterrupted TP2 run (within 1e-5 relative).
TEST_F(Recovery, ResumeTp2CheckpointWithDefaultFlags) {
  const auto& ref = reference_tp2();
  ASSERT_EQ(ref.size(), 20u);
  struct Case {
    const char* name;
    int np, tp;
    const char* flags;
    bool adopts;  // the layout's default padding differs from 512
  };
  for (const Case& c : {Case{"tp2_in_tp1", 1, 1, "", true}, Case{"tp2_in_tp4", 4, 4, "", false},
                        Case{"tp2_in_pp2", 2, 1, "--pipeline-model-parallel-size 2", true}}) {
    const std::string m = path(std::string(c.name) + ".jsonl");
    ASSERT_EQ(run(c.name, train_cmd(c.np, c.tp,
                                    std::string(c.flags) + " --load " + saved_tp2() +
                                        " --metrics-jsonl " + m,
                                    20, /*pad=*/false)),
              0)
        << log_of(c.name);
    const std::string log = log_of(c.name);
    EXPECT_EQ(
        log.find("adopting the checkpoint's padded vocabulary of 512 rows") != std::string::npos,
        c.adopts)
        << log;
    EXPECT_EQ(log.find("***"), std::string::npos) << log;
    const auto got = losses(m);
    ASSERT_EQ(got.size(), 10u) << log;
    EXPECT_EQ(got.front().first, 11);
    double worst = 0;
    for (auto [it, loss] : got) {
      const double rel = std::abs(loss - ref.at(it)) / ref.at(it);
      EXPECT_LE(rel, 1e-5) << c.name << " iteration " << it;
      worst = std::max(worst, rel);
    }
    std::printf(
        "%s (default flags): iterations 11-20, max loss rel diff vs the uninterrupted TP2 "
        "run %.2e\n",
        c.name, worst);
  }
}

// Padding chosen otherwise: the run (or `trident convert`) drops the checkpoint's extra padding
// rows, or adds copies of its last row, and says so loudly; the real rows are the checkpoint's,
// and the losses continue the uninterrupted run's.
TEST_F(Recovery, VocabularyPaddingTrimmedOrAddedLoudly) {
  const std::string src = saved_tp2();
  // Training in TP1 with --make-vocab-size-divisible-by 128 (384 rows: 128 padding rows dropped)
  // and 640 (128 rows added): padding rows take no probability in the loss, so both continue the
  // uninterrupted TP2 run (up to summation order).
  const auto& ref = reference_tp2();
  for (const int rows : {384, 640}) {
    const std::string name = "pad_run_" + std::to_string(rows);
    const std::string m = path(name + ".jsonl");
    ASSERT_EQ(run(name, train_cmd(1, 1,
                                  "--make-vocab-size-divisible-by " + std::to_string(rows) +
                                      " --load " + src + " --metrics-jsonl " + m,
                                  20, /*pad=*/false)),
              0)
        << log_of(name);
    EXPECT_NE(log_of(name).find("*** the checkpoint's vocabulary is padded to 512 rows"),
              std::string::npos)
        << log_of(name);
    EXPECT_NE(log_of(name).find(rows < 512 ? "padding rows 384..511 are dropped"
                                           : "rows 512..639 are added as copies of row 511"),
              std::string::npos)
        << log_of(name);
    const auto got = losses(m);
    ASSERT_EQ(got.size(), 10u);
    double worst = 0;
    for (auto [it, loss] : got) {
      const double rel = std::abs(loss - ref.at(it)) / ref.at(it);
      EXPECT_LE(rel, 1e-5) << name << " iteration " << it;
      worst = std::max(worst, rel);
    }
    std::printf("%s: padded to %d rows, iterations 11-20, max loss rel diff %.2e\n", name.c_str(),
                rows, worst);
  }
  // Offline: trimmed to 384 rows and grown to 640, each with the checkpoint's rows.
  const std::vector<float> rows512 = embedding_rows(src, 512);
  const std::int64_t h = 32;
  for (const std::int64_t rows : {384, 640}) {
    const std::string out = path("padded_" + std::to_string(rows));
    const std::string name = "convert_" + std::to_string(rows);
    ASSERT_EQ(run(name, std::string(TRIDENT_CLI) + " convert --load " + src + " --save " + out +
                            " --tensor-model-parallel-size 1 --make-vocab-size-divisible-by " +
                            std::to_string(rows) + " --true-vocab-size 301"),
              0)
        << log_of(name);
    EXPECT_NE(log_of(name).find(rows < 512 ? "padding rows 384..511 are dropped"
                                           : "rows 512..639 are added as copies of row 511"),
              std::string::npos)
        << log_of(name);
    const std::vector<float> got_rows = embedding_rows(out, rows);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t from = std::min<std::int64_t>(r, 511);
      for (std::int64_t j = 0; j < h; ++j) {
        ASSERT_EQ(got_rows[static_cast<std::size_t>(r * h + j)],
                  rows512[static_cast<std::size_t>(from * h + j)])
            << rows << " rows: row " << r << " column " << j;
      }
    }
  }
  // Without the flag the target keeps the 512 rows; a --true-vocab-size that is not the
  // checkpoint's is refused.
  ASSERT_EQ(run("convert_keep", std::string(TRIDENT_CLI) + " convert --load " + src + " --save " +
                                    path("padded_keep") + " --tensor-model-parallel-size 1"),
            0)
      << log_of("convert_keep");
  EXPECT_EQ(embedding_rows(path("padded_keep"), 512), rows512);
  EXPECT_EQ(run("convert_true", std::string(TRIDENT_CLI) + " convert --load " + src + " --save " +
                                    path("padded_true") + " --true-vocab-size 50257"),
            2);
  EXPECT_NE(log_of("convert_true").find("differs from the checkpoint's vocabulary of 301"),
            std::string::npos)
      << log_of("convert_true");
}

// SIGTERM (what Slurm sends before the time limit) with --exit-signal-handler: the run finishes
// its iteration, saves and exits 0 (10 with --exit-codes distinct); under mpirun, SIGUSR1 to
// mpirun (which forwards it) does the same for every rank, and mpirun prints no abort banner.
TEST_F(Recovery, SigtermSavesAndExits) {
  struct Case {
    int np;
    bool distinct;
  };
  for (const Case c : {Case{1, false}, Case{2, false}, Case{2, true}}) {
    const std::string name = "sigterm" + std::to_string(c.np) + (c.distinct ? "d" : "");
    const std::string ckpt = path(name + "_ckpt"), m = path(name + ".jsonl");
    const pid_t pid =
        spawn(name, train_cmd(c.np, 1,
                              "--exit-signal-handler --save " + ckpt + " --metrics-jsonl " + m +
                                  (c.distinct ? " --exit-codes distinct" : ""),
                              100000));
    ASSERT_TRUE(wait_for_records(m, 3, 120)) << log_of(name);
    if (c.np == 1) {
      const std::vector<int> ranks = train_pids(ckpt);
      ASSERT_EQ(ranks.size(), 1u);
      ::kill(ranks[0], SIGTERM);
    } else {
      ::kill(pid, SIGUSR1);  // mpirun is the spawned process (exec)
    }
    EXPECT_EQ(wait_code(pid, 120), c.distinct ? 10 : 0) << log_of(name);
    const auto got = losses(m);
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(ckpt::latest_iteration(ckpt), got.back().first) << log_of(name);
    EXPECT_NE(log_of(name).find("stopped: signal"), std::string::npos) << log_of(name);
    if (!c.distinct) {
      EXPECT_FALSE(abort_banner(log_of(name))) << log_of(name);
    }
  }
}

// The kill switch stops every rank of an mpirun job after the same iteration, saved, with 0 and
// no abort banner; bad input exits 2 through mpirun, before and after MPI starts.
TEST_F(Recovery, KillSwitchAndBadInputUnderMpirun) {
  const std::string ckpt = path("ks_ckpt"), m = path("ks.jsonl"), stop = path("STOP");
  const pid_t pid = spawn(
      "ks",
      train_cmd(2, 1, "--kill-switch-path " + stop + " --save " + ckpt + " --metrics-jsonl " + m,
                100000));
  ASSERT_TRUE(wait_for_records(m, 2, 120)) << log_of("ks");
  std::ofstream(stop) << "";
  EXPECT_EQ(wait_code(pid, 120), 0) << log_of("ks");
  EXPECT_FALSE(abort_banner(log_of("ks"))) << log_of("ks");
  EXPECT_NE(log_of("ks").find("stopped: --kill-switch-path"), std::string::npos) << log_of("ks");
  EXPECT_EQ(ckpt::latest_iteration(ckpt), losses(m).back().first);
  EXPECT_EQ(run("badflag", train_cmd(2, 1, "--num-layerz 3")), 2) << log_of("badflag");
  EXPECT_EQ(run("baddata", train_cmd(2, 1, "--data-path " + path("nothing"))), 2)
      << log_of("baddata");
}

// Every other planned stop under mpirun: --exit-interval, --exit-duration-in-mins and the end of
// training exit 0 on every rank, saved, with no abort banner; --exit-codes distinct (flag or
// TRIDENT_EXIT_CODES) gives --exit-interval 13 and the duration 11, with the banner mpirun prints
// for any non-zero code.
TEST_F(Recovery, PlannedStopsExitZeroUnderMpirun) {
  struct Case {
    std::string name, flags, env;
    int code, iteration;  // the exit code; the iteration saved (-1: any before the end)
  };
  const Case cases[] = {
      {"stop_interval", "--exit-interval 3", "", 0, 3},
      {"stop_duration", "--exit-duration-in-mins 0.0001", "", 0, -1},
      {"stop_end", "", "", 0, 6},
      {"stop_interval_distinct", "--exit-interval 3 --exit-codes distinct", "", 13, 3},
      {"stop_duration_env", "--exit-duration-in-mins 0.0001", "TRIDENT_EXIT_CODES=distinct ", 11,
       -1},
  };
  for (const Case& c : cases) {
    const std::string ckpt = path(c.name + "_ckpt");
    const pid_t pid = spawn(c.name, train_cmd(2, 1, c.flags + " --save " + ckpt, 6), c.env);
    EXPECT_EQ(wait_code(pid, 120), c.code) << log_of(c.name);
    EXPECT_EQ(abort_banner(log_of(c.name)), c.code != 0) << log_of(c.name);
    const std::int64_t saved = ckpt::latest_iteration(ckpt);
    if (c.iteration > 0) {
      EXPECT_EQ(saved, c.iteration) << log_of(c.name);
    } else {
      EXPECT_GE(saved, 1) << log_of(c.name);
      EXPECT_LT(saved, 6) << log_of(c.name);
    }
  }
}

// `trident supervise` runs its command with distinct exit codes, so it tells a planned stop from
// "done" and passes the stop's code on: the kill switch gives 12, not relaunched.
TEST_F(Recovery, SuperviseSeesDistinctStopCodes) {
  const std::string ckpt = path("sup_ks_ckpt"), stop = path("SUP_STOP");
  std::ofstream(stop) << "";
  const int code = run(
      "sup_ks",
      std::string(TRIDENT_CLI) + " supervise --backoff 0.2 -- " +
          train_cmd(2, 1, "--kill-switch-path " + stop + " --save " + ckpt + " --load " + ckpt, 6));
  EXPECT_EQ(code, 12) << log_of("sup_ks");
  EXPECT_NE(log_of("sup_ks").find("stopped: --kill-switch-path"), std::string::npos)
      << log_of("sup_ks");
  EXPECT_EQ(log_of("sup_ks").find("attempt 2"), std::string::npos) << log_of("sup_ks");
  EXPECT_EQ(ckpt::latest_iteration(ckpt), 1);
}

// A second job on the --save directory of a running job is refused (exit code 4), naming it.
TEST_F(Recovery, SecondJobOnTheSameSaveDirIsRefused) {
  const std::string ckpt = path("lock_ckpt"), m = path("lock.jsonl");
  const pid_t first = spawn(
      "lock_first",
      train_cmd(2, 1, "--exit-signal-handler --save " + ckpt + " --metrics-jsonl " + m, 100000));
  ASSERT_TRUE(wait_for_records(m, 2, 120)) << log_of("lock_first");
  EXPECT_EQ(run("lock_second", train_cmd(1, 1, "--save " + ckpt)), 4) << log_of("lock_second");
  EXPECT_NE(log_of("lock_second").find("in use by another running job"), std::string::npos)
      << log_of("lock_second");
  ::kill(first, SIGUSR1);
  EXPECT_EQ(wait_code(first, 120), 0) << log_of("lock_first");
  // The first job is gone: its directory can be taken (and resumed).
  EXPECT_EQ(run("lock_third", train_cmd(1, 1, "--save " + ckpt + " --load " + ckpt,
                                        ckpt::latest_iteration(ckpt) + 1)),
            0)
      << log_of("lock_third");
}

// kill -9 of a random rank at a random moment, ten trials, under `trident supervise`: every run
// ends with the uninterrupted run's losses and final weights, bitwise, and every checkpoint left
// in the directory verifies.
TEST_F(Recovery, KillNineTrialsUnderSupervise) {
  const int iters = 12;
  // When mpirun fails to tear the job down after a kill (seen in about one of 20 trials on a busy
  // machine: the attempt never exits), --comm-timeout ends survivors stuck in a collective and
  // the supervisor's --hang-timeout kills an attempt that makes no checkpoint progress.
  const std::string flags = "--save-interval 2 --save-retain 3 --comm-timeout 10";
  const std::string ref_ckpt = path("k9_ref_ckpt"), ref_m = path("k9_ref.jsonl");
  const auto t0 = Clock::now();
  ASSERT_EQ(
      run("k9_ref",
          train_cmd(4, 2, flags + " --save " + ref_ckpt + " --metrics-jsonl " + ref_m, iters)),
      0)
      << log_of("k9_ref");
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto ref = last_loss_per_iteration(ref_m);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(iters));
  std::mt19937 rng(2024);
  int killed = 0;
  for (int trial = 0; trial < 10; ++trial) {
    const std::string name = "k9_" + std::to_string(trial);
    const std::string ckpt = path(name + "_ckpt"), m = path(name + ".jsonl");
    const pid_t sup = spawn(
        name,
        std::string(TRIDENT_CLI) +
            " supervise --backoff 0.2 --max-retries 3 --hang-timeout 40 -- " +
            train_cmd(4, 2, flags + " --save " + ckpt + " --load " + ckpt + " --metrics-jsonl " + m,
                      iters));
    // A random moment of the run (start-up included), then a random rank.
    const double at = std::uniform_real_distribution<double>(0.2, took)(rng);
    std::this_thread::sleep_for(std::chrono::duration<double>(at));
    const std::vector<int> ranks = train_pids(ckpt);
    if (!ranks.empty()) {
      const int victim =
          ranks[std::uniform_int_distribution<std::size_t>(0, ranks.size() - 1)(rng)];
      if (::kill(victim, SIGKILL) == 0) ++killed;
    }
    const int code = wait_code(sup, 300);
    EXPECT_EQ(code, 0) << log_of(name);
    if (code != 0) continue;
    // Every record (the relaunch repeats the iterations after the last checkpoint) is bitwise the
    // uninterrupted run's.
    const auto got = losses(m);
    for (auto [it, loss] : got) EXPECT_EQ(loss, ref.at(it)) << name << " iteration " << it;
    EXPECT_EQ(last_loss_per_iteration(m).size(), ref.size()) << name;
    for (int r = 0; r < 4; ++r) {
      const std::string shard =
          "/iter_0000012/" + std::string("rank_0000") + char('0' + r) + ".bin";
      EXPECT_TRUE(read(ckpt + shard) == read(ref_ckpt + shard)) << name << shard << " differs";
    }
    // Every checkpoint left is complete and verifies; retention kept the newest three.
    const auto its = ckpt::list_iterations(ckpt);
    EXPECT_EQ(its, (std::vector<std::int64_t>{8, 10, 12})) << name;
    model::ModelConfig c;
    c.num_layers = 4;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.seq_length = 16;
    c.vocab_size = 301;
    c.make_vocab_size_divisible_by = 128;
    const model::ParamTable table = model::build_gpt_param_table(c);
    std::vector<float> flat(static_cast<std::size_t>(table.total_numel));
    for (std::int64_t it : its) {
      EXPECT_NO_THROW(ckpt::load_full_params(ckpt, it, table, flat.data())) << name << " " << it;
    }
    for (const auto& e : fs::directory_iterator(ckpt)) {
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    }
  }
  std::printf("kill -9 trials: %d of 10 killed a rank (the others hit a moment with no rank)\n",
              killed);
  EXPECT_GE(killed, 5);
}

// kill -9 in the middle of a save: the tracker still names the previous, complete checkpoint; the
// relaunch removes the dead save's temporary directory and finishes bitwise like the reference.
TEST_F(Recovery, KillDuringASave) {
  const std::string ckpt = path("ks9_ckpt"), m = path("ks9.jsonl");
  const std::string flags = "--save-interval 2 --save " + ckpt + " --load " + ckpt;
  const pid_t job = spawn("ks9", train_cmd(4, 2, flags + " --metrics-jsonl " + m, 12),
                          "TRIDENT_TEST_CKPT_PAUSE_ITER=6 TRIDENT_TEST_CKPT_PAUSE_S=60 ");
  // Wait for the paused save of iteration 6 (its temporary directory holds shard files).
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  std::string tmp;
  while (Clock::now() < deadline && tmp.empty()) {
    if (fs::exists(ckpt)) {
      for (const auto& e : fs::directory_iterator(ckpt)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("iter_0000006.tmp.", 0) == 0 && fs::exists(e.path() / "rank_00000.bin"))
          tmp = e.path().string();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(tmp.empty()) << log_of("ks9");
  const std::vector<int> ranks = train_pids(ckpt);
  ASSERT_EQ(ranks.size(), 4u);
  ::kill(ranks[2], SIGKILL);
  EXPECT_NE(wait_code(job, 120), 0);
  EXPECT_EQ(ckpt::latest_iteration(ckpt), 4);
  EXPECT_TRUE(fs::exists(ckpt + "/iter_0000004/manifest.json"));
  EXPECT_FALSE(fs::exists(ckpt + "/iter_0000006"));
  EXPECT_TRUE(fs::exists(tmp));  // what the dead save left
  ASSERT_EQ(run("ks9_resume", train_cmd(4, 2, flags + " --metrics-jsonl " + m, 12)), 0)
      << log_of("ks9_resume");
  EXPECT_FALSE(fs::exists(tmp)) << "the dead save's temporary directory is removed";
  EXPECT_NE(log_of("ks9_resume").find("left behind by a save that died"), std::string::npos);
  EXPECT_EQ(ckpt::latest_iteration(ckpt), 12);
}

}  // namespace
}  // namespace trident
