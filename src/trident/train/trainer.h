// `trident train`: the training loop for any TP x PP x DP layout of the processes in `world`.
#pragma once

#include "trident/comm/communicator.h"
#include "trident/train/train_config.h"

namespace trident::train {

// Trains as configured; collective over `world` (one process: a SelfCommunicator). Returns the
// process exit code. Throws on bad input (on every rank: the config is validated everywhere).
int run_training(TrainConfig cfg, comm::Communicator& world);

}  // namespace trident::train
