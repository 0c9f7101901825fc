// HuggingFaceTokenizer: a Hugging Face `tokenizers` tokenizer.json whose model is byte-level BPE
// (GPT-2, BLOOM, GPT-NeoX, Llama-3 kind). Supported pieces, matching HF's semantics:
//   model            BPE (vocab, merges as "a b" or ["a", "b"], ignore_merges); no dropout, no
//                    continuing_subword_prefix / end_of_word_suffix
//   added_tokens     split out of the text first (leftmost-longest; lstrip, rstrip, single_word;
//                    non-normalized tokens first, then normalized ones, as HF does)
//   normalizer       null only
//   pre_tokenizer    ByteLevel (add_prefix_space, use_regex), Split (Regex or String pattern,
//                    behavior Isolated or Removed, invert false), or a Sequence of those
//   post_processor   null, ByteLevel, TemplateProcessing ("single" template), or a Sequence
//   decoder          null or ByteLevel
// Anything else is rejected when the file is loaded, naming the field. Encoding equals HF's
// Tokenizer.encode(text).ids (add_special_tokens=True); invalid UTF-8 is repaired first (utf8.h).
#pragma once

#include <array>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "trident/data/gpt2_bpe.h"
#include "trident/data/tokenizer.h"

namespace trident::data {

class HuggingFaceTokenizer : public Tokenizer {
 public:
  // Throws DataError for a missing/corrupt file, InvalidArgument for unsupported components.
  explicit HuggingFaceTokenizer(const std::string& tokenizer_json);
  ~HuggingFaceTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) const override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override;
  // Keeps special tokens (HF's decode(ids, skip_special_tokens=False)); returns raw bytes.
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  // Distinct tokens in model vocab and added tokens (HF's get_vocab_size(with_added_tokens=True)).
  std::int64_t vocab_size() const override { return vocab_size_; }
  // The first special added token among <|endoftext|>, </s>, <|end_of_text|>, <eos>, [EOS];
  // throws InvalidArgument when the file has none.
  std::int32_t eod() const override;

 private:
  struct AddedToken {
    std::int32_t id = 0;
    std::string content;
    bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = true;
  };
  struct PreStep;
  // The added tokens matched in one pass (HF matches non-normalized tokens, then normalized ones).
  struct AddedPass {
    std::vector<std::size_t> tokens;     // indices into added_
    std::array<bool, 256> first_byte{};  // bytes that start one of them (a cheap prefilter)
  };

  void load_model(const nlohmann::json& model);
  void load_added_tokens(const nlohmann::json& root);
  void load_pre_step(const nlohmann::json& step);
  void load_post_step(const nlohmann::json& step);

  void encode_plain(std::string_view segment, std::vector<std::int32_t>& out) const;
  void encode_with_added(std::string_view text, bool normalized_pass,
                         std::vector<std::int32_t>& out) const;
  void apply_steps(std::size_t step, std::string_view piece, std::vector<std::int32_t>& out) const;
  void encode_word(std::string_view piece, std::vector<std::int32_t>& out) const;

  std::string path_;
  std::unique_ptr<ByteLevelBpe> bpe_;
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;  // in file order
  AddedPass non_normalized_, normalized_;
  std::vector<std::unique_ptr<PreStep>> steps_;
  std::unique_ptr<RegexSplitter> word_regex_;          // for single_word checks
  std::vector<std::int32_t> prefix_ids_, suffix_ids_;  // TemplateProcessing "single"
  std::int64_t vocab_size_ = 0;
  std::int32_t eod_ = -1;
};

}  // namespace trident::data
