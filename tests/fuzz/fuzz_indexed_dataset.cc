// Fuzz target: Megatron's .idx/.bin reader (IndexedDataset). Built twice:
//   fuzz_idx      the input is the .idx; the .bin is a fixed 4096-byte file
//   fuzz_idx_bin  the input is .idx, separator, .bin (fuzz_util.h)
// A dataset that opens must answer every accessor without reading outside its files.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  const std::string prefix = fuzz::scratch_path("ds");
#ifdef TRIDENT_FUZZ_WITH_BIN
  const auto parts = fuzz::split_input(data, size, 2);
  fuzz::write_file(prefix + ".idx", parts[0]);
  fuzz::write_file(prefix + ".bin", parts[1]);
#else
  fuzz::write_file(prefix + ".idx", {reinterpret_cast<const char*>(data), size});
  static const bool bin_written = [&] {
    std::string bin(4096, '\0');
    for (std::size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<char>(i * 7 + 1);
    fuzz::write_file(prefix + ".bin", bin);
    return true;
  }();
  (void)bin_written;
#endif
  fuzz::expect_clean_errors("fuzz_idx", [&] {
    data::IndexedDataset ds(prefix);
    (void)data::token_dtype_size(ds.dtype());
    const std::vector<std::int32_t> lengths = ds.sequence_lengths();
    const std::vector<std::int64_t> docs = ds.document_indices();
    std::int64_t total = 0;
    std::vector<std::int32_t> buf;
    for (std::int64_t i = 0; i < ds.num_sequences() && i < 4096; ++i) {
      const std::int32_t n = ds.sequence_length(i);
      if (n != lengths[static_cast<std::size_t>(i)]) __builtin_trap();
      (void)ds.sequence_pointer(i);
      const std::vector<std::int32_t> seq = ds.sequence(i);
      if (static_cast<std::int64_t>(seq.size()) != n) __builtin_trap();
      if (n > 1) {  // a partial read equals the same slice of the whole sequence
        buf.resize(static_cast<std::size_t>(n - 1));
        ds.read(i, 1, n - 1, buf.data());
        for (std::int32_t k = 0; k + 1 < n; ++k) {
          if (buf[static_cast<std::size_t>(k)] != seq[static_cast<std::size_t>(k + 1)]) {
            __builtin_trap();
          }
        }
      }
      total += n;
    }
    if (ds.num_sequences() <= 4096 && total != ds.num_tokens()) __builtin_trap();
  });
  return 0;
}
