// Tokenizers behind one interface (--tokenizer-type). GPT2BPETokenizer: GPT-2 byte-level BPE from
// vocab.json + merges.txt with the GPT-2 pre-tokenization regex (PCRE2, Unicode properties).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace trident::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  // Number of real tokens (before padding to a multiple for the embedding).
  virtual std::int64_t vocab_size() const = 0;
  // End-of-document id (<|endoftext|> for GPT-2).
  virtual std::int32_t eod() const = 0;
};

struct TokenizerConfig {
  std::string type;  // "GPT2BPETokenizer" (more in the data-pipeline work)
  std::string vocab_file;
  std::string merge_file;
};
// Throws InvalidArgument for an unknown type, DataError for missing/corrupt files.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& cfg);

}  // namespace trident::data
