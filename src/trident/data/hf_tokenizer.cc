// HuggingFaceTokenizer: loads tokenizer.json and reproduces HF tokenizers' encode pipeline
// (added-token extraction -> pre-tokenizer steps -> byte-level BPE -> post-processor template).
#include "trident/data/hf_tokenizer.h"

#include <algorithm>

#include "trident/core/error.h"
#include "trident/data/json_io.h"
#include "trident/data/utf8.h"

namespace trident::data {

using core::DataError;
using core::InvalidArgument;
using core::str;
using nlohmann::json;

enum class SplitBehavior { kIsolated, kRemoved };

struct HuggingFaceTokenizer::PreStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kByteLevel;
  std::unique_ptr<RegexSplitter> regex;  // Split, or ByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool add_prefix_space = false;
};

namespace {

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// A token id from the file: an integer in 0..kMaxTokenId (a float such as 1e300 or 3e9 would
// otherwise be converted with undefined behaviour, and a huge id would size tables by it).
std::int32_t token_id_field(const json& v, const std::string& path, std::string_view field) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > INT32_MAX) ||
      v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > ByteLevelBpe::kMaxTokenId) {
    throw DataError(str("tokenizer file ", path, ": ", field, " = ", v.dump().substr(0, 40),
                        " is not a token id (an integer in 0..", ByteLevelBpe::kMaxTokenId, ")"));
  }
  return static_cast<std::int32_t>(v.get<std::int64_t>());
}

bool get_bool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<bool>();
}

}  // namespace

namespace {

InvalidArgument unsupported(const std::string& path, std::string_view field, const json& value,
                            std::string_view supported) {
  return InvalidArgument(str("tokenizer file ", path, ": ", field, " = ",
                             value.dump().substr(0, 200),
                             " is not supported (supported: ", supported, ")"));
}

// The entries of a component that may be one object or a {"type": "Sequence", key: [...]}.
std::vector<const json*> components(const json& root, const char* field, const char* list_key) {
  std::vector<const json*> out;
  if (!root.contains(field) || root[field].is_null()) return out;
  const json& p = root[field];
  if (p.value("type", "") == "Sequence") {
    for (const json& q : p.at(list_key)) out.push_back(&q);
  } else {
    out.push_back(&p);
  }
  return out;
}

}  // namespace

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& tokenizer_json)
    : path_(tokenizer_json) {
  const json root = parse_json_file(tokenizer_json, "tokenizer file");
  if (!root.is_object() || !root.contains("model")) {
    throw DataError(
        str("tokenizer file ", path_, ": expected a JSON object with a \"model\" field"));
  }
  try {
    load_model(root.at("model"));
    load_added_tokens(root);
    if (root.contains("normalizer") && !root["normalizer"].is_null()) {
      throw unsupported(path_, "normalizer", root["normalizer"], "null");
    }
    for (const json* p : components(root, "pre_tokenizer", "pretokenizers")) load_pre_step(*p);
    for (const json* p : components(root, "post_processor", "processors")) load_post_step(*p);
    if (root.contains("decoder") && !root["decoder"].is_null() &&
        root["decoder"].value("type", "") != "ByteLevel") {
      throw unsupported(path_, "decoder", root["decoder"], "null, ByteLevel");
    }
  } catch (const json::exception& e) {
    throw DataError(str("tokenizer file ", path_, ": unexpected structure: ", e.what()));
  }
  word_regex_ = std::make_unique<RegexSplitter>(R"([\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])",
                                                "single_word check");
  for (const char* name : {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[EOS]"}) {
    auto it = std::find_if(added_.begin(), added_.end(),
                           [&](const AddedToken& a) { return a.special && a.content == name; });
    if (it != added_.end()) {
      eod_ = it->id;
      break;
    }
  }
}

void HuggingFaceTokenizer::load_model(const json& model) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") throw unsupported(path_, "model.type", model.at("type"), "BPE");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() != 0.0) {
    throw unsupported(path_, "model.dropout", model["dropout"], "null");
  }
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(f) && !model[f].is_null() && !model[f].get<std::string>().empty()) {
      throw unsupported(path_, str("model.", f), model[f], "null or \"\"");
    }
  }
  ignore_merges_ = get_bool(model, "ignore_merges", false);
  std::unordered_map<std::string, std::int32_t> vocab;
  for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) {
    vocab.emplace(it.key(),
                  token_id_field(it.value(), path_, str("model.vocab[\"", it.key(), "\"]")));
  }
  const json& jm = model.at("merges");
  std::vector<BpeMerge> merges;
  merges.reserve(jm.size());
  for (std::size_t i = 0; i < jm.size(); ++i) {
    BpeMerge m;
    m.line = static_cast<std::int64_t>(i);
    if (jm[i].is_string()) {
      const std::string s = jm[i].get<std::string>();
      const std::size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        throw DataError(str("tokenizer file ", path_, ": model.merges entry ", i, " '", s,
                            "' is not 'left right'"));
      }
      m.left = s.substr(0, sp), m.right = s.substr(sp + 1);
    } else if (jm[i].is_array() && jm[i].size() == 2) {
      m.left = jm[i][0].get<std::string>(), m.right = jm[i][1].get<std::string>();
    } else {
      throw DataError(str("tokenizer file ", path_, ": model.merges entry ", i,
                          " is neither \"a b\" nor [a, b]"));
    }
    merges.push_back(std::move(m));
  }
  bpe_ = std::make_unique<ByteLevelBpe>(std::move(vocab), merges,
                                        str("tokenizer file ", path_, ": model.vocab"),
                                        str("tokenizer file ", path_, ": model.merges entry"));
}

