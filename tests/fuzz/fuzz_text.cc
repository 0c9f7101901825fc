// Fuzz target: arbitrary bytes as text, through the UTF-8 helpers (validation, lossy repair,
// code-point iteration), GPT-2's and BLOOM's pre-tokenizer regexes, a GPT-2 BPE tokenizer and a
// Hugging Face tokenizer.json (added tokens, Split + ByteLevel pre-tokenizers). The tokenizers are
// small ones this target writes at start-up (every byte token plus merges of common letters).
// Checked: repair yields valid UTF-8 and leaves valid text alone; code points re-encode to the
// same bytes; the regex pieces cover the text in order; the GPT-2 tokenizer's decode(encode(x)) is
// the repaired x; the HF tokenizer encodes to ids that decode.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/data/gpt2_bpe.h"
#include "trident/data/hf_tokenizer.h"
#include "trident/data/utf8.h"

namespace {

using namespace trident;
using nlohmann::json;

std::string byte_token(unsigned char b) {
  std::string s;
  data::utf8::append_code_point(data::byte_to_code_point(b), s);
  return s;
}

struct Setup {
  std::unique_ptr<data::GPT2BPETokenizer> gpt2;
  std::unique_ptr<data::HuggingFaceTokenizer> hf;
  std::unique_ptr<data::RegexSplitter> gpt2_regex, bloom_regex;
};

const Setup& setup() {
  static const Setup s = [] {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_token(static_cast<unsigned char>(b))] = b;
    std::vector<std::pair<std::string, std::string>> merges;
    const std::string letters = " etaoinshrdlu";
    for (const char a : letters) {
      for (const char b : letters) {
        if (b == ' ') continue;
        const std::string l = byte_token(static_cast<unsigned char>(a));
        const std::string r = byte_token(static_cast<unsigned char>(b));
        if (!vocab.contains(l + r)) vocab[l + r] = static_cast<int>(vocab.size());
        merges.emplace_back(l, r);
      }
    }
    const int eot = static_cast<int>(vocab.size());
    vocab["<|endoftext|>"] = eot;
    std::string merges_txt = "#version: 0.2\n";
    json hf_merges = json::array();
    for (const auto& [l, r] : merges) {
      merges_txt += l + " " + r + "\n";
      hf_merges.push_back(l + " " + r);
    }
    fuzz::write_file(fuzz::scratch_path("text-vocab.json"), vocab.dump());
    fuzz::write_file(fuzz::scratch_path("text-merges.txt"), merges_txt);
    json t = {{"version", "1.0"},
              {"added_tokens",
               {{{"id", eot}, {"content", "<|endoftext|>"}, {"special", true}},
                {{"id", eot + 1}, {"content", "<pad>"}, {"special", true}, {"lstrip", true}},
                {{"id", eot + 2}, {"content", "ab"}, {"single_word", true}, {"rstrip", true}}}},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", " ?[^(\\s|[.,!?…。，、।۔،])]+"}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", hf_merges}}}};
    fuzz::write_file(fuzz::scratch_path("text-tokenizer.json"), t.dump());
    Setup r;
    r.gpt2 = std::make_unique<data::GPT2BPETokenizer>(fuzz::scratch_path("text-vocab.json"),
                                                      fuzz::scratch_path("text-merges.txt"));
    r.hf = std::make_unique<data::HuggingFaceTokenizer>(fuzz::scratch_path("text-tokenizer.json"));
    r.gpt2_regex = std::make_unique<data::RegexSplitter>(data::kGpt2SplitPattern, "gpt2");
    r.bloom_regex = std::make_unique<data::RegexSplitter>(
        data::onig_to_pcre2(" ?[^(\\s|[.,!?…。，、।۔،])]+"), "bloom");
    return r;
  }();
  return s;
}

void check_pieces(const data::RegexSplitter& re, std::string_view text) {
  std::vector<std::string_view> pieces;
  re.split(text, pieces);
  std::size_t at = 0;
  for (const std::string_view p : pieces) {
    if (p.data() != text.data() + at || p.empty()) __builtin_trap();
    at += p.size();
  }
  if (at != text.size()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace utf8 = trident::data::utf8;
  const Setup& s = setup();
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  std::string storage;
  const std::string_view text = utf8::repair(raw, storage);
  if (!utf8::is_valid(text)) __builtin_trap();
  if (utf8::is_valid(raw) && text.data() != raw.data()) __builtin_trap();
  if (utf8::valid_prefix(raw) > raw.size()) __builtin_trap();
  std::string again;
  for (std::size_t i = 0; i < text.size();) {
    const std::uint32_t cp = utf8::next_code_point(text, i);
    utf8::append_code_point(cp, again);
  }
  if (again != text) __builtin_trap();
  check_pieces(*s.gpt2_regex, text);
  check_pieces(*s.bloom_regex, text);
  fuzz::expect_clean_errors("fuzz_text", [&] {
    if (s.gpt2->decode(s.gpt2->encode(raw)) != text) __builtin_trap();
    (void)s.hf->decode(s.hf->encode(raw));
  });
  return 0;
}
