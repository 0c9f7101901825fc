// Fuzz target: GPT-2 BPE files. The input is vocab.json, separator, merges.txt, separator, text
// (fuzz_util.h). A tokenizer that loads must encode the text to non-negative ids whose
// decoding gives back the text's bytes (after the invalid-UTF-8 repair encode applies first).
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/data/gpt2_bpe.h"
#include "trident/data/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  const auto parts = fuzz::split_input(data, size, 3);
  const std::string vocab = fuzz::scratch_path("vocab.json");
  const std::string merges = fuzz::scratch_path("merges.txt");
  fuzz::write_file(vocab, parts[0]);
  fuzz::write_file(merges, parts[1]);
  const std::string_view text = parts[2].substr(0, 4096);
  fuzz::expect_clean_errors("fuzz_gpt2_bpe", [&] {
    const data::GPT2BPETokenizer tok(vocab, merges);
    const std::vector<std::int32_t> ids = tok.encode(text);
    for (const std::int32_t id : ids) {
      if (id < 0) __builtin_trap();
    }
    std::string storage;
    if (tok.decode(ids) != data::utf8::repair(text, storage)) __builtin_trap();
  });
  return 0;
}
