// Clean stops: Megatron's --exit-signal-handler (SIGTERM, what Slurm sends before its time limit;
// also SIGUSR1, which mpirun forwards to every rank), --exit-duration-in-mins and BLOOM's
// --kill-switch-path. Checked after every iteration on every rank with one small all-reduce (only
// when one of them is enabled), so every rank stops after the same iteration, saves and exits
// with the condition's exit code.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "trident/comm/communicator.h"
#include "trident/train/train_config.h"

namespace trident::train {

class StopConditions {
 public:
  // Installs the signal handlers when cfg.exit_signal_handler (the signals are taken by a thread
  // of its own, never by a computing thread: stop_conditions.cc); the duration is counted from
  // here.
  explicit StopConditions(const TrainConfig& cfg);
  ~StopConditions();  // restores the previous handlers and this thread's signal mask
  StopConditions(const StopConditions&) = delete;
  StopConditions& operator=(const StopConditions&) = delete;

  // Collective over `world` when any condition is enabled: 0 to go on, or the exit code of the
  // condition met (on any rank) — kExitSignal, kExitDuration or kExitKillSwitch.
  int check(comm::Communicator& world);

 private:
  bool signals_ = false;
  double minutes_ = 0;
  std::string kill_switch_;
  std::chrono::steady_clock::time_point start_;
  sigset_t old_mask_{};
  std::thread waiter_;  // takes SIGTERM and SIGUSR1 (sigwait) while signals_
};

}  // namespace trident::train
