// NullTokenizer: whitespace-separated decimal ids in, the same ids out.
#include "trident/data/null_tokenizer.h"

#include <charconv>
#include <climits>

#include "trident/core/error.h"

namespace trident::data {

using core::DataError;
using core::str;

NullTokenizer::NullTokenizer(std::int64_t vocab_size) : vocab_size_(vocab_size) {
  TRIDENT_CHECK(vocab_size > 0 && vocab_size < INT32_MAX,
                "NullTokenizer needs --vocab-size N with 0 < N < 2^31 - 1, got ", vocab_size);
}

void NullTokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    if (i == text.size()) break;
    std::size_t j = i;
    while (j < text.size() && !is_space(text[j])) ++j;
    const std::string_view word = text.substr(i, j - i);
    std::int64_t id = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc() || end != word.data() + word.size() || id < 0 || id > vocab_size_) {
      throw DataError(str("NullTokenizer: '", word.substr(0, 40), "' at byte ", i,
                          " is not a token id in [0, ", vocab_size_, "] (--vocab-size ",
                          vocab_size_,
                          "; the input must hold whitespace-"
                          "separated ids)"));
    }
    out.push_back(static_cast<std::int32_t>(id));
    i = j;
  }
}

std::vector<std::int32_t> NullTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  encode_append(text, ids);
  return ids;
}

std::string NullTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace trident::data
