// HuggingFaceTokenizer (tokenizer.json) against Hugging Face `tokenizers` itself, on GPT-2's
// tokenizer.json and on variants that exercise Split pre-tokenizers (BLOOM's pattern), added tokens
// with lstrip/rstrip/single_word, a TemplateProcessing post-processor and ignore_merges.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "reference/reference_util.h"
#include "trident/core/error.h"
#include "trident/data/hf_tokenizer.h"

namespace trident::data {
namespace {

using namespace trident::data::testing;
using nlohmann::json;

std::string gpt2_json() { return shared_data() + "/tokenizers/gpt2/tokenizer.json"; }

std::string special_text() {
  return "Hello<|endoftext|>world <|endoftext|> x<|endoftext|><|endoftext|>\n"
         "a [MASK] b  [MASK]  c\t[MASK]\n d <word> e<word> <word>f (<word>) <pad><pad>pad\n"
         "<|endoftext|      <|endoftext|>   \n\n  tail 日本語。中文，句子、हिन्दी। اردو۔ done!?… "
         "invalid \xE9\xFF bytes \xF0\x9F\x98 end";
}

// Writes the inputs, runs HF on them with `tokenizer_file`, and compares ids and vocab size.
void compare_with_hf(const std::string& tokenizer_file, const TempDir& tmp) {
  const std::string d = shared_data();
  write_bytes(tmp / "special.txt", special_text());
  write_bytes(tmp / "shakespeare.txt",
              read_bytes(d + "/english/tinyshakespeare/input.txt").substr(0, 100000));
  const std::vector<std::string> files = {tmp / "special.txt",
                                          tmp / "shakespeare.txt",
                                          d + "/multilingual/tatoeba/tatoeba.jpn-eng.jpn",
                                          d + "/multilingual/tatoeba/tatoeba.hin-eng.hin",
                                          d + "/multilingual/tatoeba/tatoeba.urd-eng.urd",
                                          d + "/multilingual/tatoeba/tatoeba.cmn-eng.cmn"};
  TempDir out;
  std::vector<std::string> args = {"--tokenizer-json", tokenizer_file, "--out-dir", out.path()};
  args.insert(args.end(), files.begin(), files.end());
  ASSERT_TRUE(run_reference("hf_tokenize.py", args));
  const HuggingFaceTokenizer tok(tokenizer_file);
  EXPECT_EQ(tok.vocab_size(), json::parse(read_bytes(out / "meta.json"))["vocab_size"].get<int>());
  for (std::size_t i = 0; i < files.size(); ++i) {
    const auto want = read_int32s(out / (std::to_string(i) + ".ids"));
    const auto got = tok.encode(read_bytes(files[i]));
    EXPECT_EQ(got, want) << tokenizer_file << " on " << files[i] << ": "
                         << first_difference(got, want);
  }
}

TEST(HuggingFaceTokenizer, Gpt2TokenizerJsonMatchesHf) {
  TempDir tmp;
  compare_with_hf(gpt2_json(), tmp);
  const HuggingFaceTokenizer tok(gpt2_json());
  EXPECT_EQ(tok.eod(), 50256);
  EXPECT_EQ(tok.encode("a<|endoftext|>b"), (std::vector<std::int32_t>{64, 50256, 65}));
  EXPECT_EQ(tok.decode(tok.encode("x <|endoftext|> y")), "x <|endoftext|> y");
}

json add_tokens(json t) {
  auto& added = t["added_tokens"];
  auto token = [](int id, const char* content, bool special, bool lstrip, bool rstrip,
                  bool single_word, bool normalized) {
    return json{{"id", id},
                {"content", content},
                {"special", special},
                {"lstrip", lstrip},
                {"rstrip", rstrip},
                {"single_word", single_word},
                {"normalized", normalized}};
  };
  added.push_back(token(50257, "<pad>", true, false, false, false, false));
  added.push_back(token(50258, "[MASK]", true, true, true, false, false));
  added.push_back(token(50259, "<word>", false, false, false, true, true));
  added.push_back(token(50260, "<|endoftext|", false, false, false, false, true));
  return t;
}

TEST(HuggingFaceTokenizer, BloomStyleSplitAddedTokensAndTemplateMatchHf) {
  json t = add_tokens(json::parse(read_bytes(gpt2_json())));
  // BLOOM's pre-tokenizer: its Oniguruma regex (with a nested class), then ByteLevel without regex.
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", " ?[^(\\s|[.,!?…。，、।۔،])]+"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}}}}};
  t["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<pad>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}}}},
      {"pair",
       {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens",
       {{"<pad>", {{"id", "<pad>"}, {"ids", {50257}}, {"tokens", {"<pad>"}}}},
        {"<|endoftext|>",
         {{"id", "<|endoftext|>"}, {"ids", {50256}}, {"tokens", {"<|endoftext|>"}}}}}}};
  TempDir tmp;
  write_bytes(tmp / "bloom_style.json", t.dump());
  compare_with_hf(tmp / "bloom_style.json", tmp);
}

TEST(HuggingFaceTokenizer, PrefixSpaceRemovedSplitIgnoreMergesMatchHf) {
  json t = add_tokens(json::parse(read_bytes(gpt2_json())));
  t["model"]["ignore_merges"] = true;
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"String", "\n"}}},
                           {"behavior", "Removed"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", true},
                           {"trim_offsets", true},
                           {"use_regex", true}}}}};
  TempDir tmp;
  write_bytes(tmp / "variant.json", t.dump());
  compare_with_hf(tmp / "variant.json", tmp);
}

