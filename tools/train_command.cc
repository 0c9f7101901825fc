// `trident train`: parses Megatron-style flags (or --config FILE.toml) and runs the trainer over
// the processes mpirun / srun started (one process without a launcher). A fatal error on any
// rank ends the whole job with its message (MPI_Abort), so no rank is left hanging.
#include <exception>
#include <memory>

#include "commands.h"
#include "trident/comm/mpi_communicator.h"
#include "trident/comm/runtime.h"
#include "trident/core/log.h"
#include "trident/train/exit_codes.h"
#include "trident/train/trainer.h"

namespace trident::tools {

void register_train(CLI::App& app) {
  auto cfg = std::make_shared<train::TrainConfig>();
  CLI::App* sub = app.add_subcommand("train", "Pre-train a GPT model (Megatron-LM flags)");
  train::add_train_options(*sub, *cfg);
  sub->callback([cfg] {
    int argc = 0;
    char** argv = nullptr;
    comm::MpiRuntime mpi(argc, argv);
    int code = 0;
    try {
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
