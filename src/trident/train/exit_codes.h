// Exit codes of `trident train`, so a scheduler script or `trident supervise` can tell "done",
// "stopped on request" and "failed" apart (docs/failures-and-recovery.md). A planned stop (a
// signal, --exit-duration-in-mins, the kill switch, --exit-interval) exits 0 by default, as
// Megatron does, so that mpirun prints no abort banner and Slurm marks the job COMPLETED (an
// `afterok` chain continues); --exit-codes distinct (or TRIDENT_EXIT_CODES=distinct in the
// environment, which `trident supervise` sets for its command) gives each its own code, 10-13.
#pragma once

#include <exception>

namespace trident::train {

enum ExitCode : int {
  kExitDone = 0,           // --train-iters reached (final checkpoint saved when --save)
  kExitFailed = 1,         // a crash, a dead rank, a collective timeout: worth a retry
  kExitBadInput = 2,       // a wrong flag, a corrupt data file or checkpoint: never retried
  kExitSaveFailed = 3,     // a checkpoint could not be written (disk full, permissions, I/O)
  kExitLocked = 4,         // --save belongs to another running job
  kExitSignal = 10,        // --exit-signal-handler: SIGTERM / SIGUSR1; saved and stopped
  kExitDuration = 11,      // --exit-duration-in-mins reached; saved and stopped
  kExitKillSwitch = 12,    // --kill-switch-path appeared; saved and stopped
  kExitIntervalStop = 13,  // --exit-interval reached; saved and stopped
};

// The environment variable that sets --exit-codes when the flag is not given.
inline constexpr const char* kExitCodesEnv = "TRIDENT_EXIT_CODES";

// The process exit code of a planned stop whose own code is `stop` (kExitSignal ..
// kExitIntervalStop): `stop` with --exit-codes distinct, else 0 (Megatron's).
inline int planned_stop_exit_code(int stop, bool distinct) { return distinct ? stop : kExitDone; }

// The exit code for an error that ended the run (by its type: core::InvalidArgument and
// core::DataError are bad input, ckpt::SaveError and ckpt::LockError their own codes).
int exit_code_for(const std::exception& e);

// A short name of a code ("done", "bad input", "stopped: SIGTERM"...) for logs.
const char* exit_code_name(int code);

}  // namespace trident::train
