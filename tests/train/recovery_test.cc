// Checkpoints that survive failures, in one process with real files: a save that fails part-way
// (disk full) removes its temporary directory and keeps the earlier checkpoints and the tracker; a
// corrupt newest checkpoint falls back to the previous one, loudly, and the resumed run still
// gives the uninterrupted run's losses bitwise; --save-retain keeps the newest N; a second job on
// a locked save directory is refused while a stale lock is taken over; a NaN gradient skips the
// step on every rank, counted; the kill-switch, duration and interval stops save and exit 0 (their
// own codes with --exit-codes distinct).
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "train_fixture.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/save_lock.h"
#include "trident/comm/self_communicator.h"
#include "trident/core/error.h"
#include "trident/train/exit_codes.h"
#include "trident/train/stop_conditions.h"

namespace trident::train {
namespace {

// Sets an environment variable for the scope (fault injection hooks).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

std::vector<double> train_losses(const std::vector<nlohmann::json>& records) {
  std::vector<double> out;
  for (const auto& r : records)
    if (!r.contains("split")) out.push_back(r["lm_loss"]);
  return out;
}

std::vector<std::string> temp_dirs(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp") != std::string::npos)
      out.push_back(e.path().string());
  }
  return out;
}

TEST_F(TrainTest, FailedSaveRemovesItsTempDirAndKeepsTheRest) {
  const fs::path ckpt = dir_ / "ckpt";
  const std::string ckpt_s = ckpt.string();
  // The save of iteration 4 runs out of space 1000 bytes into the shard.
  ScopedEnv fail_at("TRIDENT_TEST_CKPT_FAIL_ITER", "4");
  ScopedEnv limit("TRIDENT_TEST_CKPT_WRITE_LIMIT", "1000");
  try {
    run(parse({"--train-iters", "6", "--save", ckpt_s, "--save-interval", "2"}));
    FAIL() << "no error";
  } catch (const ckpt::SaveError& e) {
    const std::string what = e.what();
    EXPECT_EQ(exit_code_for(e), kExitSaveFailed);
    EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
    EXPECT_NE(what.find("iter_0000004.tmp."), std::string::npos) << what;  // names the path
    EXPECT_NE(what.find("removed"), std::string::npos) << what;
  }
  EXPECT_TRUE(temp_dirs(ckpt).empty()) << temp_dirs(ckpt).front();
  EXPECT_FALSE(fs::exists(ckpt / "iter_0000004"));
  EXPECT_EQ(ckpt::latest_iteration(ckpt_s), 2);
  // The previous checkpoint is intact: it loads (checksums verified) and training goes on.
  ::unsetenv("TRIDENT_TEST_CKPT_FAIL_ITER");
  EXPECT_EQ(run(parse({"--train-iters", "4", "--load", ckpt_s, "--save", ckpt_s})), 0);
  EXPECT_EQ(ckpt::latest_iteration(ckpt_s), 4);
}

TEST_F(TrainTest, NotEnoughSpaceIsRefusedBeforeWriting) {
  // The size of one checkpoint of this model, measured.
  ASSERT_EQ(run(parse({"--train-iters", "3", "--exit-interval", "1", "--save",
                       (dir_ / "probe").string()})),
            kExitDone);
  const auto bytes = fs::file_size(dir_ / "probe/iter_0000001/rank_00000.bin");
  // A real tmpfs that holds one checkpoint (and the 64 KiB margin) but not two, when this process
  // may mount one (root, or a user namespace).
  const fs::path mnt = dir_ / "small";
  fs::create_directories(mnt);
  const std::string size = std::to_string((bytes * 3 / 2 + 80 * 1024) / 1024) + "k";
  if (std::system(
          ("mount -t tmpfs -o size=" + size + " tmpfs " + mnt.string() + " 2>/dev/null").c_str()) !=
      0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (the fault-injection test covers a failed save)";
  }
  struct Unmount {
    std::string m;
    ~Unmount() { std::system(("umount " + m).c_str()); }
  } unmount{mnt.string()};
  const std::string ckpt = (mnt / "ckpt").string();
  try {
    run(parse({"--train-iters", "4", "--save", ckpt, "--save-interval", "2"}));
    FAIL() << "no error";
  } catch (const ckpt::SaveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("not enough space in " + ckpt), std::string::npos) << what;
    EXPECT_NE(what.find("bytes"), std::string::npos) << what;
  }
  EXPECT_TRUE(temp_dirs(ckpt).empty());
  EXPECT_EQ(ckpt::latest_iteration(ckpt), 2);
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "iter_0000002/manifest.json"));
}

