// `trident train`: parses Megatron-style flags (or --config FILE.toml) and runs the trainer over
// the processes mpirun / srun started (one process without a launcher). A fatal error on any
// rank ends the whole job with its message (MPI_Abort), so no rank is left hanging.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "commands.h"
#include "trident/comm/mpi_communicator.h"
#include "trident/comm/runtime.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/train/compat_flags.h"
#include "trident/train/exit_codes.h"
#include "trident/train/launch_env.h"
#include "trident/train/trainer.h"

namespace trident::tools {

void register_train(CLI::App& app) {
  auto cfg = std::make_shared<train::TrainConfig>();
  auto print_table = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("train", "Pre-train a GPT model (Megatron-LM flags)");
  train::add_train_options(*sub, *cfg);
  sub->add_flag("--print-flag-table", *print_table,
                "Print the Megatron / DeepSpeed flag table (docs/flags.md) and exit");
  sub->callback([cfg, print_table, sub] {
    if (*print_table) {
      std::fputs(train::flag_table_markdown().c_str(), stdout);
      return;
    }
    train::record_given_flags(*sub, *cfg);
    // TRIDENT_EXIT_CODES=distinct (what `trident supervise` sets for its command) when
    // --exit-codes is not given: the planned stops' own codes (exit_codes.h).
    if (cfg->given.count("--exit-codes") == 0) {
      if (const char* env = std::getenv(train::kExitCodesEnv); env != nullptr && *env != '\0') {
        cfg->exit_codes = env;
      }
    }
    int argc = 0;
    char** argv = nullptr;
    comm::MpiRuntime mpi(argc, argv);
    int code = 0;
    try {
      const std::string launcher = train::launcher_mismatch(
          mpi.world_size(), [](const char* n) -> const char* { return std::getenv(n); });
      if (!launcher.empty()) throw core::InvalidArgument(launcher);
      auto world = comm::MpiCommunicator::world(mpi);
      code = train::run_training(*cfg, *world);
    } catch (const std::exception& e) {
      if (mpi.world_size() > 1) {
        // The exit code tells a supervisor whether a retry can help (exit_codes.h).
        comm::abort_job(train::exit_code_for(e), core::str("trident train: error: ", e.what()));
      }
      throw;
    }
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace trident::tools
