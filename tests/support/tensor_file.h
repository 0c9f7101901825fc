// Tensor files ("TRTF"): named, typed, shaped arrays exchanged between the PyTorch reference
// scripts (tests/reference/tensor_file.py) and the C++ tests. Layout: docs/formats/tensor_file.md.
// Test support only: small files read whole into memory, no mmap, no streaming.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trident::testing {

// dtype codes stored in the file (u32). Plain ints, as the file stores them.
constexpr int kTensorF32 = 0;
constexpr int kTensorI32 = 1;
constexpr int kTensorF64 = 2;
constexpr int kTensorI64 = 3;

// Bytes per element of a dtype code; throws InvalidArgument for an unknown code.
std::int64_t tensor_dtype_size(int dtype);
// "f32", "i32", "f64", "i64", or "dtype(<code>)" for an unknown code.
std::string tensor_dtype_name(int dtype);

// One record: row-major, contiguous, little-endian data. A scalar has an empty shape (numel 1).
struct NamedTensor {
  std::string name;
  int dtype = kTensorF32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> data;  // numel() * tensor_dtype_size(dtype) bytes

  // Product of the dims (1 for a scalar).
  std::int64_t numel() const;

  // Copies of the elements. Each throws InvalidArgument (naming the tensor) unless dtype matches.
  std::vector<float> f32() const;
  std::vector<std::int32_t> i32() const;
  std::vector<double> f64() const;
  std::vector<std::int64_t> i64() const;

  // Any dtype converted to double (i64 values beyond 2^53 lose precision).
  std::vector<double> to_f64() const;
  // The single element of a tensor with numel() == 1, converted to double.
  double scalar() const;
};

// Makers: check that values.size() equals the product of shape (InvalidArgument otherwise).
NamedTensor make_f32_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<float>& values);
NamedTensor make_i32_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<std::int32_t>& values);
NamedTensor make_f64_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<double>& values);
NamedTensor make_i64_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<std::int64_t>& values);

// Writes the tensors in the given order. Throws InvalidArgument for a malformed tensor (empty or
// duplicate name, negative dim, data size not numel * dtype size) and DataError if the file cannot
// be written. Writes to "<path>.tmp" and renames, so a reader never sees a half-written file.
void write_tensor_file(const std::string& path, const std::vector<NamedTensor>& tensors);

// Reads every record, in file order. Throws DataError naming the path and byte offset on a missing
// file, bad magic, unsupported version, unknown dtype, truncation, duplicate names or trailing
// bytes.
std::vector<NamedTensor> read_tensor_list(const std::string& path);
// Same, keyed by name.
std::map<std::string, NamedTensor> read_tensor_file(const std::string& path);

// The tensor called `name`; throws DataError listing what the file does hold if it is absent.
const NamedTensor& find_tensor(const std::map<std::string, NamedTensor>& tensors,
                               const std::string& name);

}  // namespace trident::testing