TEST_F(TrainTest, CorruptNewestFallsBackToThePrevious) {
  const std::string full = (dir_ / "full.jsonl").string();
  ASSERT_EQ(run(parse({"--train-iters", "6", "--metrics-jsonl", full})), 0);
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(parse({"--train-iters", "6", "--save", ckpt, "--save-interval", "2",
                       "--exit-interval", "4"})),
            kExitDone);
  // Flip one byte of the newest checkpoint's weights.
  {
    std::fstream f(dir_ / "ckpt/iter_0000004/rank_00000.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    const char c = static_cast<char>(f.get());
    f.seekp(200);
    f.put(static_cast<char>(c ^ 0x10));
  }
  const std::string part = (dir_ / "part.jsonl").string();
  testing::internal::CaptureStderr();
  ASSERT_EQ(
      run(parse({"--train-iters", "6", "--load", ckpt, "--save", ckpt, "--metrics-jsonl", part})),
      0);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("IS INCOMPLETE OR CORRUPT"), std::string::npos) << log;
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
  EXPECT_NE(log.find("NOT the newest checkpoint"), std::string::npos) << log;
  // Resumed from iteration 2: iterations 3..6 equal the uninterrupted run's, bitwise.
  const auto a = train_losses(read_metrics(full)), b = train_losses(read_metrics(part));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(b[i], a[i + 2]) << "iteration " << i + 3;
}

TEST_F(TrainTest, SaveRetainKeepsTheNewest) {
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(parse({"--train-iters", "5", "--save", ckpt, "--save-interval", "1",
                       "--save-retain", "2"})),
            0);
  EXPECT_EQ(ckpt::list_iterations(ckpt), (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(ckpt::latest_iteration(ckpt), 5);
  EXPECT_THROW(parse({"--save-retain", "-1"}).finalize(1), core::InvalidArgument);
}

// Found by fuzz_train_args: a flag value that is not UTF-8 made the config's JSON dump (the
// checkpoint manifest) throw a bare nlohmann error after the run had started.
TEST_F(TrainTest, NonUtf8FlagValueIsRefusedUpFrontNamingTheFlag) {
  try {
    parse({"--save", (dir_ / "ckpt\x8b").string()}).finalize(1);
    FAIL() << "no error";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--save: the value is not valid UTF-8"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(parse({"--save", (dir_ / "ckpt-\xc3\xa9").string()}).finalize(1));
}

TEST_F(TrainTest, SecondJobOnALockedSaveDirIsRefused) {
  const std::string ckpt = (dir_ / "ckpt").string();
  {
    ckpt::SaveLock held(ckpt);  // a live job holds the directory
    try {
      run(parse({"--train-iters", "2", "--save", ckpt}));
      FAIL() << "no error";
    } catch (const ckpt::LockError& e) {
      const std::string what = e.what();
      EXPECT_EQ(exit_code_for(e), kExitLocked);
      EXPECT_NE(what.find("in use by another running job"), std::string::npos) << what;
      EXPECT_NE(what.find("pid " + std::to_string(::getpid())), std::string::npos) << what;
    }
    EXPECT_FALSE(fs::exists(fs::path(ckpt) / "iter_0000002"));
  }
  // The record of a job that died (no process holds the lock) is stale: taken over, loudly.
  std::ofstream(fs::path(ckpt) / "trident.lock")
      << R"({"host":"node7","pid":999999,"job_id":"4242","started":"2026-01-01T00:00:00Z"})";
  testing::internal::CaptureStderr();
  EXPECT_EQ(run(parse({"--train-iters", "2", "--save", ckpt})), 0);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("names a job that is gone"), std::string::npos) << log;
  EXPECT_NE(log.find("4242"), std::string::npos) << log;
  EXPECT_EQ(ckpt::latest_iteration(ckpt), 2);
}

TEST_F(TrainTest, NonFiniteGradientSkipsTheStep) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string m = (dir_ / "m.jsonl").string();
  ScopedEnv nan_at("TRIDENT_TEST_NAN_GRAD_ITER", "3");
  testing::internal::CaptureStderr();
  ASSERT_EQ(run(parse({"--train-iters", "5", "--save", ckpt, "--save-interval", "1",
                       "--metrics-jsonl", m})),
            0);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("iteration 3: loss"), std::string::npos) << log;
  EXPECT_NE(log.find("is not finite; update skipped"), std::string::npos) << log;
  const auto records = read_metrics(m);
  std::vector<nlohmann::json> train;
  for (const auto& r : records)
    if (!r.contains("split")) train.push_back(r);
  ASSERT_EQ(train.size(), 5u);
  EXPECT_EQ(train[1]["skipped_iterations"], 0);
  EXPECT_EQ(train[2]["skipped_iterations"], 1);
  EXPECT_EQ(train[2]["nan_iterations"], 1);
  EXPECT_EQ(train[4]["skipped_iterations"], 1);
  EXPECT_TRUE(std::isfinite(train[4]["lm_loss"].get<double>()));
  // The skipped step changed nothing: weights and both Adam moments after iteration 3 are those
  // after iteration 2, bitwise; iteration 4 does update.
  EXPECT_EQ(read_bytes(dir_ / "ckpt/iter_0000002/rank_00000.bin"),
            read_bytes(dir_ / "ckpt/iter_0000003/rank_00000.bin"));
  EXPECT_NE(read_bytes(dir_ / "ckpt/iter_0000003/rank_00000.bin"),
            read_bytes(dir_ / "ckpt/iter_0000004/rank_00000.bin"));
}