void HuggingFaceTokenizer::load_added_tokens(const json& root) {
  std::unordered_map<std::string, std::int32_t> distinct;  // content -> id, for vocab_size
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const json& t : root["added_tokens"]) {
      AddedToken a;
      a.id = token_id_field(t.at("id"), path_, "added_tokens id");
      a.content = t.at("content").get<std::string>();
      a.special = get_bool(t, "special", false);
      a.single_word = get_bool(t, "single_word", false);
      a.lstrip = get_bool(t, "lstrip", false);
      a.rstrip = get_bool(t, "rstrip", false);
      a.normalized = get_bool(t, "normalized", !a.special);
      if (a.content.empty()) continue;
      bpe_->add_token(a.id, a.content);
      distinct.emplace(a.content, a.id);
      AddedPass& pass = a.normalized ? normalized_ : non_normalized_;
      pass.tokens.push_back(added_.size());
      pass.first_byte[static_cast<unsigned char>(a.content[0])] = true;
      added_.push_back(std::move(a));
    }
  }
  // HF's vocab size with added tokens: model tokens plus added contents not already in it.
  vocab_size_ = bpe_->num_tokens();
  for (const auto& [content, id] : distinct) {
    if (!bpe_->token_id(content)) ++vocab_size_;
  }
}

void HuggingFaceTokenizer::load_pre_step(const json& pj) {
  auto step = std::make_unique<PreStep>();
  const std::string t = pj.value("type", "");
  const std::string where = str("tokenizer file ", path_, ": pre_tokenizer ", t);
  if (t == "ByteLevel") {
    step->kind = PreStep::Kind::kByteLevel;
    step->add_prefix_space = get_bool(pj, "add_prefix_space", true);
    if (get_bool(pj, "use_regex", true)) {
      step->regex = std::make_unique<RegexSplitter>(kGpt2SplitPattern, where);
    }
  } else if (t == "Split") {
    step->kind = PreStep::Kind::kSplit;
    const json& pat = pj.at("pattern");
    std::string regex;
    if (pat.contains("Regex")) {
      regex = pat["Regex"].get<std::string>();
    } else if (pat.contains("String")) {
      regex = regex_escape(pat["String"].get<std::string>());
    } else {
      throw unsupported(path_, "pre_tokenizer Split.pattern", pat,
                        "{\"Regex\": ...}, {\"String\": ...}");
    }
    step->regex = std::make_unique<RegexSplitter>(regex, where);
    const std::string behavior = pj.value("behavior", "Isolated");
    if (behavior == "Isolated") {
      step->behavior = SplitBehavior::kIsolated;
    } else if (behavior == "Removed") {
      step->behavior = SplitBehavior::kRemoved;
    } else {
      throw unsupported(path_, "pre_tokenizer Split.behavior", pj.at("behavior"),
                        "Isolated, Removed");
    }
    if (get_bool(pj, "invert", false)) {
      throw unsupported(path_, "pre_tokenizer Split.invert", pj.at("invert"), "false");
    }
  } else {
    throw unsupported(path_, "pre_tokenizer", pj, "ByteLevel, Split, Sequence of those");
  }
  steps_.push_back(std::move(step));
}

void HuggingFaceTokenizer::load_post_step(const json& pj) {
  const std::string t = pj.value("type", "");
  if (t == "ByteLevel") return;  // changes offsets only
  if (t != "TemplateProcessing") {
    throw unsupported(path_, "post_processor", pj,
                      "null, ByteLevel, TemplateProcessing, Sequence of those");
  }
  bool seen_sequence = false;
  for (const json& item : pj.at("single")) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    auto& dst = seen_sequence ? suffix_ids_ : prefix_ids_;
    for (const json& id : pj.at("special_tokens").at(name).at("ids")) {
      const std::int32_t v = token_id_field(id, path_, str("post_processor special_tokens ", name));
      if (!bpe_->has_token(v)) {
        throw DataError(str("tokenizer file ", path_, ": post_processor special token ", name,
                            " has id ", v, ", which is neither in model.vocab nor an added token"));
      }
      dst.push_back(v);
    }
  }
}

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

std::int32_t HuggingFaceTokenizer::eod() const {
  if (eod_ < 0) {
    throw InvalidArgument(str("tokenizer file ", path_,
                              " has no end-of-document token (a special "
                              "added token <|endoftext|>, </s>, <|end_of_text|>, <eos> or [EOS])"));
  }
  return eod_;
}

