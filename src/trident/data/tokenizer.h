// Tokenizers behind one interface, chosen by --tokenizer-type (Megatron's names):
// GPT2BPETokenizer (GPT-2 byte-level BPE from vocab.json + merges.txt, gpt2_bpe.h),
// HuggingFaceTokenizer (a tokenizer.json with a byte-level BPE model, hf_tokenizer.h),
// SentencePieceTokenizer (a .model through libsentencepiece, sentencepiece_tokenizer.h) and
// NullTokenizer (text that already holds whitespace-separated ids, null_tokenizer.h).
// Behaviour (invalid UTF-8, special tokens, eod) is documented in docs/data.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace trident::data {

// All implementations are immutable after construction and thread-safe: encode/decode may be
// called from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // Appends the ids of `text` to `out` (lets callers reuse one buffer). Same ids as encode().
  virtual void encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
    const std::vector<std::int32_t> ids = encode(text);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  // Returns the bytes the ids stand for (not necessarily valid UTF-8 for a partial sequence).
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  // Number of real tokens (before padding to a multiple for the embedding).
  virtual std::int64_t vocab_size() const = 0;
  // End-of-document id (<|endoftext|> for GPT-2).
  virtual std::int32_t eod() const = 0;
};

struct TokenizerConfig {
  // "GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer" (alias
  // "GPTSentencePieceTokenizer") or "NullTokenizer".
  std::string type;
  std::string vocab_file;  // --vocab-file (GPT2BPETokenizer)
  std::string merge_file;  // --merge-file (GPT2BPETokenizer)
  std::string model_file;  // --tokenizer-model: tokenizer.json (HF) or .model (SentencePiece)
  std::int64_t vocab_size =
      0;  // --vocab-size (NullTokenizer: ids 0..vocab_size-1, eod = vocab_size)
};
// Throws InvalidArgument for an unknown type or a missing flag, DataError for missing/corrupt
// files.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& cfg);

}  // namespace trident::data
