// Fuzz targets for `trident train`'s settings. Built twice:
//   fuzz_train_config  the input is a TOML file given with --config (CLI11's config reader)
//   fuzz_train_args    the input is the argument list, NUL-separated, after `train`
// Bad settings may only end in CLI11's ParseError (printed with the option's name, exit code
// non-zero) or InvalidArgument from TrainConfig::finalize; a config that passes must serialize.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  std::vector<std::string> args = {"trident", "train"};
  int world = 1;
#ifdef TRIDENT_FUZZ_ARGS
  const char* target = "fuzz_train_args";
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
    if (a.find("config") != std::string::npos) return 0;  // reads files: fuzz_train_config's job
  }
#else
  const char* target = "fuzz_train_config";
  const std::string path = fuzz::scratch_path("train.toml");
  fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  args.push_back("--config");
  args.push_back(path);
#endif
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  fuzz::expect_clean_errors(target, [&] {
    CLI::App app{"trident"};
    train::TrainConfig cfg;
    CLI::App* sub = app.add_subcommand("train", "train");
    train::add_train_options(*sub, cfg);
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      if (std::getenv("TRIDENT_FUZZ_VERBOSE")) {
        std::fprintf(stderr, "%s: CLI11 %s (exit %d): %s\n", target, e.get_name().c_str(),
                     e.get_exit_code(), e.what());
      }
      return;  // trident_main prints it and exits with its non-zero code
    }
    cfg.finalize(world);
    (void)cfg.to_json().dump();
    (void)cfg.num_micro_batches(world);
  });
  return 0;
}
