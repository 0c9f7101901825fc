// make_tokenizer: --tokenizer-type -> implementation, with the flag each one needs checked.
#include "trident/data/tokenizer.h"

#include "trident/core/error.h"
#include "trident/data/gpt2_bpe.h"
#include "trident/data/hf_tokenizer.h"
#include "trident/data/null_tokenizer.h"
#include "trident/data/sentencepiece_tokenizer.h"

namespace trident::data {

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& cfg) {
  const std::string& t = cfg.type;
  if (t == "GPT2BPETokenizer") {
    TRIDENT_CHECK(!cfg.vocab_file.empty() && !cfg.merge_file.empty(),
                  "--tokenizer-type GPT2BPETokenizer needs --vocab-file (vocab.json) and "
                  "--merge-file (merges.txt)");
    return std::make_unique<GPT2BPETokenizer>(cfg.vocab_file, cfg.merge_file);
  }
  if (t == "HuggingFaceTokenizer") {
    TRIDENT_CHECK(!cfg.model_file.empty(),
                  "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model "
                  "path/to/tokenizer.json");
    return std::make_unique<HuggingFaceTokenizer>(cfg.model_file);
  }
  if (t == "SentencePieceTokenizer" || t == "GPTSentencePieceTokenizer") {
    TRIDENT_CHECK(!cfg.model_file.empty(), "--tokenizer-type ", t,
                  " needs --tokenizer-model path/to/tokenizer.model");
    return std::make_unique<SentencePieceTokenizer>(cfg.model_file);
  }
  if (t == "NullTokenizer") {
    TRIDENT_CHECK(cfg.vocab_size > 0,
                  "--tokenizer-type NullTokenizer needs --vocab-size N (ids are 0..N-1)");
    return std::make_unique<NullTokenizer>(cfg.vocab_size);
  }
  throw core::InvalidArgument(core::str(
      "unknown --tokenizer-type '", t,
      "'; use GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer or NullTokenizer"));
}

}  // namespace trident::data
