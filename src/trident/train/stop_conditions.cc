#include "trident/train/stop_conditions.h"

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

volatile sig_atomic_t g_signal = 0;
struct sigaction g_old_term {
}, g_old_usr1{};

void on_signal(int sig) { g_signal = sig; }

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
  if (signals_) {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &g_old_term);
    sigaction(SIGUSR1, &sa, &g_old_usr1);
  }
}

StopConditions::~StopConditions() {
  if (signals_) {
    sigaction(SIGTERM, &g_old_term, nullptr);
    sigaction(SIGUSR1, &g_old_usr1, nullptr);
  }
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
