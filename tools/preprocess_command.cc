// placeholder: `trident preprocess` lands with its module.
#include "commands.h"

namespace trident::tools {
void register_preprocess(CLI::App& app) { app.add_subcommand("preprocess", "preprocess (not built yet)"); }
}  // namespace trident::tools
