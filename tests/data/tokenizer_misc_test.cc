// SentencePieceTokenizer against Debian's spm_encode/spm_decode (model trained in the test with
// spm_train), NullTokenizer, make_tokenizer's flag checks, and UTF-8 repair against the examples
// of the Unicode standard (§3.9, Tables 3-8 to 3-11).
#include <gtest/gtest.h>

#include <sstream>

#include "reference/reference_util.h"
#include "trident/core/error.h"
#include "trident/data/gpt2_bpe.h"
#include "trident/data/hf_tokenizer.h"
#include "trident/data/null_tokenizer.h"
#include "trident/data/sentencepiece_tokenizer.h"
#include "trident/data/tokenizer.h"
#include "trident/data/utf8.h"

namespace trident::data {
namespace {

using namespace trident::data::testing;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(SentencePieceTokenizer, MatchesSpmEncodeAndDecode) {
  TempDir tmp;
  const std::string d = shared_data();
  write_bytes(tmp / "train.txt",
              read_bytes(d + "/english/tinyshakespeare/input.txt").substr(0, 150000) +
                  read_bytes(d + "/multilingual/tatoeba/tatoeba.fra-eng.fra"));
  std::string log;
  ASSERT_EQ(run_command("spm_train --input=" + shell_quote(tmp / "train.txt") +
                            " --model_prefix=" + shell_quote(tmp / "m") +
                            " --vocab_size=600 --model_type=unigram --num_threads=2 "
                            "--minloglevel=2 --character_coverage=1.0",
                        &log),
            0)
      << log;
  // Text the model has not seen, with characters outside its alphabet (-> unk).
  std::string text;
  const std::vector<std::string> sources = {d + "/multilingual/tatoeba/tatoeba.deu-eng.deu",
                                            d + "/multilingual/tatoeba/tatoeba.rus-eng.rus",
                                            d + "/english/gutenberg/blake-poems.txt"};
  for (const auto& f : sources) {
    const auto ls = lines_of(read_bytes(f));
    for (std::size_t i = 0; i < 150 && i < ls.size(); ++i) text += ls[i] + "\n";
  }
  write_bytes(tmp / "text.txt", text);
  std::string encoded;
  ASSERT_EQ(run_command("spm_encode --model=" + shell_quote(tmp / "m.model") +
                            " --output_format=id < " + shell_quote(tmp / "text.txt"),
                        &encoded),
            0)
      << encoded;
  const SentencePieceTokenizer tok(tmp / "m.model");
  EXPECT_EQ(tok.vocab_size(), 600);
  EXPECT_EQ(tok.eod(), 2);  // spm_train's default eos id
  const auto text_lines = lines_of(text), id_lines = lines_of(encoded);
  ASSERT_EQ(text_lines.size(), id_lines.size());
  std::string ids_text;
  for (std::size_t i = 0; i < text_lines.size(); ++i) {
    std::vector<std::int32_t> want;
    std::istringstream in(id_lines[i]);
    for (std::int32_t id; in >> id;) want.push_back(id);
    const auto got = tok.encode(text_lines[i]);
    EXPECT_EQ(got, want) << "line " << i << " '" << text_lines[i]
                         << "': " << first_difference(got, want);
    ids_text += id_lines[i] + "\n";
  }
  write_bytes(tmp / "ids.txt", ids_text);
  std::string decoded;
  ASSERT_EQ(run_command("spm_decode --model=" + shell_quote(tmp / "m.model") +
                            " --input_format=id < " + shell_quote(tmp / "ids.txt"),
                        &decoded),
            0);
  const auto decoded_lines = lines_of(decoded);
  ASSERT_EQ(decoded_lines.size(), text_lines.size());
  for (std::size_t i = 0; i < text_lines.size(); ++i) {
    EXPECT_EQ(tok.decode(tok.encode(text_lines[i])), decoded_lines[i]) << "line " << i;
  }
  EXPECT_THROW(SentencePieceTokenizer(tmp / "absent.model"), core::DataError);
}

// Found by fuzz_sentencepiece: a model with a zero-length piece made libsentencepiece's trie
// builder throw a bare std::exception that named no file.
TEST(SentencePieceTokenizer, CorruptModelIsADataErrorNamingTheFile) {
  const std::string path = std::string(TRIDENT_SOURCE_DIR) +
                           "/tests/fuzz/regressions/fuzz_sentencepiece/zero-length-piece";
  try {
    SentencePieceTokenizer tok(path);
    ADD_FAILURE() << "the corrupt model loaded";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot load SentencePiece model " + path),
              std::string::npos)
        << e.what();
  }
}

TEST(NullTokenizer, ParsesIdsLikeMegatron) {
  const NullTokenizer tok(1000);
  EXPECT_EQ(tok.encode(" 1 2  3\n4\t999 1000 "),
            (std::vector<std::int32_t>{1, 2, 3, 4, 999, 1000}));
  EXPECT_EQ(tok.vocab_size(), 1001);  // Megatron: vocab_size + 1, eod = vocab_size
  EXPECT_EQ(tok.eod(), 1000);
  EXPECT_EQ(tok.decode({5, 6, 7}), "5 6 7");
  EXPECT_TRUE(tok.encode("   ").empty());
  for (const char* bad : {"1 x 2", "1001", "-1", "3.5", "12abc"}) {
    try {
      tok.encode(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const core::DataError& e) {
      EXPECT_NE(std::string(e.what()).find("NullTokenizer"), std::string::npos) << e.what();
    }
  }
}

TEST(MakeTokenizer, ChecksFlagsAndBuildsEachType) {
  const std::string g = shared_data() + "/tokenizers/gpt2/";
  auto make = [](const std::string& type, const std::string& vocab = "",
                 const std::string& merges = "", const std::string& model = "",
                 std::int64_t vocab_size = 0) {
    TokenizerConfig c;
    c.type = type, c.vocab_file = vocab, c.merge_file = merges, c.model_file = model;
    c.vocab_size = vocab_size;
    return make_tokenizer(c);
  };
  EXPECT_NE(dynamic_cast<GPT2BPETokenizer*>(
                make("GPT2BPETokenizer", g + "gpt2-vocab.json", g + "gpt2-merges.txt").get()),
            nullptr);
  EXPECT_NE(dynamic_cast<HuggingFaceTokenizer*>(
                make("HuggingFaceTokenizer", "", "", g + "tokenizer.json").get()),
            nullptr);
  EXPECT_EQ(make("NullTokenizer", "", "", "", 70000)->vocab_size(), 70001);
  try {
    make("BertWordPieceLowerCase");
    ADD_FAILURE() << "unknown type accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GPT2BPETokenizer"), std::string::npos);
  }
  EXPECT_THROW(make("GPT2BPETokenizer"), core::InvalidArgument);
  EXPECT_THROW(make("HuggingFaceTokenizer"), core::InvalidArgument);
  EXPECT_THROW(make("SentencePieceTokenizer"), core::InvalidArgument);
  EXPECT_THROW(make("NullTokenizer"), core::InvalidArgument);
}

