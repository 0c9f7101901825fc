// Byte-level BPE: the GPT-2 alphabet, the PCRE2 pre-tokenizer, the merge loop with its per-word
// cache, and GPT2BPETokenizer (vocab.json + merges.txt).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "trident/data/gpt2_bpe.h"

#include <pcre2.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <functional>
#include <queue>

#include "trident/core/error.h"
#include "trident/data/json_io.h"
#include "trident/data/utf8.h"

namespace trident::data {

using core::DataError;
using core::InternalError;
using core::InvalidArgument;
using core::str;

// ---------------------------------------------------------------------------------------------
// Alphabet

std::uint32_t byte_to_code_point(std::uint8_t byte) {
  // Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves; the remaining 68 bytes are
  // numbered 256, 257, ... in increasing byte order (OpenAI's bytes_to_unicode).
  auto printable = [](unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  };
  if (printable(byte)) return byte;
  std::uint32_t n = 0;
  for (unsigned b = 0; b < byte; ++b) n += printable(b) ? 0 : 1;
  return 256 + n;
}

namespace {

std::string byte_token(std::uint8_t byte) {
  std::string s;
  utf8::append_code_point(byte_to_code_point(byte), s);
  return s;
}

// Inverse map for decoding: code point (< 512) -> byte, or -1.
std::array<std::int16_t, 512> make_code_point_to_byte() {
  std::array<std::int16_t, 512> m;
  m.fill(-1);
  for (int b = 0; b < 256; ++b)
    m[byte_to_code_point(static_cast<std::uint8_t>(b))] = static_cast<std::int16_t>(b);
  return m;
}

// The bytes a vocab token stands for: its characters mapped back through the alphabet, or, when
// some character is not in the alphabet, the token's own UTF-8 (as HF's ByteLevel decoder does).
std::string token_bytes(const std::string& token) {
  static const std::array<std::int16_t, 512> cp_to_byte = make_code_point_to_byte();
  std::string out;
  out.reserve(token.size());
  if (!utf8::is_valid(token)) return token;
  std::size_t i = 0;
  while (i < token.size()) {
    const std::uint32_t cp = utf8::next_code_point(token, i);
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return token;
    out.push_back(static_cast<char>(cp_to_byte[cp]));
  }
  return out;
}

// Unicode White_Space (what Oniguruma and Rust mean by \s), as members of a character class.
constexpr std::string_view kWhiteSpaceClass =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A})"
    R"(\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

}  // namespace

std::string onig_to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  int depth = 0;  // 0 outside a class, 1 in a class, >1 in nested (Oniguruma union) classes
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's') {
        out += depth > 0 ? std::string(kWhiteSpaceClass) : str("[", kWhiteSpaceClass, "]");
      } else if (e == 'S' && depth == 0) {
        out += str("[^", kWhiteSpaceClass, "]");
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (c == '[') {
      if (depth > 0 && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // POSIX [:alpha:]
        const std::size_t close = pattern.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out += pattern.substr(i, close + 2 - i);
          i = close + 1;
          continue;
        }
      }
      if (depth > 0) {
        // Oniguruma: a class inside a class is a union; flatten it into the outer class.
        if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
          throw InvalidArgument(str("regex '", pattern,
                                    "': a negated class nested in a class "
                                    "(at offset ",
                                    i, ") is not supported"));
        }
        ++depth;
        continue;
      }
      depth = 1;
      out += c;
      // A ']' right after '[' or '[^' is a literal member of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += "\\]", ++i;
      continue;
    }
    if (c == ']' && depth > 0) {
      if (--depth > 0) continue;  // end of a flattened nested class
    }
    out += c;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// RegexSplitter

