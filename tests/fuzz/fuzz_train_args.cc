// Fuzz target fuzz_train_args: see fuzz_train_settings.cc.
#include <cstddef>
#include <cstdint>

#include "fuzz_train_settings.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  trident::fuzz::train_settings_init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  trident::fuzz::train_settings_one_input(data, size, /*as_args=*/true);
  return 0;
}
