// `trident supervise [options] -- <launcher and train command>`: runs the command and relaunches
// it after a failure (a rank killed, a node gone, a collective timeout: any exit code that is not
// one of trident train's "done", "stopped on request" or "never retry" codes), with a bounded
// number of retries and exponential backoff. The train command resumes by itself from the newest
// complete and verified checkpoint when it passes --load (normally the same directory as --save).
// Bad input (exit code 2), a failed save (3) and a locked save directory (4) are never retried.
// SIGTERM, SIGINT and SIGUSR1 sent to the supervisor are forwarded to the command's process group
// (as --forward-signal when given: mpirun forwards SIGUSR1 to every rank but answers SIGTERM by
// killing the job), and the supervisor then does not relaunch. The command's planned stops exit
// with their own codes (10-13) so that the supervisor can tell them from "done": it sets
// TRIDENT_EXIT_CODES=distinct in the command's environment and adds --exit-codes distinct after
// `trident train` when the command names it (mpirun does not pass the environment to other
// hosts). docs/failures-and-recovery.md.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/train/exit_codes.h"

namespace trident::tools {

namespace {

struct SuperviseArgs {
  int max_retries = 3;
  double backoff = 5;
  double max_backoff = 300;
  std::string forward_signal;  // "", TERM, USR1, INT
  double hang_timeout = 0;     // kill an attempt whose newest checkpoint has not moved this long
  std::vector<std::string> command;
};

volatile sig_atomic_t g_child_group = 0;
volatile sig_atomic_t g_signalled = 0;
volatile sig_atomic_t g_forward = 0;  // 0: the signal received

void forward(int sig) {
  g_signalled = sig;
  const int send = g_forward != 0 ? g_forward : sig;
  if (g_child_group > 0) ::kill(-g_child_group, send);
}

// The value of `--flag X` in the command, or "".
std::string flag_value(const std::vector<std::string>& cmd, const std::string& flag) {
  for (std::size_t i = 0; i + 1 < cmd.size(); ++i)
    if (cmd[i] == flag) return cmd[i + 1];
  return {};
}

// The command with `--exit-codes distinct` added after `trident train` (when the command names
// trident's train subcommand and does not choose --exit-codes itself).
std::vector<std::string> with_distinct_exit_codes(std::vector<std::string> cmd) {
  if (std::find(cmd.begin(), cmd.end(), "--exit-codes") != cmd.end()) return cmd;
  for (std::size_t i = 0; i + 1 < cmd.size(); ++i) {
    const std::string& prog = cmd[i];
    const std::size_t slash = prog.rfind('/');
    const std::string base = slash == std::string::npos ? prog : prog.substr(slash + 1);
    if (base == "trident" && cmd[i + 1] == "train") {
      cmd.insert(cmd.begin() + static_cast<std::ptrdiff_t>(i + 2), {"--exit-codes", "distinct"});
      return cmd;
    }
  }
  return cmd;
}

std::int64_t newest_checkpoint(const std::string& save) {
  if (save.empty()) return -1;
  try {
    return ckpt::latest_iteration(save);
  } catch (const std::exception&) {
    return -1;
  }
}

// Runs the command in its own process group; returns its exit code (128 + signal when killed).
// With hang_timeout > 0, an attempt whose newest checkpoint in `save` has not changed for that
// many seconds is killed (SIGKILL to its group): a launcher that failed to tear a job down after
// a rank died, or ranks stuck before their first collective, otherwise wait forever.
int run_once(const std::vector<std::string>& cmd, const std::string& save, double hang_timeout) {
  const pid_t pid = ::fork();
  if (pid < 0) throw core::Error(core::str("supervise: fork failed: ", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    std::vector<char*> argv;
    for (const std::string& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "trident supervise: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from here, so the group exists before a signal is forwarded
  g_child_group = pid;
  int status = 0;
  std::int64_t seen = newest_checkpoint(save);
  auto last_change = std::chrono::steady_clock::now();
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, hang_timeout > 0 ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      throw core::Error(core::str("supervise: waitpid: ", std::strerror(errno)));
    }
    if (hang_timeout <= 0) continue;
    const std::int64_t now = newest_checkpoint(save);
    if (now != seen) {
      seen = now;
      last_change = std::chrono::steady_clock::now();
    } else if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last_change)
                   .count() > hang_timeout) {
      log::error("supervise: no new checkpoint for ", hang_timeout,
                 " s (--hang-timeout): killing the attempt");
      ::kill(-pid, SIGKILL);
      last_change = std::chrono::steady_clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  g_child_group = 0;
  // Leftovers of the group (ranks of a launcher that died first) must not outlive the attempt.
  ::kill(-pid, SIGKILL);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

bool never_retry(int code) {
  using namespace train;
  return code == kExitDone || code == kExitBadInput || code == kExitSaveFailed ||
         code == kExitLocked || code == kExitSignal || code == kExitDuration ||
         code == kExitKillSwitch || code == kExitIntervalStop;
}

int supervise(const SuperviseArgs& a) {
  TRIDENT_CHECK(!a.command.empty(),
                "supervise needs the command after --, e.g. trident supervise -- mpirun -np 8 "
                "trident train ... --save ckpt --load ckpt");
  TRIDENT_CHECK(a.max_retries >= 0, "--max-retries must be >= 0");
  TRIDENT_CHECK(a.backoff >= 0 && a.max_backoff >= a.backoff,
                "--backoff must be >= 0 and <= --max-backoff");
  // The planned stops' own codes (exit_codes.h), for every process the command starts here.
  ::setenv(train::kExitCodesEnv, "distinct", 1);
  const std::vector<std::string> command = with_distinct_exit_codes(a.command);
  const std::string save = flag_value(command, "--save");
  const std::string load = flag_value(command, "--load");
  if (save.empty()) {
    log::warn("supervise: the command has no --save: a relaunch starts from scratch");
  } else if (load != save) {
    log::warn("supervise: the command saves to ", save, " but loads ",
              load.empty() ? std::string("nothing") : load,
              ": a relaunch does not resume from the newest checkpoint (pass --load ", save, ")");
  }
  if (!a.forward_signal.empty()) {
    static const std::pair<const char*, int> names[] = {
        {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"INT", SIGINT}};
    int sig = 0;
    for (const auto& [n, s] : names)
      if (a.forward_signal == n) sig = s;
    TRIDENT_CHECK(sig != 0, "--forward-signal: unknown signal '", a.forward_signal,
                  "' (use TERM, USR1, USR2 or INT)");
    g_forward = sig;
  }
  struct sigaction sa {};
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);

  int failures = 0;  // consecutive failures without a new checkpoint
  double wait = a.backoff;
  std::int64_t progress = newest_checkpoint(save);
  for (int attempt = 1;; ++attempt) {
    log::info("supervise: attempt ", attempt, ": ", command.front(), " ... (newest checkpoint: ",
              progress >= 0 ? std::to_string(progress) : std::string("none"), ")");
    const int code = run_once(command, save, a.hang_timeout);
    const std::int64_t now = newest_checkpoint(save);
    if (g_signalled != 0) {
      log::info("supervise: stopped by signal ", g_signalled, "; the command exited with ", code,
                "; not relaunching");
      return code;
    }
    if (never_retry(code)) {
      log::info("supervise: the command exited with ", code, " (", train::exit_code_name(code), ")",
                code == 0 || code >= 10 ? "" : "; not retried: it needs a person");
      return code;
    }
    if (now > progress) {
      failures = 0;  // it got further: the retry budget starts again
      wait = a.backoff;
    }
    progress = now;
    ++failures;
    if (failures > a.max_retries) {
      log::error("supervise: the command failed (exit code ", code, ") ", failures,
                 " times in a row without a new checkpoint; giving up (--max-retries ",
                 a.max_retries, ")");
      return code;
    }
    log::warn("supervise: the command failed (exit code ", code, "); relaunching in ", wait,
              " s from the newest complete checkpoint (retry ", failures, " of ", a.max_retries,
              ")");
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    if (g_signalled != 0) return code;
    wait = std::min(wait * 2, a.max_backoff);
  }
}

}  // namespace

void register_supervise(CLI::App& app) {
  auto a = std::make_shared<SuperviseArgs>();
  CLI::App* sub = app.add_subcommand(
      "supervise", "Run a training command and relaunch it after failures (resumes via --load)");
  sub->add_option("--max-retries", a->max_retries,
                  "Relaunches after consecutive failures without a new checkpoint")
      ->capture_default_str();
  sub->add_option("--backoff", a->backoff, "Seconds before the first relaunch (then doubled)")
      ->capture_default_str();
  sub->add_option("--max-backoff", a->max_backoff, "Longest wait between relaunches, seconds")
      ->capture_default_str();
  sub->add_option("--forward-signal", a->forward_signal,
                  "Send this signal (TERM, USR1, USR2, INT) to the command when the supervisor "
                  "gets SIGTERM/SIGINT/SIGUSR1 (default: the same signal)");
  sub->add_option("--hang-timeout", a->hang_timeout,
                  "Kill an attempt whose newest checkpoint has not changed for this many seconds "
                  "(0: never; set it well above the time between checkpoints)")
      ->capture_default_str();
  sub->add_option("command", a->command, "The command, after --")->required();
  sub->callback([a] {
    const int code = supervise(*a);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace trident::tools
