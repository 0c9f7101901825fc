// Fuzz target: a Hugging Face tokenizer.json. The input is the file, separator, a text
// (fuzz_util.h). A tokenizer that loads must encode the text and decode the ids it produced.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/data/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  const auto parts = fuzz::split_input(data, size, 2);
  const std::string path = fuzz::scratch_path("tokenizer.json");
  fuzz::write_file(path, parts[0]);
  const std::string_view text = parts[1].substr(0, 4096);
  fuzz::expect_clean_errors("fuzz_hf_tokenizer", [&] {
    const data::HuggingFaceTokenizer tok(path);
    const std::vector<std::int32_t> ids = tok.encode(text);
    (void)tok.decode(ids);
    (void)tok.vocab_size();
    (void)tok.eod();
  });
  return 0;
}
