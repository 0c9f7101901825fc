// `trident train`: the training loop (single process for now; the data-parallel, tensor- and
// pipeline-parallel layers hang on the same loop).
#pragma once

#include "trident/train/train_config.h"

namespace trident::train {

// Trains as configured; returns the process exit code. Throws on bad input.
int run_training(TrainConfig cfg);

}  // namespace trident::train
