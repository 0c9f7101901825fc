// preprocess(): byte parity with Megatron's preprocess_data.py output (shared/data/megatron), the
// same documents through megatron-core's reader, identical output for any worker count, the .txt
// document rules, JSON edge cases, merging, and the errors a user can hit.
#include "trident/data/preprocess.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "reference/reference_util.h"
#include "trident/core/error.h"
#include "trident/data/indexed_dataset.h"

namespace trident::data {
namespace {

using namespace trident::data::testing;

TokenizerConfig tiny_gpt2() {
  TokenizerConfig t;
  t.type = "GPT2BPETokenizer";
  t.vocab_file = shared_data() + "/megatron/gpt2-tiny-vocab.json";
  t.merge_file = shared_data() + "/megatron/gpt2-tiny-merges.txt";
  return t;
}

TokenizerConfig full_gpt2() {
  TokenizerConfig t;
  t.type = "GPT2BPETokenizer";
  t.vocab_file = shared_data() + "/tokenizers/gpt2/gpt2-vocab.json";
  t.merge_file = shared_data() + "/tokenizers/gpt2/gpt2-merges.txt";
  return t;
}

PreprocessConfig config(std::vector<std::string> inputs, const std::string& prefix,
                        TokenizerConfig tok) {
  PreprocessConfig c;
  c.inputs = std::move(inputs);
  c.output_prefix = prefix;
  c.tokenizer = std::move(tok);
  c.progress_interval_s = 0;
  return c;
}

std::string owt_jsonl() { return shared_data() + "/jsonl/openwebtext-1000.reconstructed.jsonl"; }
std::string megatron_prefix() {
  return shared_data() + "/megatron/meg-gpt2-openwebtext_text_document";
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(Preprocess, ByteIdenticalToMegatronAndReadableByMegatronCore) {
  TempDir tmp;
  PreprocessConfig c = config({owt_jsonl()}, tmp / "owt", tiny_gpt2());
  c.append_eod = true;
  c.workers = 2;
  const PreprocessStats s = preprocess(c);
  EXPECT_EQ(s.documents, 1000);
  EXPECT_EQ(s.tokens, 1361845);
  ASSERT_EQ(s.outputs, std::vector<std::string>{tmp / "owt_text_document"});
  EXPECT_TRUE(read_bytes(tmp / "owt_text_document.bin") == read_bytes(megatron_prefix() + ".bin"))
      << ".bin differs from Megatron's";
  EXPECT_TRUE(read_bytes(tmp / "owt_text_document.idx") == read_bytes(megatron_prefix() + ".idx"))
      << ".idx differs from Megatron's";

  // megatron-core's IndexedDataset reads trident's files as the same documents, and each
  // document is the JSON text, tokenized, plus EOD.
  ASSERT_TRUE(
      run_reference("megatron_indexed.py", {"dump", tmp / "owt_text_document", tmp / "dump.bin"}));
  const std::string dump = read_bytes(tmp / "dump.bin");
  std::int64_t head[3];
  std::memcpy(head, dump.data(), 24);
  ASSERT_EQ(head[0], 1000);
  ASSERT_EQ(head[1], 1001);
  EXPECT_EQ(head[2], 8);  // uint16
  const IndexedDataset ds(tmp / "owt_text_document");
  const auto texts = lines_of(read_bytes(owt_jsonl()));
  const auto tok = make_tokenizer(tiny_gpt2());
  std::size_t pos = 24 + 4 * 1000 + 8 * 1001;
  for (std::int64_t i = 0; i < 1000; ++i) {
    const auto mine = ds.sequence(i);
    std::vector<std::int32_t> theirs(mine.size());
    for (std::size_t k = 0; k < mine.size(); ++k, pos += 8) {
      std::int64_t v;
      std::memcpy(&v, dump.data() + pos, 8);
      theirs[k] = static_cast<std::int32_t>(v);
    }
    ASSERT_EQ(mine, theirs) << "document " << i << " as read by megatron-core";
    std::vector<std::int32_t> expected =
        tok->encode(nlohmann::json::parse(texts[i])["text"].get<std::string>());
    expected.push_back(4999);
    ASSERT_EQ(mine, expected) << "document " << i;
  }
  EXPECT_EQ(pos, dump.size());
}

TEST(Preprocess, OutputDoesNotDependOnWorkers) {
  TempDir tmp;
  const std::vector<std::string> inputs = {shared_data() + "/jsonl/arxiv.jsonl", owt_jsonl()};
  std::string bin, idx;
  for (int workers : {1, 3}) {
    PreprocessConfig c = config(inputs, tmp / ("w" + std::to_string(workers)), full_gpt2());
    c.append_eod = true;
    c.workers = workers;
    const PreprocessStats s = preprocess(c);
    EXPECT_EQ(s.documents, 1020);
    const std::string p = s.outputs[0];
    if (bin.empty()) {
      bin = read_bytes(p + ".bin"), idx = read_bytes(p + ".idx");
      continue;
    }
    EXPECT_TRUE(read_bytes(p + ".bin") == bin) << workers << " workers";
    EXPECT_TRUE(read_bytes(p + ".idx") == idx) << workers << " workers";
  }
}

TEST(Preprocess, MergingHalvesGivesTheWhole) {
  TempDir tmp;
  const auto lines = lines_of(read_bytes(owt_jsonl()));
  std::string first, second;
  for (std::size_t i = 0; i < lines.size(); ++i) (i < 400 ? first : second) += lines[i] + "\n";
  write_bytes(tmp / "a.jsonl", first);
  write_bytes(tmp / "b.jsonl", second);
  for (const char* part : {"a", "b"}) {
    PreprocessConfig c = config({tmp / (std::string(part) + ".jsonl")}, tmp / part, tiny_gpt2());
    c.append_eod = true;
    preprocess(c);
  }
  EXPECT_EQ(merge_datasets({tmp / "a_text_document", tmp / "b_text_document"}, tmp / "merged"),
            1000);
  EXPECT_TRUE(read_bytes(tmp / "merged.bin") == read_bytes(megatron_prefix() + ".bin"));
  EXPECT_TRUE(read_bytes(tmp / "merged.idx") == read_bytes(megatron_prefix() + ".idx"));
  EXPECT_THROW(merge_datasets({tmp / "merged"}, tmp / "merged"), core::InvalidArgument);
  expect_error<core::DataError>([&] { merge_datasets({tmp / "nothing"}, tmp / "m2"); },
                                {"nothing.idx"});
}

// Decodes every sequence of a dataset written with the full GPT-2 tokenizer (no EOD).
std::vector<std::string> decoded_sequences(const std::string& prefix) {
  const IndexedDataset ds(prefix);
  const auto tok = make_tokenizer(full_gpt2());
  std::vector<std::string> out;
  for (std::int64_t i = 0; i < ds.num_sequences(); ++i) out.push_back(tok->decode(ds.sequence(i)));
  return out;
}

TEST(Preprocess, TextDocumentRules) {
  TempDir tmp;
  write_bytes(tmp / "in.txt",
              "First para line 1\nline 2  \n\nSecond\r\nwith CRLF\r\n \t \r\n\n\nThird\n   \n"
              "  indented last");
  const std::vector<std::pair<TextDocuments, std::vector<std::string>>> cases = {
      {TextDocuments::kBlankLine,
       {"First para line 1\nline 2  ", "Second\r\nwith CRLF", "Third", "  indented last"}},
      {TextDocuments::kLine,
       {"First para line 1", "line 2  ", "Second", "with CRLF", "Third", "  indented last"}},
      {TextDocuments::kFile,
       {"First para line 1\nline 2  \n\nSecond\r\nwith CRLF\r\n \t \r\n\n\nThird\n   \n"
        "  indented last"}}};
  int n = 0;
  for (const auto& [rule, docs] : cases) {
    PreprocessConfig c = config({tmp / "in.txt"}, tmp / core::str("r", n++), full_gpt2());
    c.text_documents = rule;
    const PreprocessStats s = preprocess(c);
    EXPECT_EQ(s.documents, static_cast<std::int64_t>(docs.size()));
    EXPECT_EQ(decoded_sequences(s.outputs[0]), docs);
  }
}

TEST(Preprocess, JsonKeysSentencesEmptyDocumentsAndDtype) {
  TempDir tmp;
  write_bytes(tmp / "in.jsonl",
              "{\"text\": \"Hello world\", \"title\": [\"A\", \"\", \"B c\"]}\n"
              "\n"  // blank lines are skipped
              "{\"text\": \"\", \"title\": \"only title\", \"extra\": 1}\n"
              "{\"title\": \"t\", \"text\": \"caf\\u00e9 \\ud83d\\ude00\"}\n");
  PreprocessConfig c = config({tmp / "in.jsonl"}, tmp / "out", full_gpt2());
  c.json_keys = {"text", "title"};
  c.append_eod = true;
  const PreprocessStats s = preprocess(c);
  ASSERT_EQ(s.outputs.size(), 2u);
  const IndexedDataset text(s.outputs[0]), title(s.outputs[1]);
  // Megatron: an empty document keeps its document-index entry but has no sequence and no EOD.
  EXPECT_EQ(text.num_documents(), 3);
  EXPECT_EQ(text.document_indices(), (std::vector<std::int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(decoded_sequences(s.outputs[0]),
            (std::vector<std::string>{"Hello world<|endoftext|>", "café 😀<|endoftext|>"}));
  // A list is one sequence per non-empty sentence; EOD extends the last one.
  EXPECT_EQ(title.document_indices(), (std::vector<std::int64_t>{0, 2, 3, 4}));
  EXPECT_EQ(decoded_sequences(s.outputs[1]),
            (std::vector<std::string>{"A", "B c<|endoftext|>", "only title<|endoftext|>",
                                      "t<|endoftext|>"}));
  // Vocabulary >= 65500 -> int32 tokens (Megatron's rule); NullTokenizer's eod is vocab_size.
  write_bytes(tmp / "ids.txt", "70000 1 2\n\n3 69999\n");
  TokenizerConfig null_tok;
  null_tok.type = "NullTokenizer";
  null_tok.vocab_size = 70000;
  PreprocessConfig n = config({tmp / "ids.txt"}, tmp / "ids", null_tok);
  n.append_eod = true;
  const IndexedDataset ids(preprocess(n).outputs[0]);
  EXPECT_EQ(ids.dtype(), TokenDType::kI32);
  EXPECT_EQ(ids.sequence(0), (std::vector<std::int32_t>{70000, 1, 2, 70000}));
  EXPECT_EQ(ids.sequence(1), (std::vector<std::int32_t>{3, 69999, 70000}));
}

TEST(Preprocess, ErrorsNameTheFileAndLineAndLeaveNothingBehind) {
  TempDir tmp;
  auto run = [&](const std::string& name, const std::string& content) {
    write_bytes(tmp / name, content);
    preprocess(config({tmp / name}, tmp / "out", full_gpt2()));
  };
  expect_error<core::DataError>(
      [&] { run("bad.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": \"c\"\n"); },
      {"bad.jsonl:3:", "not a valid JSON line"});
  expect_error<core::DataError>(
      [&] { run("nokey.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n"); },
      {"nokey.jsonl:2:", "\"text\" not found", "\"body\"", "--json-keys"});
  expect_error<core::DataError>([&] { run("num.jsonl", "{\"text\": 5}\n"); },
                                {"num.jsonl:1:", "number"});
  expect_error<core::DataError>([&] { run("arr.jsonl", "[1, 2]\n"); }, {"arr.jsonl:1:", "array"});
  // A number too large for a double is the JSON parser's out_of_range, not a parse_error: it
  // escaped as an unexpected exception (found by fuzz_gpt2_bpe in the vocabulary reader, which
  // shares this JSON code).
  expect_error<core::DataError>(
      [&] { run("overflow.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\", \"n\": 1e999}\n"); },
      {"overflow.jsonl:2:", "not a valid JSON line", "number overflow"});
  // The key read given twice in a line: which text was meant? Other duplicates keep the last value
  // (Megatron's json.loads does the same).
  expect_error<core::DataError>(
      [&] { run("twice.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\", \"text\": \"c\"}\n"); },
      {"twice.jsonl:2:", "\"text\" appears twice"});
  expect_error<core::DataError>([&] { run("array.json", "[\n{\"text\": \"a\"}\n]\n"); },
                                {"array.json:1:", "JSON array", "one JSON object per line"});
  expect_error<core::DataError>([&] { run("empty.jsonl", ""); }, {"empty corpus", "empty.jsonl"});
  expect_error<core::DataError>([&] { run("blank.txt", "\n  \n\n"); }, {"empty corpus"});
  expect_error<core::DataError>([&] { run("nothing.jsonl", "{\"text\": \"\"}\n"); },
                                {"empty corpus", "tokenized to nothing"});
  expect_error<core::DataError>([&] { run("utf.jsonl", "{\"text\": \"a\xFF\"}\n"); },
                                {"utf.jsonl:1:"});
  expect_error<core::InvalidArgument>([&] { run("data.csv", "a,b\n"); }, {"data.csv", ".jsonl"});
  expect_error<core::DataError>(
      [&] { preprocess(config({tmp / "absent.jsonl"}, tmp / "out", full_gpt2())); },
      {"absent.jsonl"});
  PreprocessConfig keys = config({tmp / "blank.txt"}, tmp / "out", full_gpt2());
  keys.json_keys = {"body"};
  expect_error<core::InvalidArgument>([&] { preprocess(keys); }, {".txt", "text"});
  // Nothing was left behind: no outputs, no temporary files.
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) {
    EXPECT_EQ(e.path().string().find("out_"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace trident::data
