// SentencePieceTokenizer over libsentencepiece's SentencePieceProcessor (thread-safe for
// concurrent Encode/Decode calls once loaded).
#include "trident/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <exception>

#include "trident/core/error.h"

namespace trident::data {

using core::DataError;
using core::InvalidArgument;
using core::str;

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(model_file) {
  sentencepiece::util::Status status;
  try {
    status = sp_->Load(model_file);
  } catch (const std::exception& e) {
    // libsentencepiece's trie builder throws on some corrupt models (a zero-length piece).
    throw DataError(str("cannot load SentencePiece model ", model_file, ": ", e.what(),
                        " (the model file is corrupt)"));
  }
  if (!status.ok()) {
    throw DataError(str("cannot load SentencePiece model ", model_file, ": ", status.ToString()));
  }
  eod_ = sp_->eos_id();
  if (eod_ < 0) {
    throw DataError(str("SentencePiece model ", model_file,
                        " has no eos piece (trained with "
                        "--eos_id=-1); it is needed as the end-of-document id"));
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) {
    throw DataError(
        str("SentencePiece model ", path_, ": cannot encode text: ", status.ToString()));
  }
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  for (int id : v) {
    if (id < 0 || id >= sp_->GetPieceSize()) {
      throw InvalidArgument(str("token id ", id, " is not in the SentencePiece vocabulary (0..",
                                sp_->GetPieceSize() - 1, ")"));
    }
  }
  std::string out;
  const auto status = sp_->Decode(v, &out);
  if (!status.ok()) throw DataError(str("SentencePiece decode failed: ", status.ToString()));
  return out;
}

std::int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

}  // namespace trident::data
