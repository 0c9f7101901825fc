// trident: one command with subcommands (preprocess, train, generate, plan, supervise, convert).
#include <cstdio>
#include <exception>

#include "commands.h"
#include "trident/core/error.h"
#include "trident/train/exit_codes.h"

int main(int argc, char** argv) {
  CLI::App app{"trident: train GPT and BLOOM language models (Megatron-LM / DeepSpeed flags)"};
  app.require_subcommand(1);
  trident::tools::register_preprocess(app);
  trident::tools::register_train(app);
  trident::tools::register_generate(app);
  trident::tools::register_plan(app);
  trident::tools::register_supervise(app);
  trident::tools::register_convert(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a subcommand's own exit code (trident train's stop codes)
  } catch (const CLI::ParseError& e) {
    // --help is not an error; a wrong flag is bad input (exit code 2, never retried).
    const int code = app.exit(e);
    return code == 0 ? 0 : trident::train::kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident: error: %s\n", e.what());
    return trident::train::exit_code_for(e);
  }
  return 0;
}
