// Megatron's indexed dataset: P.idx (index) + P.bin (raw tokens), byte layout in
// docs/formats/indexed_dataset.md (magic "MMIDIDX\0\0", version 1, dtype code, sequence count,
// document count, int32 lengths, int64 byte pointers, int64 document indices; little-endian,
// unaligned). The reader memory-maps both files and validates every size against the other.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace trident::data {

// Megatron DType codes.
enum class TokenDType : std::uint8_t {
  kU8 = 1,
  kI8 = 2,
  kI16 = 3,
  kI32 = 4,
  kI64 = 5,
  kF64 = 6,
  kF32 = 7,
  kU16 = 8
};
std::int64_t token_dtype_size(TokenDType t);
// Megatron's DType.optimal_dtype: uint16 when vocab_size < 65500, else int32.
TokenDType optimal_token_dtype(std::int64_t vocab_size);

class IndexedDataset {
 public:
  // Opens prefix.idx and prefix.bin. Throws DataError naming the file, the byte offset, and what
  // was expected and found (bad magic, version, dtype, truncated arrays, .bin size mismatch...).
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  std::int64_t num_sequences() const { return num_sequences_; }
  std::int64_t num_documents() const { return num_documents_; }
  std::int64_t num_tokens() const { return num_tokens_; }
  std::int32_t sequence_length(std::int64_t i) const;
  std::int64_t sequence_pointer(std::int64_t i) const;  // byte offset in .bin
  std::vector<std::int32_t> sequence_lengths() const;
  std::vector<std::int64_t> document_indices() const;
  // Copies tokens [offset, offset + count) of sequence i into out (converted to int32).
  void read(std::int64_t i, std::int64_t offset, std::int64_t count, std::int32_t* out) const;
  std::vector<std::int32_t> sequence(std::int64_t i) const;

 private:
  friend class IndexedDatasetBuilder;  // add_dataset copies the mapped .bin
  std::string prefix_;
  TokenDType dtype_ = TokenDType::kU16;
  std::int64_t num_sequences_ = 0, num_documents_ = 0, num_tokens_ = 0;
  const unsigned char* idx_ = nullptr;
  std::size_t idx_bytes_ = 0;
  const unsigned char* bin_ = nullptr;
  std::size_t bin_bytes_ = 0;
};

// Streams sequences to prefix.bin and writes prefix.idx on finalize(). Files are written under
// temporary names (prefix.bin.tmp.<pid>, prefix.idx.tmp.<pid>), fsynced and renamed on finalize,
// so a crash never leaves a half-written pair that looks complete; a builder destroyed without
// finalize() removes its temporary files. Output is byte-identical to Megatron's
// IndexedDatasetBuilder for the same calls. add_sequence throws InvalidArgument for a token that
// does not fit the dtype (e.g. >= 65536 in uint16) or a non-integer dtype.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(const std::string& prefix, TokenDType dtype);
  ~IndexedDatasetBuilder();
  void add_sequence(std::span<const std::int32_t> tokens);  // Megatron's add_item
  void end_document();  // closes the document made of the sequences added since the last one
  // Appends every sequence and document of another dataset (same dtype), as Megatron's add_index.
  void add_dataset(const IndexedDataset& other);
  void finalize();

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace trident::data
