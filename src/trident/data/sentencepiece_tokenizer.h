// SentencePieceTokenizer: a SentencePiece .model (unigram or BPE) through Debian's
// libsentencepiece. encode = EncodeAsIds (no BOS/EOS added), eod = the model's </s> (eos) id, as
// Megatron's GPTSentencePieceTokenizer. Text is passed as bytes; libsentencepiece handles (and
// normalizes) it as the model's normalizer rule says.
#pragma once

#include <memory>
#include <string>

#include "trident/data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace trident::data {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Throws DataError when the model cannot be loaded or has no eos piece.
  explicit SentencePieceTokenizer(const std::string& model_file);
  ~SentencePieceTokenizer() override;
  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override;
  std::int32_t eod() const override { return eod_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::int32_t eod_ = -1;
  std::string path_;
};

}  // namespace trident::data