// Planned stops save and exit 0 (Megatron's); with --exit-codes distinct each has its own code.
// oneDNN's JIT GEMM kernels (Debian's oneDNN; upstream issue #4845) run with rsp pointing into
// the heap, so a signal handled on a thread inside one corrupts the heap (a SIGUSR1 during training
// did in 8 of 40 runs). With --exit-signal-handler the computing threads (this one, the OpenMP
// workers) block SIGTERM and SIGUSR1, a thread of StopConditions' own takes them, and a signal
// still stops training; the mask is restored afterwards.
bool stop_signals_blocked_here() {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, SIGTERM) == 1 && sigismember(&now, SIGUSR1) == 1;
}

TEST(StopSignals, ComputingThreadsNeverTakeThemAndTheyStillStop) {
  ASSERT_FALSE(stop_signals_blocked_here());
  TrainConfig cfg;
  cfg.exit_signal_handler = true;
  comm::SelfCommunicator world;
  for (const int sig : {SIGUSR1, SIGTERM}) {
    StopConditions stops(cfg);
    EXPECT_TRUE(stop_signals_blocked_here());
    int workers_blocked = 0, workers = 0;
#pragma omp parallel num_threads(2) reduction(+ : workers_blocked, workers)
    {
      workers_blocked += stop_signals_blocked_here() ? 1 : 0;
      workers += 1;
    }
    EXPECT_EQ(workers_blocked, workers);
    EXPECT_EQ(stops.check(world), 0);
    ASSERT_EQ(::kill(::getpid(), sig), 0);
    int code = 0;
    for (int i = 0; i < 2000 && code == 0; ++i) {  // taken by the waiting thread, soon
      code = stops.check(world);
      if (code == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(code, kExitSignal) << "signal " << sig << " was not seen";
  }
  EXPECT_FALSE(stop_signals_blocked_here()) << "the thread's mask was not restored";
}

TEST_F(TrainTest, KillSwitchAndDurationSaveAndStop) {
  for (const bool distinct : {false, true}) {
    SCOPED_TRACE(distinct ? "--exit-codes distinct" : "default exit codes");
    const std::string ckpt = (dir_ / (distinct ? "ckpt_distinct" : "ckpt")).string();
    std::vector<std::string> codes;
    if (distinct) codes = {"--exit-codes", "distinct"};
    auto with = [&](std::vector<std::string> flags) {
      flags.insert(flags.end(), codes.begin(), codes.end());
      return parse(flags);
    };
    const fs::path kill = dir_ / "STOP";
    std::ofstream(kill) << "";
    testing::internal::CaptureStdout();  // info lines
    EXPECT_EQ(
        run(with({"--train-iters", "6", "--save", ckpt, "--kill-switch-path", kill.string()})),
        distinct ? kExitKillSwitch : kExitDone);
    const std::string log = testing::internal::GetCapturedStdout();
    EXPECT_NE(log.find(distinct ? "with code 12 (stopped: --kill-switch-path)"
                                : "with code 0 (stopped: --kill-switch-path; --exit-codes "
                                  "distinct exits with 12 instead)"),
              std::string::npos)
        << log;
    EXPECT_EQ(ckpt::latest_iteration(ckpt), 1);  // stopped after the first iteration, saved
    fs::remove(kill);
    // A budget of 0.0001 minutes (6 ms, counted from start-up) is spent within a few iterations;
    // how many depends on the machine's speed, so the run is long enough never to finish first.
    EXPECT_EQ(run(with({"--train-iters", "200", "--load", ckpt, "--save", ckpt,
                        "--exit-duration-in-mins", "0.0001"})),
              distinct ? kExitDuration : kExitDone);
    const std::int64_t stopped_at = ckpt::latest_iteration(ckpt);
    EXPECT_GE(stopped_at, 2);  // resumed from 1, trained at least one iteration, saved
    EXPECT_LT(stopped_at, 150);
    EXPECT_EQ(run(with({"--train-iters", "200", "--load", ckpt, "--save", ckpt, "--exit-interval",
                        "150"})),
              distinct ? kExitIntervalStop : kExitDone);
    EXPECT_EQ(ckpt::latest_iteration(ckpt), 150);
    EXPECT_EQ(run(with({"--train-iters", "200", "--load", ckpt, "--save", ckpt})), kExitDone);
    EXPECT_EQ(ckpt::latest_iteration(ckpt), 200);
  }
  // An unknown value is refused, naming the values.
  try {
    run(parse({"--train-iters", "2", "--exit-codes", "zero"}));
    FAIL() << "no error";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("use megatron"), std::string::npos) << e.what();
  }
}

// --async-save writes the same checkpoints as the synchronous path, byte for byte, finishes the
// last one before the run ends, resumes bitwise, and a background write that fails is reported
// with the same guarantees (exit code 3, temporary directory removed, earlier ones intact).
TEST_F(TrainTest, AsyncSaveWritesTheSameCheckpoints) {
  const std::string sync = (dir_ / "sync").string(), async = (dir_ / "async").string();
  const std::string full = (dir_ / "full.jsonl").string(), part = (dir_ / "part.jsonl").string();
  ASSERT_EQ(run(parse({"--train-iters", "6", "--save", sync, "--save-interval", "2",
                       "--metrics-jsonl", full})),
            0);
  ASSERT_EQ(run(parse({"--train-iters", "6", "--save", async, "--save-interval", "2",
                       "--async-save", "", "--exit-interval", "4", "--metrics-jsonl", part})),
            kExitDone);
  EXPECT_EQ(ckpt::latest_iteration(async), 4);  // the stop waited for the background save
  ASSERT_EQ(run(parse({"--train-iters", "6", "--save", async, "--load", async, "--save-interval",
                       "2", "--async-save", "", "--metrics-jsonl", part})),
            0);
  EXPECT_EQ(ckpt::latest_iteration(async), 6);
  for (const char* it : {"iter_0000002", "iter_0000004", "iter_0000006"}) {
    EXPECT_EQ(read_bytes(fs::path(sync) / it / "rank_00000.bin"),
              read_bytes(fs::path(async) / it / "rank_00000.bin"))
        << it;
  }
  const auto a = train_losses(read_metrics(full)), b = train_losses(read_metrics(part));
  ASSERT_EQ(b.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(a[i], b[i]) << "iteration " << i + 1;

  const std::string failing = (dir_ / "failing").string();
  ScopedEnv fail_at("TRIDENT_TEST_CKPT_FAIL_ITER", "4");
  ScopedEnv limit("TRIDENT_TEST_CKPT_WRITE_LIMIT", "1000");
  try {
    run(parse(
        {"--train-iters", "6", "--save", failing, "--save-interval", "2", "--async-save", ""}));
    FAIL() << "no error";
  } catch (const ckpt::SaveError& e) {
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(temp_dirs(failing).empty());
  EXPECT_EQ(ckpt::latest_iteration(failing), 2);
}

}  // namespace
}  // namespace trident::train
