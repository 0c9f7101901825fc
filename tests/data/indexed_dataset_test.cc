// IndexedDataset / IndexedDatasetBuilder against Megatron's own files and megatron-core's reader
// and writer (tests/data/reference/megatron_indexed.py), plus every kind of bad file.
#include "trident/data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "reference/reference_util.h"
#include "trident/core/error.h"

namespace trident::data {
namespace {

using namespace trident::data::testing;
using Docs = std::vector<std::vector<std::vector<std::int32_t>>>;  // documents of sequences

std::string megatron_prefix() {
  return shared_data() + "/megatron/meg-gpt2-openwebtext_text_document";
}

void build(const std::string& prefix, TokenDType dtype, const Docs& docs) {
  IndexedDatasetBuilder b(prefix, dtype);
  for (const auto& doc : docs) {
    for (const auto& seq : doc) b.add_sequence(seq);
    b.end_document();
  }
  b.finalize();
}

// What megatron-core reads from a dataset: lengths, document indices, dtype code and tokens.
struct Dump {
  std::vector<std::int32_t> lengths;
  std::vector<std::int64_t> doc_indices;
  std::int64_t dtype = 0;
  std::vector<std::int64_t> tokens;
};

Dump megatron_read(const std::string& prefix, const TempDir& tmp) {
  Dump d;
  if (!run_reference("megatron_indexed.py", {"dump", prefix, tmp / "dump.bin"})) return d;
  const std::string b = read_bytes(tmp / "dump.bin");
  std::int64_t head[3];
  std::memcpy(head, b.data(), 24);
  d.dtype = head[2];
  d.lengths.resize(head[0]);
  d.doc_indices.resize(head[1]);
  std::size_t pos = 24;
  std::memcpy(d.lengths.data(), b.data() + pos, 4 * head[0]);
  pos += 4 * head[0];
  std::memcpy(d.doc_indices.data(), b.data() + pos, 8 * head[1]);
  pos += 8 * head[1];
  d.tokens.resize((b.size() - pos) / 8);
  std::memcpy(d.tokens.data(), b.data() + pos, b.size() - pos);
  return d;
}

void expect_same_as_megatron(const IndexedDataset& ds, const Dump& ref) {
  EXPECT_EQ(static_cast<std::int64_t>(ds.dtype()), ref.dtype);
  EXPECT_EQ(ds.sequence_lengths(), ref.lengths);
  EXPECT_EQ(ds.document_indices(), ref.doc_indices);
  std::vector<std::int64_t> tokens;
  for (std::int64_t i = 0; i < ds.num_sequences(); ++i) {
    for (std::int32_t t : ds.sequence(i)) tokens.push_back(t);
  }
  EXPECT_EQ(tokens, ref.tokens);
}

TEST(IndexedDataset, ReadsMegatronsOwnFile) {
  const IndexedDataset ds(megatron_prefix());
  EXPECT_EQ(ds.dtype(), TokenDType::kU16);
  EXPECT_EQ(ds.num_sequences(), 1000);
  EXPECT_EQ(ds.num_documents(), 1000);
  EXPECT_EQ(ds.num_tokens(), 1361845);  // data/README.md §5
  for (std::int64_t i = 0; i < ds.num_sequences(); ++i) {
    ASSERT_EQ(ds.sequence(i).back(), 4999) << "sequence " << i << " should end with EOD";
  }
  std::int32_t part[3];
  ds.read(7, 2, 3, part);
  const auto whole = ds.sequence(7);
  EXPECT_EQ(std::vector<std::int32_t>(part, part + 3),
            std::vector<std::int32_t>(whole.begin() + 2, whole.begin() + 5));
  TempDir tmp;
  expect_same_as_megatron(ds, megatron_read(megatron_prefix(), tmp));
  EXPECT_THROW(ds.sequence(1000), core::InvalidArgument);
  EXPECT_THROW(ds.read(0, ds.sequence_length(0) - 1, 2, part), core::InvalidArgument);
}

TEST(IndexedDataset, WorkedByteExampleOfTheFormatNote) {
  // reference/megatron.md §1.7: doc A = [10, 11, 12], doc B = [13, 14], uint16.
  TempDir tmp;
  build(tmp / "ex", TokenDType::kU16, {{{10, 11, 12}}, {{13, 14}}});
  const std::string bin = read_bytes(tmp / "ex.bin");
  EXPECT_EQ(bin, std::string("\x0A\0\x0B\0\x0C\0\x0D\0\x0E\0", 10));
  const std::string idx = read_bytes(tmp / "ex.idx");
  std::string want("MMIDIDX\0\0", 9);
  auto u64 = [&](std::uint64_t v) { want.append(reinterpret_cast<const char*>(&v), 8); };
  auto i32 = [&](std::int32_t v) { want.append(reinterpret_cast<const char*>(&v), 4); };
  u64(1);
  want += '\x08';
  u64(2), u64(3), i32(3), i32(2), u64(0), u64(6), u64(0), u64(1), u64(2);
  EXPECT_EQ(want.size(), 82u);
  EXPECT_TRUE(idx == want) << "index bytes differ from the worked example";
}

// Documents with several sequences, empty documents and an empty sequence, in every dtype:
// megatron-core writes them, trident reads the same content; trident writes them, the bytes equal.
TEST(IndexedDataset, RoundTripsWithMegatronCoreInEveryDtype) {
  const Docs docs = {{{1, 2, 3}, {4}}, {}, {{5, 6}}, {{}, {7, 8, 9, 10}}, {{0}}, {}};
  const std::vector<std::pair<TokenDType, const char*>> dtypes = {
      {TokenDType::kU8, "uint8"},  {TokenDType::kI8, "int8"},   {TokenDType::kI16, "int16"},
      {TokenDType::kI32, "int32"}, {TokenDType::kI64, "int64"}, {TokenDType::kU16, "uint16"}};
  TempDir tmp;
  std::vector<std::string> args = {"write"};
  for (const auto& [dtype, name] : dtypes) {
    nlohmann::json spec = {{"dtype", name}, {"documents", docs}};
    write_bytes(tmp / (std::string(name) + ".json"), spec.dump());
    args.push_back(tmp / (std::string("meg_") + name));
    args.push_back(tmp / (std::string(name) + ".json"));
  }
  ASSERT_TRUE(run_reference("megatron_indexed.py", args));  // one Python start for all dtypes
  for (const auto& [dtype, name] : dtypes) {
    const std::string meg_prefix = tmp / (std::string("meg_") + name);
    const std::string mine = tmp / (std::string("mine_") + name);
    const IndexedDataset meg(meg_prefix);
    EXPECT_EQ(meg.dtype(), dtype) << name;
    EXPECT_EQ(meg.num_documents(), static_cast<std::int64_t>(docs.size())) << name;
    std::vector<std::vector<std::int32_t>> seqs;
    for (const auto& d : docs) seqs.insert(seqs.end(), d.begin(), d.end());
    ASSERT_EQ(meg.num_sequences(), static_cast<std::int64_t>(seqs.size())) << name;
    for (std::size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(meg.sequence(i), seqs[i]) << name;
    build(mine, dtype, docs);
    EXPECT_TRUE(read_bytes(mine + ".bin") == read_bytes(meg_prefix + ".bin")) << name;
    EXPECT_TRUE(read_bytes(mine + ".idx") == read_bytes(meg_prefix + ".idx")) << name;
  }
}

TEST(IndexedDataset, MergeMatchesMegatronAddIndex) {
  TempDir tmp;
  build(tmp / "a", TokenDType::kU16, {{{1, 2}}, {{3}, {4, 5}}});
  build(tmp / "b", TokenDType::kU16, {{}, {{6, 7, 8}}});
  {
    IndexedDatasetBuilder m(tmp / "merged", TokenDType::kU16);
    m.add_dataset(IndexedDataset(tmp / "a"));
    m.add_dataset(IndexedDataset(tmp / "b"));
    m.add_dataset(IndexedDataset(megatron_prefix()));
    m.finalize();
  }
  ASSERT_TRUE(run_reference("megatron_indexed.py",
                            {"merge", tmp / "meg", tmp / "a", tmp / "b", megatron_prefix()}));
  EXPECT_TRUE(read_bytes(tmp / "merged.bin") == read_bytes(tmp / "meg.bin"));
  EXPECT_TRUE(read_bytes(tmp / "merged.idx") == read_bytes(tmp / "meg.idx"));
  // a: documents [0, 1, 3]; b (first document empty): [0, 0, 1] shifted by a's 3 sequences.
  const auto merged_docs = IndexedDataset(tmp / "merged").document_indices();
  EXPECT_EQ(std::vector<std::int64_t>(merged_docs.begin(), merged_docs.begin() + 6),
            (std::vector<std::int64_t>{0, 1, 3, 3, 4, 5}));
  build(tmp / "c", TokenDType::kI32, {{{1}}});
  IndexedDatasetBuilder m(tmp / "bad", TokenDType::kU16);
  expect_error<core::DataError>([&] { m.add_dataset(IndexedDataset(tmp / "c")); },
                                {"dtype code 4", "8"});
}

TEST(IndexedDatasetBuilder, TemporaryNamesAndRangeChecks) {
  TempDir tmp;
  {
    IndexedDatasetBuilder b(tmp / "p", TokenDType::kU16);
    b.add_sequence(std::vector<std::int32_t>{1, 2});
    b.end_document();
    EXPECT_FALSE(std::filesystem::exists(tmp / "p.bin"));  // not before finalize
    EXPECT_FALSE(std::filesystem::exists(tmp / "p.idx"));
    expect_error<core::InvalidArgument>([&] { b.add_sequence(std::vector<std::int32_t>{65536}); },
                                        {"65536", "int32"});
    expect_error<core::InvalidArgument>([&] { b.add_sequence(std::vector<std::int32_t>{-1}); },
                                        {"-1"});
  }  // abandoned: its temporary files are gone too
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
  IndexedDatasetBuilder b(tmp / "q", TokenDType::kI32);
  b.add_sequence(std::vector<std::int32_t>{70000});
  b.end_document();
  b.finalize();
  EXPECT_EQ(IndexedDataset(tmp / "q").sequence(0), std::vector<std::int32_t>{70000});
  EXPECT_THROW(b.finalize(), core::InvalidArgument);
  EXPECT_EQ(optimal_token_dtype(65499), TokenDType::kU16);
  EXPECT_EQ(optimal_token_dtype(65500), TokenDType::kI32);
}

// Bad files: each gives a DataError that names the file and says what was expected and found.
class BadIndexedDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    build(tmp_ / "good", TokenDType::kU16, {{{1, 2, 3}}, {{4, 5}}, {{6}}});
    idx_ = read_bytes(tmp_ / "good.idx");
    bin_ = read_bytes(tmp_ / "good.bin");
  }
  // Writes a pair (idx, bin) under a new prefix and expects opening it to fail.
  void expect_bad(const std::string& idx, const std::string& bin,
                  const std::vector<std::string>& pieces) {
    const std::string p = tmp_ / ("case" + std::to_string(n_++));
    write_bytes(p + ".idx", idx);
    write_bytes(p + ".bin", bin);
    std::vector<std::string> all = pieces;
    all.push_back(p);
    expect_error<core::DataError>([&] { IndexedDataset ds(p); }, all);
  }
  template <class T>
  std::string patched(std::size_t offset, T value) const {
    std::string s = idx_;
    std::memcpy(s.data() + offset, &value, sizeof value);
    return s;
  }
  TempDir tmp_;
  std::string idx_, bin_;
  int n_ = 0;
};

TEST_F(BadIndexedDataset, TruncatedForeignAndWrongHeaderFields) {
  EXPECT_NO_THROW(IndexedDataset(tmp_ / "good"));
  expect_bad(idx_.substr(0, 20), bin_, {".idx", "byte offset 20", "34-byte header", "20 bytes"});
  expect_bad(idx_.substr(0, idx_.size() - 3), bin_, {"truncated", "expected", "found"});
  expect_bad("", bin_, {"header"});
  expect_bad("<html>not an index at all</html>  ", bin_, {"bad magic", "4D 4D 49"});
  expect_bad(std::string("TNTIDX\0\0", 8) + idx_.substr(8), bin_, {"legacy"});
  expect_bad(patched<std::uint64_t>(9, 2), bin_, {"byte offset 9", "version", "expected 1"});
  expect_bad(patched<std::uint8_t>(17, 9), bin_, {"byte offset 17", "unknown dtype", "found 9"});
  expect_bad(patched<std::uint8_t>(17, 7), bin_, {"byte offset 17", "floating-point"});
  expect_bad(patched<std::uint64_t>(18, std::uint64_t{1} << 62), bin_,
             {"byte offset 18", "too large"});
  expect_bad(patched<std::uint64_t>(26, 0), bin_, {"byte offset 26"});
  expect_bad(idx_ + "junk!!!!!", bin_, {"unexpected bytes after the arrays"});
}

TEST_F(BadIndexedDataset, ArraysThatDoNotMatchTheBin) {
  // Layout of good.idx: 3 sequences, 4 document indices.
  const std::size_t lengths = 34, pointers = 34 + 12, docs = 34 + 36;
  expect_bad(idx_, bin_.substr(0, bin_.size() - 2), {".bin", "expected 12 bytes", "found 10"});
  expect_bad(idx_, bin_ + "xx", {".bin", "expected 12 bytes", "found 14"});
  // A longer sequence 1 moves where sequence 2 must start.
  expect_bad(patched<std::int32_t>(lengths + 4, 3), bin_,
             {"byte offset 62", "pointer of sequence 2", "expected 12", "found 10"});
  expect_bad(patched<std::int32_t>(lengths + 8, 2), bin_, {".bin", "expected 14 bytes"});
  expect_bad(patched<std::int32_t>(lengths, -1), bin_, {"byte offset 34", "length of sequence 0"});
  expect_bad(patched<std::int64_t>(pointers + 8, 4), bin_,
             {"byte offset 54", "pointer of sequence 1", "expected 6", "found 4"});
  expect_bad(patched<std::int64_t>(docs + 24, 2), bin_, {"last document index"});
  expect_bad(patched<std::int64_t>(docs + 8, 3), bin_, {"byte offset 86", "document index 2"});
  expect_bad(patched<std::int64_t>(docs, 1), bin_, {"first document index"});
}

TEST_F(BadIndexedDataset, MissingHalfOfThePair) {
  write_bytes(tmp_ / "only_idx.idx", idx_);
  expect_error<core::DataError>([&] { IndexedDataset ds(tmp_ / "only_idx"); },
                                {"only_idx.bin", "both"});
  write_bytes(tmp_ / "only_bin.bin", bin_);
  expect_error<core::DataError>([&] { IndexedDataset ds(tmp_ / "only_bin"); },
                                {"only_bin.idx", "both"});
}

}  // namespace
}  // namespace trident::data