void HuggingFaceTokenizer::encode_word(std::string_view piece,
                                       std::vector<std::int32_t>& out) const {
  if (ignore_merges_) {
    if (auto id = bpe_->bytes_token_id(piece)) {
      out.push_back(*id);
      return;
    }
  }
  bpe_->encode_word(piece, out);
}

void HuggingFaceTokenizer::apply_steps(std::size_t step, std::string_view piece,
                                       std::vector<std::int32_t>& out) const {
  if (piece.empty()) return;
  if (step == steps_.size()) {
    encode_word(piece, out);
    return;
  }
  const PreStep& s = *steps_[step];
  std::string prefixed;
  if (s.kind == PreStep::Kind::kByteLevel && s.add_prefix_space && piece.front() != ' ') {
    prefixed = str(" ", piece);
    piece = prefixed;
  }
  if (!s.regex) {
    apply_steps(step + 1, piece, out);
    return;
  }
  std::vector<std::string_view> pieces;
  if (s.kind == PreStep::Kind::kSplit && s.behavior == SplitBehavior::kRemoved) {
    std::vector<char> is_match;  // keep only the gaps between matches
    s.regex->split(piece, pieces, &is_match);
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      if (!is_match[i]) apply_steps(step + 1, pieces[i], out);
    }
    return;
  }
  s.regex->split(piece, pieces);
  for (std::string_view p : pieces) apply_steps(step + 1, p, out);
}

void HuggingFaceTokenizer::encode_plain(std::string_view segment,
                                        std::vector<std::int32_t>& out) const {
  apply_steps(0, segment, out);
}

// HF's AddedVocabulary::find_matches with a leftmost-longest search over `which` tokens; the
// non-normalized pass runs first and its gaps go through the normalized pass.
void HuggingFaceTokenizer::encode_with_added(std::string_view text, bool normalized_pass,
                                             std::vector<std::int32_t>& out) const {
  const AddedPass& pass = normalized_pass ? normalized_ : non_normalized_;
  const std::vector<std::size_t>& which = pass.tokens;
  auto emit_gap = [&](std::string_view gap) {
    if (gap.empty()) return;
    if (normalized_pass) {
      encode_plain(gap, out);
    } else {
      encode_with_added(gap, true, out);
    }
  };
  if (which.empty()) {
    emit_gap(text);
    return;
  }
  auto is_word_char_before = [&](std::size_t pos) {
    if (pos == 0) return false;
    std::size_t b = pos - 1;
    while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
    return word_regex_->full_match(text.substr(b, pos - b));
  };
  auto is_word_char_at = [&](std::size_t pos) {
    if (pos >= text.size()) return false;
    std::size_t e = pos;
    utf8::next_code_point(text, e);
    return word_regex_->full_match(text.substr(pos, e - pos));
  };
  auto is_space_before = [&](std::size_t pos, std::size_t& start) {
    if (pos == 0) return false;
    std::size_t b = pos - 1;
    while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
    std::size_t e = b;
    const std::uint32_t cp = utf8::next_code_point(text, e);
    const bool ws = cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cp == 0xA0 ||
                    cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
                    cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    if (ws) start = b;
    return ws;
  };
  auto is_space_at = [&](std::size_t pos, std::size_t& end) {
    if (pos >= text.size()) return false;
    std::size_t e = pos;
    const std::uint32_t cp = utf8::next_code_point(text, e);
    const bool ws = cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cp == 0xA0 ||
                    cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
                    cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    if (ws) end = e;
    return ws;
  };
  std::size_t gap_start = 0, pos = 0;
  while (pos < text.size()) {
    if (!pass.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Leftmost-longest: the longest token starting at the first position where any starts.
    const AddedToken* best = nullptr;
    for (std::size_t k : which) {
      const AddedToken& a = added_[k];
      if (text.compare(pos, a.content.size(), a.content) == 0 &&
          (!best || a.content.size() > best->content.size())) {
        best = &a;
      }
    }
    if (!best) {
      ++pos;
      continue;
    }
    std::size_t start = pos, stop = pos + best->content.size();
    pos = stop;  // the search resumes after the raw match, whether it is kept or not
    if (best->single_word && (is_word_char_before(start) || is_word_char_at(stop))) continue;
    if (best->lstrip) {
      std::size_t s = start;
      while (is_space_before(s, s)) {
      }
      start = std::max(s, gap_start);
    }
    if (best->rstrip) {
      while (is_space_at(stop, stop)) {
      }
    }
    emit_gap(text.substr(gap_start, start > gap_start ? start - gap_start : 0));
    out.push_back(best->id);
    gap_start = std::max(gap_start, stop);
    pos = std::max(pos, stop);
  }
  if (gap_start < text.size()) emit_gap(text.substr(gap_start));
}

void HuggingFaceTokenizer::encode_append(std::string_view text,
                                         std::vector<std::int32_t>& out) const {
  std::string repaired;
  const std::string_view valid = utf8::repair(text, repaired);
  out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());
  encode_with_added(valid, false, out);
  out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
}

std::vector<std::int32_t> HuggingFaceTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_append(text, ids);
  return ids;
}

std::string HuggingFaceTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::int32_t id : ids) bpe_->decode_token(id, out);
  return out;
}

}  // namespace trident::data
