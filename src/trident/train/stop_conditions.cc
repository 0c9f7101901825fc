#include "trident/train/stop_conditions.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <filesystem>

#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/save_lock.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/train/exit_codes.h"

namespace trident::train {

namespace {

std::atomic<int> g_signal{0};  // lock-free: written by a signal handler or the waiting thread
std::atomic<bool> g_waiter_stop{false};
struct sigaction g_old_term {
}, g_old_usr1{};

void on_signal(int sig) { g_signal.store(sig, std::memory_order_relaxed); }

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

}  // namespace

int exit_code_for(const std::exception& e) {
  if (dynamic_cast<const ckpt::LockError*>(&e)) return kExitLocked;
  if (dynamic_cast<const ckpt::SaveError*>(&e)) return kExitSaveFailed;
  if (dynamic_cast<const core::InvalidArgument*>(&e) || dynamic_cast<const core::DataError*>(&e))
    return kExitBadInput;
  return kExitFailed;
}

const char* exit_code_name(int code) {
  switch (code) {
    case kExitDone:
      return "done";
    case kExitFailed:
      return "failed";
    case kExitBadInput:
      return "bad input";
    case kExitSaveFailed:
      return "checkpoint save failed";
    case kExitLocked:
      return "save directory locked by another job";
    case kExitSignal:
      return "stopped: signal (--exit-signal-handler)";
    case kExitDuration:
      return "stopped: --exit-duration-in-mins";
    case kExitKillSwitch:
      return "stopped: --kill-switch-path";
    case kExitIntervalStop:
      return "stopped: --exit-interval";
    default:
      return "unknown";
  }
}

StopConditions::StopConditions(const TrainConfig& cfg)
    : signals_(cfg.exit_signal_handler),
      minutes_(cfg.exit_duration_in_mins),
      kill_switch_(cfg.kill_switch_path),
      start_(std::chrono::steady_clock::now()) {
  if (!signals_) return;
  g_signal = 0;
  // The threads that compute never take the signals. oneDNN's JIT GEMM kernels (Debian's oneDNN;
  // fixed upstream by oneDNN PR #4855, issue #4845) point rsp into the heap while they run, so a
  // handler run on a thread inside one writes its signal frame over heap memory: a SIGUSR1 sent
  // during training corrupted the heap in 8 of 40 runs here. The signals are blocked on this
  // thread and every OpenMP worker (threads made later inherit the mask), and a thread of ours
  // takes them with sigwait. The handler stays for threads that a library started before (MPI's
  // progress threads), which run no JIT code.
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, &old_mask_);
#ifdef _OPENMP
#pragma omp parallel
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
#endif
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGUSR1, &sa, &g_old_usr1);
  g_waiter_stop = false;
  waiter_ = std::thread([] {
    const sigset_t wait_set = stop_signals();
    for (;;) {
      int sig = 0;
      if (sigwait(&wait_set, &sig) != 0) continue;
      if (g_waiter_stop.load()) return;
      g_signal.store(sig);
    }
  });
}

StopConditions::~StopConditions() {
  if (!signals_) return;
  g_waiter_stop = true;
  pthread_kill(waiter_.native_handle(), SIGUSR1);  // wakes its sigwait
  waiter_.join();
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

int StopConditions::check(comm::Communicator& world) {
  if (!signals_ && minutes_ <= 0 && kill_switch_.empty()) return 0;
  // Per condition: whether any rank saw it (the signal may reach only some ranks).
  std::int64_t seen[3] = {signals_ && g_signal != 0 ? 1 : 0, 0, 0};
  if (minutes_ > 0) {
    const double mins =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() / 60.0;
    seen[1] = mins >= minutes_ ? 1 : 0;
  }
  if (!kill_switch_.empty() && world.rank() == 0) {
    std::error_code ec;
    seen[2] = std::filesystem::exists(kill_switch_, ec) ? 1 : 0;
  }
  if (world.size() > 1) world.all_reduce(seen, 3, comm::Datatype::kI64, comm::ReduceOp::kMax);
  if (seen[0]) return kExitSignal;
  if (seen[1]) return kExitDuration;
  if (seen[2]) return kExitKillSwitch;
  return 0;
}

}  // namespace trident::train
