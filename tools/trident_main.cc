// trident: one command with subcommands (preprocess, train, generate, plan).
#include <cstdio>
#include <exception>

#include "commands.h"
#include "trident/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"trident: train GPT and BLOOM language models (Megatron-LM / DeepSpeed flags)"};
  app.require_subcommand(1);
  trident::tools::register_preprocess(app);
  trident::tools::register_train(app);
  trident::tools::register_generate(app);
  trident::tools::register_plan(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
