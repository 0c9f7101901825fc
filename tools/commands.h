// Subcommands of the `trident` CLI. Each registers itself on the CLI11 app and runs from its
// callback; errors propagate as exceptions to main, which prints them and exits non-zero.
#pragma once

#include <CLI/CLI.hpp>

namespace trident::tools {

void register_preprocess(CLI::App& app);  // preprocess_command.cc
void register_train(CLI::App& app);       // train_command.cc
void register_generate(CLI::App& app);    // generate_command.cc
void register_plan(CLI::App& app);        // plan_command.cc
void register_supervise(CLI::App& app);   // supervise_command.cc
void register_convert(CLI::App& app);     // convert_command.cc

}  // namespace trident::tools
