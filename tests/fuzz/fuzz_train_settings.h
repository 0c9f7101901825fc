// The shared body of fuzz_train_config and fuzz_train_args (fuzz_train_settings.cc, compiled once:
// it is the slowest file of the fuzz targets to compile, CLI11 and every train flag).
#pragma once

#include <cstddef>
#include <cstdint>

namespace trident::fuzz {

// Builds the parser (seconds under ASan); called from LLVMFuzzerInitialize, so that libFuzzer's
// per-input timeout does not count it.
void train_settings_init();

// as_args: the input is NUL-separated `trident train` arguments; else a --config TOML file.
void train_settings_one_input(const std::uint8_t* data, std::size_t size, bool as_args);

}  // namespace trident::fuzz
