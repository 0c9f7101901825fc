// Byte-level BPE (GPT-2's scheme): text bytes are mapped to GPT-2's 256-character "byte to
// unicode" alphabet, split into pre-tokens by a regex, and each pre-token is merged by merge rank.
// ByteLevelBpe and RegexSplitter are shared by GPT2BPETokenizer (vocab.json + merges.txt, here)
// and HuggingFaceTokenizer (tokenizer.json, hf_tokenizer.h). Behaviour is documented in
// docs/data.md ("Tokenizers").
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trident/data/tokenizer.h"

namespace trident::data {

// GPT-2's pre-tokenizer pattern, as released by OpenAI (used by HF's ByteLevel pre-tokenizer).
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The byte -> character map of GPT-2's encoder.py (bytes_to_unicode): printable Latin-1 bytes map
// to themselves, the other 68 bytes to U+0100.. in byte order. Returns the code point for `byte`.
std::uint32_t byte_to_code_point(std::uint8_t byte);

// Rewrites an Oniguruma pattern (HF tokenizers' regex engine) for PCRE2: `\s` and `\S` become
// Unicode White_Space as Oniguruma defines it (PCRE2's \s would add U+180E), and a class nested in
// a class (Oniguruma's union, e.g. BLOOM's `[^(\s|[.,!?])]`) is flattened into the outer class.
// `\S` inside a class is left as is. A negated nested class throws InvalidArgument.
std::string onig_to_pcre2(std::string_view pattern);

// A compiled PCRE2 regex (UTF + UCP, JIT) that splits text the way HF's Split pre-tokenizer with
// behaviour "Isolated" does: each match is a piece, and so is each non-empty gap between matches.
// Thread-safe: split() may be called from several threads at once.
class RegexSplitter {
 public:
  // `what` names the pattern's origin for error messages (e.g. "tokenizer.json pre_tokenizer").
  RegexSplitter(std::string_view pattern, std::string_view what);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` (valid UTF-8) to `pieces`; they are views into `text`. When
  // `is_match` is given, it gets one entry per piece: 1 for a match, 0 for a gap.
  void split(std::string_view text, std::vector<std::string_view>& pieces,
             std::vector<char>* is_match = nullptr) const;
  // Whether the regex matches all of `text` (valid UTF-8).
  bool full_match(std::string_view text) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
};

struct BpeMerge {
  std::string left, right;
  std::int64_t line = 0;  // 1-based line in the merges file (or index in tokenizer.json)
};

// The BPE model: vocabulary (byte-level token string -> id) and merges (earlier = higher priority).
// encode_word() is thread-safe and caches results per pre-token (bounded size).
class ByteLevelBpe {
 public:
  // Ids are indices into dense tables (and, later, rows of the embedding): larger ones in a file
  // are rejected instead of allocating gigabytes for a typo (real vocabularies stay below 2^18).
  static constexpr std::int32_t kMaxTokenId = (1 << 24) - 1;

  // `vocab_source` / `merges_source` name the files (and fields) for DataError messages. Every
  // merge's parts and result must be in the vocab, and the vocab must hold all 256 byte tokens.
  ByteLevelBpe(std::unordered_map<std::string, std::int32_t> vocab,
               const std::vector<BpeMerge>& merges, const std::string& vocab_source,
               const std::string& merges_source);
  ~ByteLevelBpe();

  // Appends the ids of one pre-token, given as raw bytes (UTF-8 of the piece), to out.
  void encode_word(std::string_view bytes, std::vector<std::int32_t>& out) const;
  // Appends the bytes of token `id` to out. A token made only of byte-level characters decodes to
  // those bytes; any other token (e.g. an added token) decodes to its own UTF-8 text.
  void decode_token(std::int32_t id, std::string& out) const;

  std::optional<std::int32_t> token_id(std::string_view token) const;
  // The id of the vocab token that spells exactly these bytes (in the byte-level alphabet).
  std::optional<std::int32_t> bytes_token_id(std::string_view bytes) const;
  std::int64_t num_tokens() const { return static_cast<std::int64_t>(vocab_.size()); }
  std::int32_t max_id() const { return max_id_; }
  // Whether `id` is a token of the vocab or an added token.
  bool has_token(std::int32_t id) const {
    return id >= 0 && id <= max_id_ && has_id_[static_cast<std::size_t>(id)];
  }
  // Registers an extra token (an HF added token) for decoding.
  void add_token(std::int32_t id, const std::string& content);

 private:
  struct MergeTable;
  struct Cache;
  void bpe_small(std::int32_t* sym, std::size_t& n) const;
  void bpe_large(std::vector<std::int32_t>& sym) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::vector<std::string> decoded_;  // id -> bytes
  std::vector<bool> has_id_;
  std::int32_t max_id_ = -1;
  std::array<std::int32_t, 256> byte_id_{};
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<Cache> cache_;
};

// Reads vocab.json (a JSON object token -> id). DataError naming the file on any problem.
std::unordered_map<std::string, std::int32_t> read_bpe_vocab_json(const std::string& path);
// Reads merges.txt: an optional "#version" first line, then "left right" per line.
std::vector<BpeMerge> read_bpe_merges_txt(const std::string& path);

// Megatron's GPT2BPETokenizer: vocab.json + merges.txt, GPT-2 regex, eod = <|endoftext|>.
// Text is tokenized as plain text: "<|endoftext|>" inside the text is not special (as in
// Megatron and OpenAI's encoder). Invalid UTF-8 is repaired first (see utf8.h).
class GPT2BPETokenizer : public Tokenizer {
 public:
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);
  std::vector<std::int32_t> encode(std::string_view text) const override;
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return bpe_->num_tokens(); }
  std::int32_t eod() const override { return eod_; }

 private:
  std::unique_ptr<ByteLevelBpe> bpe_;
  std::unique_ptr<RegexSplitter> splitter_;
  std::int32_t eod_ = -1;
};

}  // namespace trident::data
