// placeholder: `trident generate` lands with its module.
#include "commands.h"

namespace trident::tools {
void register_generate(CLI::App& app) { app.add_subcommand("generate", "generate (not built yet)"); }
}  // namespace trident::tools