RegexSplitter::RegexSplitter(std::string_view pattern, std::string_view what) {
  const std::string rewritten = onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw InvalidArgument(
        str(what, ": cannot compile regex '", pattern, "' (PCRE2 at offset ", err_offset,
            " of the rewritten pattern: ", reinterpret_cast<const char*>(msg), ")"));
  }
  // JIT is an optimization: without it (e.g. an exotic CPU) pcre2_match interprets the pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& pieces,
                          std::vector<char>* is_match) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  auto release = [&] {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(jit_stack);
  };
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const std::size_t n = text.size();
  std::size_t start = 0, gap_start = 0;
  PCRE2_SIZE jit_stack_size = 1 << 20;
  while (start < n) {
    int rc = pcre2_match(code, subject, n, start, PCRE2_NO_UTF_CHECK, md, mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack_size <= (PCRE2_SIZE{1} << 28)) {
      // A pathological input needs more JIT stack than the default 32 KiB: grow and retry.
      if (!mctx) mctx = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_free(jit_stack);
      jit_stack = pcre2_jit_stack_create(32 * 1024, jit_stack_size, nullptr);
      pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
      jit_stack_size *= 4;
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      release();
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw InternalError(str("pre-tokenizer regex failed at byte ", start, ": ",
                              reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t m0 = ov[0], m1 = ov[1];
    if (m1 == m0) {  // empty match: not a piece; step over one character
      start = m0 + 1;
      while (start < n && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
      continue;
    }
    if (m0 > gap_start) {
      pieces.push_back(text.substr(gap_start, m0 - gap_start));
      if (is_match) is_match->push_back(0);
    }
    pieces.push_back(text.substr(m0, m1 - m0));
    if (is_match) is_match->push_back(1);
    start = gap_start = m1;
  }
  if (gap_start < n) {
    pieces.push_back(text.substr(gap_start));
    if (is_match) is_match->push_back(0);
  }
  release();
}

bool RegexSplitter::full_match(std::string_view text) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;
}

// ---------------------------------------------------------------------------------------------
// Merge table: open addressing on the pair (left id, right id).

struct ByteLevelBpe::MergeTable {
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  std::vector<std::uint64_t> keys;
  std::vector<std::int32_t> ranks, merged;
  std::uint64_t mask = 0;
  int shift = 64;

  explicit MergeTable(std::size_t count) {
    std::size_t cap = 16;
    while (cap < count * 2) cap *= 2;
    keys.assign(cap, kEmpty);
    ranks.assign(cap, 0);
    merged.assign(cap, 0);
    mask = cap - 1;
    shift = 64 - std::countr_zero(cap);
  }
  static std::uint64_t key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }
  std::size_t slot(std::uint64_t k) const {
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> shift) & mask;
  }
  // Later inserts of the same pair replace earlier ones (as in HF and OpenAI's dict).
  void insert(std::int32_t a, std::int32_t b, std::int32_t rank, std::int32_t result) {
    const std::uint64_t k = key(a, b);
    std::size_t s = slot(k);
    while (keys[s] != kEmpty && keys[s] != k) s = (s + 1) & mask;
    keys[s] = k, ranks[s] = rank, merged[s] = result;
  }
  // Slot of the pair, or -1.
  std::int64_t find(std::int32_t a, std::int32_t b) const {
    const std::uint64_t k = key(a, b);
    std::size_t s = slot(k);
    while (true) {
      if (keys[s] == k) return static_cast<std::int64_t>(s);
      if (keys[s] == kEmpty) return -1;
      s = (s + 1) & mask;
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Per-word cache: sharded by hash, each shard a mutex-protected map; a full shard is cleared.

struct ByteLevelBpe::Cache {
  static constexpr std::size_t kShards = 64;
  static constexpr std::size_t kMaxEntriesPerShard = 4096;  // ~256K words in all
  static constexpr std::size_t kMaxWordBytes = 64;
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<std::int32_t>, Hash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards;

  // Appends the cached ids of `word` to out and returns true, or returns false.
  bool lookup(std::string_view word, std::size_t h, std::vector<std::int32_t>& out) {
    Shard& s = shards[h % kShards];
    std::lock_guard lock(s.mu);
    auto it = s.map.find(word);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void insert(std::string_view word, std::size_t h, const std::int32_t* ids, std::size_t n) {
    Shard& s = shards[h % kShards];
    std::lock_guard lock(s.mu);
    if (s.map.size() >= kMaxEntriesPerShard) s.map.clear();
    s.map.emplace(std::string(word), std::vector<std::int32_t>(ids, ids + n));
  }
};

// ---------------------------------------------------------------------------------------------
// ByteLevelBpe

ByteLevelBpe::ByteLevelBpe(std::unordered_map<std::string, std::int32_t> vocab,
                           const std::vector<BpeMerge>& merges, const std::string& vocab_source,
                           const std::string& merges_source)
    : vocab_(std::move(vocab)), cache_(std::make_unique<Cache>()) {
  for (const auto& [token, id] : vocab_) {
    if (id < 0) {
      throw DataError(str(vocab_source, ": token '", token, "' has negative id ", id));
    }
    if (id > kMaxTokenId) {
      throw DataError(str(vocab_source, ": token '", token, "' has id ", id,
                          ", above the largest supported id ", kMaxTokenId,
                          " (ids must number the vocabulary 0..N-1)"));
    }
    max_id_ = std::max(max_id_, id);
  }
  decoded_.resize(static_cast<std::size_t>(max_id_ + 1));
  has_id_.assign(static_cast<std::size_t>(max_id_ + 1), false);
  for (const auto& [token, id] : vocab_) {
    if (has_id_[id]) {
      // Two tokens with one id: decoding would give one of them for both (found by
      // fuzz_gpt2_bpe: text came back changed, silently).
      std::string other;
      for (const auto& [t, i] : vocab_)
        if (i == id && t != token && (other.empty() || t < other)) other = t;
      throw DataError(str(vocab_source, ": tokens '", std::min(token, other), "' and '",
                          std::max(token, other), "' both have id ", id,
                          " (each id must name one token; the file is corrupt)"));
    }
    decoded_[id] = token_bytes(token);
    has_id_[id] = true;
  }
  for (int b = 0; b < 256; ++b) {
    const std::string t = byte_token(static_cast<std::uint8_t>(b));
    auto it = vocab_.find(t);
    if (it == vocab_.end()) {
      throw DataError(str(vocab_source, ": no token for byte 0x", std::hex, b, std::dec, " ('", t,
                          "'); a byte-level BPE vocabulary must hold all 256 byte tokens"));
    }
    byte_id_[b] = it->second;
  }
  merges_ = std::make_unique<MergeTable>(merges.size());
  std::string joined;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge& m = merges[rank];
    auto find = [&](const std::string& t, std::string_view role) {
      auto it = vocab_.find(t);
      if (it == vocab_.end()) {
        throw DataError(str(merges_source, ":", m.line, ": ", role, " '", t, "' of merge '", m.left,
                            " ", m.right, "' is not in ", vocab_source));
      }
      return it->second;
    };
    const std::int32_t a = find(m.left, "left part"), b = find(m.right, "right part");
    joined = m.left + m.right;
    const std::int32_t ab = find(joined, "result");
    merges_->insert(a, b, static_cast<std::int32_t>(rank), ab);
  }
}

ByteLevelBpe::~ByteLevelBpe() = default;

std::optional<std::int32_t> ByteLevelBpe::token_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::int32_t> ByteLevelBpe::bytes_token_id(std::string_view bytes) const {
  std::string token;
  token.reserve(bytes.size() * 2);
  for (char c : bytes)
    utf8::append_code_point(byte_to_code_point(static_cast<std::uint8_t>(c)), token);
  return token_id(token);
}

void ByteLevelBpe::add_token(std::int32_t id, const std::string& content) {
  TRIDENT_CHECK(id >= 0 && id <= kMaxTokenId, "token id must be in 0..", kMaxTokenId, ", got ", id);
  if (id > max_id_) {
    max_id_ = id;
    decoded_.resize(static_cast<std::size_t>(id + 1));
    has_id_.resize(static_cast<std::size_t>(id + 1), false);
  }
  decoded_[id] = token_bytes(content);
  has_id_[id] = true;
}

// Merges in HF's order: always the lowest-rank adjacent pair, the leftmost one on ties, one pair
// at a time. (For merges learned by BPE training this equals OpenAI's "merge every occurrence of
// the best pair" loop, because a merge is always learned after the merges that form its parts.)
void ByteLevelBpe::bpe_small(std::int32_t* sym, std::size_t& n) const {
  const MergeTable& mt = *merges_;
  while (n > 1) {
    std::int32_t best_rank = INT32_MAX;
    std::size_t best = 0;
    std::int32_t best_result = 0;
    for (std::size_t i = 0; i + 1 < n; ++i) {
      const std::int64_t s = mt.find(sym[i], sym[i + 1]);
      if (s >= 0 && mt.ranks[s] < best_rank) {
        best_rank = mt.ranks[s], best = i, best_result = mt.merged[s];
      }
    }
    if (best_rank == INT32_MAX) break;
    sym[best] = best_result;
    std::copy(sym + best + 2, sym + n, sym + best + 1);
    --n;
  }
}

// The same order with a heap and a linked list, O(n log n), for long pre-tokens (whitespace runs,
// long digit or punctuation runs).
void ByteLevelBpe::bpe_large(std::vector<std::int32_t>& sym) const {
  const MergeTable& mt = *merges_;
  const auto n = static_cast<std::int64_t>(sym.size());
  std::vector<std::int64_t> prev(n), next(n);
  for (std::int64_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  using Entry = std::pair<std::int32_t, std::int64_t>;  // (rank, position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  auto push = [&](std::int64_t i) {
    if (i < 0 || next[i] < 0) return;
    const std::int64_t s = mt.find(sym[i], sym[next[i]]);
    if (s >= 0) heap.emplace(mt.ranks[s], i);
  };
  for (std::int64_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, i] = heap.top();
    heap.pop();
    if (sym[i] < 0 || next[i] < 0) continue;
    const std::int64_t s = mt.find(sym[i], sym[next[i]]);
    if (s < 0 || mt.ranks[s] != rank) continue;  // stale entry
    const std::int64_t j = next[i];
    sym[i] = mt.merged[s];
    sym[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  std::size_t w = 0;
  for (std::int64_t i = 0; i >= 0; i = next[i]) sym[w++] = sym[i];
  sym.resize(w);
}

void ByteLevelBpe::encode_word(std::string_view bytes, std::vector<std::int32_t>& out) const {
  const std::size_t n = bytes.size();
  if (n == 0) return;
  if (n == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(bytes[0])]);
    return;
  }
  if (n <= Cache::kMaxWordBytes) {
    const std::size_t h = Cache::Hash{}(bytes);
    if (cache_->lookup(bytes, h, out)) return;
    std::int32_t sym[Cache::kMaxWordBytes];
    for (std::size_t i = 0; i < n; ++i) sym[i] = byte_id_[static_cast<unsigned char>(bytes[i])];
    std::size_t m = n;
    bpe_small(sym, m);
    out.insert(out.end(), sym, sym + m);
    cache_->insert(bytes, h, sym, m);
    return;
  }
  std::vector<std::int32_t> sym(n);
  for (std::size_t i = 0; i < n; ++i) sym[i] = byte_id_[static_cast<unsigned char>(bytes[i])];
  bpe_large(sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

void ByteLevelBpe::decode_token(std::int32_t id, std::string& out) const {
  if (id < 0 || id > max_id_ || !has_id_[id]) {
    throw InvalidArgument(str("token id ", id, " is not in the vocabulary (ids 0..", max_id_, ")"));
  }
  out += decoded_[id];
}

// ---------------------------------------------------------------------------------------------
// Files

std::unordered_map<std::string, std::int32_t> read_bpe_vocab_json(const std::string& path) {
  const nlohmann::json j = parse_json_file(path, "vocab file");
  if (!j.is_object()) {
    throw DataError(str("vocab file ", path, ": expected a JSON object {token: id}, found a JSON ",
                        j.type_name()));
  }
  std::unordered_map<std::string, std::int32_t> vocab;
  vocab.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<std::int64_t>() < 0 ||
        it.value().get<std::int64_t>() > INT32_MAX) {
      throw DataError(str("vocab file ", path, ": token '", it.key(),
                          "' must map to a non-negative integer id, found ", it.value().dump()));
    }
    vocab.emplace(it.key(), static_cast<std::int32_t>(it.value().get<std::int64_t>()));
  }
  if (vocab.empty()) throw DataError(str("vocab file ", path, ": the vocabulary is empty"));
  return vocab;
}

std::vector<BpeMerge> read_bpe_merges_txt(const std::string& path) {
  const std::string text = read_file_bytes(path, "merges file");
  std::vector<BpeMerge> merges;
  std::size_t pos = 0;
  std::int64_t line_no = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.starts_with("#version")) continue;
    const std::size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos) {
      throw DataError(str("merges file ", path, ":", line_no,
                          ": expected 'left right' (two tokens "
                          "separated by one space), found '",
                          line, "'"));
    }
    merges.push_back({std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)), line_no});
  }
  if (merges.empty()) throw DataError(str("merges file ", path, ": no merges found"));
  return merges;
}

// ---------------------------------------------------------------------------------------------
// GPT2BPETokenizer

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file) {
  bpe_ = std::make_unique<ByteLevelBpe>(
      read_bpe_vocab_json(vocab_file), read_bpe_merges_txt(merge_file),
      str("vocab file ", vocab_file), str("merges file ", merge_file));
  splitter_ = std::make_unique<RegexSplitter>(kGpt2SplitPattern, "GPT-2 pre-tokenizer");
  const auto eod = bpe_->token_id("<|endoftext|>");
  if (!eod) {
    throw DataError(str("vocab file ", vocab_file,
                        ": no '<|endoftext|>' token, which "
                        "GPT2BPETokenizer uses as the end-of-document id"));
  }
  eod_ = *eod;
}

void GPT2BPETokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  std::string repaired;
  const std::string_view valid = utf8::repair(text, repaired);
  std::vector<std::string_view> pieces;
  splitter_->split(valid, pieces);
  for (std::string_view p : pieces) bpe_->encode_word(p, out);
}

std::vector<std::int32_t> GPT2BPETokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  encode_append(text, ids);
  return ids;
}

std::string GPT2BPETokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::int32_t id : ids) bpe_->decode_token(id, out);
  return out;
}

}  // namespace trident::data
