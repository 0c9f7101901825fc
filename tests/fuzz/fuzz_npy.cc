// Fuzz target: the .npy reader behind the GPTDataset / BlendedDataset index caches
// (IndexArray::map_npy). An array that maps must expose exactly numel() elements.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "trident/data/index_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  const std::string path = fuzz::scratch_path("a.npy");
  fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean_errors("fuzz_npy", [&] {
    const data::IndexArray a = data::IndexArray::map_npy(path);
    std::int64_t numel = 1;
    for (const std::int64_t d : a.shape()) numel *= d;
    if (numel != a.numel()) __builtin_trap();
    if (a.numel() > static_cast<std::int64_t>(size) / data::index_dtype_size(a.dtype())) {
      __builtin_trap();  // more elements than the file has bytes
    }
    std::uint64_t sum = 0;  // touch every element (ASan checks each read)
    for (std::int64_t i = 0; i < a.numel(); ++i) sum += static_cast<std::uint64_t>(a.at(i));
    (void)sum;
  });
  return 0;
}
