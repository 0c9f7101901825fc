// Fuzz target: a SentencePiece .model loaded through libsentencepiece (SentencePieceTokenizer).
// A model that loads must encode a fixed text and decode the ids.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/data/sentencepiece_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  const std::string path = fuzz::scratch_path("sp.model");
  fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean_errors("fuzz_sentencepiece", [&] {
    const data::SentencePieceTokenizer tok(path);
    const std::vector<std::int32_t> ids = tok.encode("Hello world, a b c. \xe2\x82\xac 12 \xff!");
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
    }
    (void)tok.decode(ids);
    (void)tok.eod();
  });
  return 0;
}