std::string fffd(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "\xEF\xBF\xBD";
  return s;
}

TEST(Utf8, RepairFollowsUnicodeMaximalSubparts) {
  std::string storage;
  auto repair = [&](std::string_view s) { return std::string(utf8::repair(s, storage)); };
  // Unicode 15 §3.9, Tables 3-8 (non-shortest forms), 3-9 (surrogates), 3-10 (other ill-formed)
  // and 3-11 (truncated sequences).
  EXPECT_EQ(repair("\xC0\xAF\xE0\x80\xBF\xF0\x81\x82\x41"), fffd(8) + "A");
  EXPECT_EQ(repair("\xED\xA0\x80\xED\xBF\xBF\xED\xAF\x41"), fffd(8) + "A");
  EXPECT_EQ(repair("\xF4\x91\x92\x93\xFF\x41\x80\xBF\x42"), fffd(5) + "A" + fffd(2) + "B");
  EXPECT_EQ(repair("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41"), fffd(4) + "A");
  const std::string valid = "ascii é 日本 🇫🇷 \xF4\x8F\xBF\xBF";
  EXPECT_TRUE(utf8::is_valid(valid));
  EXPECT_EQ(utf8::repair(valid, storage).data(), valid.data());  // no copy when valid
  EXPECT_EQ(utf8::valid_prefix("ab\xC3"), 2u);
}

}  // namespace
}  // namespace trident::data
