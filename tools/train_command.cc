// placeholder: `trident train` lands with its module.
#include "commands.h"

namespace trident::tools {
void register_train(CLI::App& app) { app.add_subcommand("train", "train (not built yet)"); }
}  // namespace trident::tools