TEST(HuggingFaceTokenizer, UnsupportedPartsAndBadFilesAreNamed) {
  TempDir tmp;
  json t = json::parse(read_bytes(gpt2_json()));
  json nfc = t;
  nfc["normalizer"] = {{"type", "NFC"}};
  write_bytes(tmp / "nfc.json", nfc.dump());
  expect_error<core::InvalidArgument>([&] { HuggingFaceTokenizer x(tmp / "nfc.json"); },
                                      {"nfc.json", "normalizer", "NFC"});
  json wp = t;
  wp["model"]["type"] = "WordPiece";
  write_bytes(tmp / "wp.json", wp.dump());
  expect_error<core::InvalidArgument>([&] { HuggingFaceTokenizer x(tmp / "wp.json"); },
                                      {"wp.json", "model.type", "WordPiece"});
  json no_eod = t;
  no_eod["added_tokens"] = json::array();
  write_bytes(tmp / "no_eod.json", no_eod.dump());
  const HuggingFaceTokenizer x(tmp / "no_eod.json");
  expect_error<core::InvalidArgument>([&] { x.eod(); }, {"no_eod.json", "end-of-document"});
  write_bytes(tmp / "cut.json", read_bytes(gpt2_json()).substr(0, 5000));
  expect_error<core::DataError>([&] { HuggingFaceTokenizer y(tmp / "cut.json"); },
                                {"cut.json", "not valid JSON"});
  // A number too large for a double escaped as an unexpected exception (found by
  // fuzz_hf_tokenizer's long run, input in tests/fuzz/regressions/fuzz_hf_tokenizer/).
  write_bytes(tmp / "overflow.json", "{\"model\": {\"dropout\": 33e3333333333}}");
  expect_error<core::DataError>([&] { HuggingFaceTokenizer y(tmp / "overflow.json"); },
                                {"overflow.json", "not valid JSON", "number overflow"});
  expect_error<core::DataError>([&] { HuggingFaceTokenizer y(tmp / "absent.json"); },
                                {"absent.json"});
}

// Ids that are not small non-negative integers (found with inputs derived from fuzz_hf_tokenizer's
// seeds, tests/fuzz): a float id (1e300, 3e9) was converted to int with undefined behaviour, a huge
// id sized the decode tables by it (2e9 ids: 64 GB, out of memory), and a template id outside the
// vocabulary was silently emitted by encode().
TEST(HuggingFaceTokenizer, BadTokenIdsAreNamed) {
  TempDir tmp;
  const json t = json::parse(read_bytes(gpt2_json()));
  auto expect_bad = [&](const char* name, const json& j, std::vector<std::string> parts) {
    write_bytes(tmp / name, j.dump());
    parts.insert(parts.begin(), name);
    expect_error<core::DataError>([&] { HuggingFaceTokenizer x(tmp / name); }, parts);
  };
  json float_added = t;
  float_added["added_tokens"][0]["id"] = 1e300;
  expect_bad("float_added.json", float_added, {"added_tokens id", "is not a token id"});
  json float_vocab = t;
  float_vocab["model"]["vocab"]["hello"] = 3e9;
  expect_bad("float_vocab.json", float_vocab, {"model.vocab[\"hello\"]", "is not a token id"});
  json huge_added = t;
  huge_added["added_tokens"][0]["id"] = 2000000000;
  expect_bad("huge_added.json", huge_added, {"2000000000", "0..16777215"});
  json negative = t;
  negative["model"]["vocab"]["hello"] = -1;
  expect_bad("negative.json", negative, {"model.vocab", "is not a token id"});
  json tmpl = t;
  tmpl["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "X"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"X", {{"id", "X"}, {"ids", {9999999}}, {"tokens", {"X"}}}}}}};
  expect_bad("template.json", tmpl, {"special token X", "9999999", "neither in model.vocab"});
}

}  // namespace
}  // namespace trident::data
