// The body of the fuzz targets for `trident train`'s settings, compiled once and linked into both
// (fuzz_train_config.cc, fuzz_train_args.cc: each only picks the mode):
//   fuzz_train_config  the input is a TOML file given with --config (CLI11's config reader)
//   fuzz_train_args    the input is the argument list, NUL-separated, after `train`
// Bad settings may only end in CLI11's ParseError (printed with the option's name, exit code
// non-zero) or InvalidArgument from TrainConfig::finalize; a config that passes must serialize.
//
// The parser is built once per process, as `trident` builds it once (registering the ~1,150 train
// and Megatron compatibility flags took 3-4 s under ASan while it was quadratic, and is still the
// costliest step). Each input starts from the configuration as it was right after registration,
// and CLI11 clears every option's results at the start of a parse.
// The one value outside the configuration, the --config path, is given by every input of
// fuzz_train_config and by none of fuzz_train_args (which skips inputs that mention it).
#include "fuzz_train_settings.h"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/train/train_config.h"

namespace trident::fuzz {

namespace {

struct Parser {
  CLI::App app{"trident"};
  CLI::App* sub = nullptr;
  train::TrainConfig cfg;
  train::TrainConfig registered;  // cfg right after add_train_options
};

Parser& parser() {
  static Parser* p = [] {
    auto* q = new Parser;  // never destroyed: the options' callbacks point into it
    q->sub = q->app.add_subcommand("train", "train");
    train::add_train_options(*q->sub, q->cfg);
    q->registered = q->cfg;
    return q;
  }();
  return *p;
}

}  // namespace

void train_settings_init() { (void)parser(); }

void train_settings_one_input(const std::uint8_t* data, std::size_t size, bool as_args) {
  std::vector<std::string> args = {"trident", "train"};
  int world = 1;
  const char* target = as_args ? "fuzz_train_args" : "fuzz_train_config";
  if (as_args) {
    if (size > 0) world = 1 << (data[0] % 4);  // 1, 2, 4 or 8 processes
    std::string_view rest(reinterpret_cast<const char*>(data), size);
    if (!rest.empty()) rest.remove_prefix(1);
    while (!rest.empty() && args.size() < 64) {
      const std::size_t nul = rest.find('\0');
      args.emplace_back(rest.substr(0, nul));
      if (nul == std::string_view::npos) break;
      rest.remove_prefix(nul + 1);
    }
    for (const std::string& a : args) {
      if (a.find("config") != std::string::npos) return;  // reads files: fuzz_train_config's job
    }
  } else {
    const std::string path = scratch_path("train.toml");
    write_file(path, {reinterpret_cast<const char*>(data), size});
    args.push_back("--config");
    args.push_back(path);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  Parser& p = parser();
  train::TrainConfig& cfg = p.cfg;
  cfg = p.registered;
  expect_clean_errors(target, [&] {
    try {
      p.app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      if (std::getenv("TRIDENT_FUZZ_VERBOSE")) {
        std::fprintf(stderr, "%s: CLI11 %s (exit %d): %s\n", target, e.get_name().c_str(),
                     e.get_exit_code(), e.what());
      }
      return;  // trident_main prints it and exits with its non-zero code
    }
    train::record_given_flags(*p.sub, cfg);  // as `trident train` does before finalize
    cfg.finalize(world);
    (void)cfg.to_json().dump();
    (void)cfg.num_micro_batches(world);
  });
  // Back to the state after registration now, not at the next input: what this parse stored
  // (option results, strings of the configuration) is freed within this input, so that libFuzzer's
  // leak heuristic (more mallocs than frees in one run) does not run every input twice and scan
  // the heap.
  p.app.clear();
  cfg = p.registered;
}

}  // namespace trident::fuzz
