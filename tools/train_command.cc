// `trident train`: parses Megatron-style flags (or --config FILE.toml) and runs the trainer.
#include <memory>

#include "commands.h"
#include "trident/train/trainer.h"

namespace trident::tools {

void register_train(CLI::App& app) {
  auto cfg = std::make_shared<train::TrainConfig>();
  CLI::App* sub = app.add_subcommand("train", "Pre-train a GPT model (Megatron-LM flags)");
  train::add_train_options(*sub, *cfg);
  sub->callback([cfg] {
    const int code = train::run_training(*cfg);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace trident::tools
