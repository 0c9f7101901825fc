// NullTokenizer (Megatron's): the text already holds token ids separated by whitespace. Ids must
// lie in [0, vocab_size); eod = vocab_size and vocab_size() = vocab_size + 1, as in Megatron.
#pragma once

#include "trident/data/tokenizer.h"

namespace trident::data {

class NullTokenizer : public Tokenizer {
 public:
  // vocab_size: --vocab-size, the number of ids the text may use (> 0).
  explicit NullTokenizer(std::int64_t vocab_size);
  // Throws DataError naming the offending word when it is not an id in [0, vocab_size].
  std::vector<std::int32_t> encode(std::string_view text) const override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override;
  // Ids joined by single spaces.
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return vocab_size_ + 1; }
  std::int32_t eod() const override { return static_cast<std::int32_t>(vocab_size_); }

 private:
  std::int64_t vocab_size_;
};

}  // namespace trident::data
