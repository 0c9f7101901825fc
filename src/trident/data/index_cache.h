// Index-cache plumbing shared by GPTDataset and BlendedDataset: integer arrays that are either
// owned or memory-mapped from numpy .npy files, a .npy writer byte-identical to numpy.save, the MD5
// and the Python json.dumps(indent=4) text that Megatron's cache file names are derived from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trident::data {

// The element types Megatron's index arrays use (numpy descr in parentheses).
enum class IndexDType : std::uint8_t {
  kI16,  // '<i2'  BlendedDataset dataset_index
  kI32,  // '<i4'  document_index; sample_index when it fits
  kI64,  // '<i8'  large sample/shuffle index; dataset_sample_index
  kU32,  // '<u4'  shuffle_index when it fits
};
std::int64_t index_dtype_size(IndexDType t);
const char* index_dtype_descr(IndexDType t);  // "<i4", ...

template <class T>
constexpr IndexDType index_dtype_of();
template <>
constexpr IndexDType index_dtype_of<std::int16_t>() {
  return IndexDType::kI16;
}
template <>
constexpr IndexDType index_dtype_of<std::int32_t>() {
  return IndexDType::kI32;
}
template <>
constexpr IndexDType index_dtype_of<std::int64_t>() {
  return IndexDType::kI64;
}
template <>
constexpr IndexDType index_dtype_of<std::uint32_t>() {
  return IndexDType::kU32;
}

// A C-order integer array of rank 1 or 2, immutable once made. Storage is shared: copies are
// cheap and alias the same memory (a std::vector moved in, or a read-only mmap of a .npy file).
// Thread-safe for concurrent reads.
class IndexArray {
 public:
  IndexArray() = default;

  template <class T>
  static IndexArray from_vector(std::vector<T> values, std::vector<std::int64_t> shape) {
    auto holder = std::make_shared<std::vector<T>>(std::move(values));
    IndexArray a;
    a.dtype_ = index_dtype_of<T>();
    a.shape_ = std::move(shape);
    a.data_ = std::shared_ptr<const std::byte>(holder,
                                               reinterpret_cast<const std::byte*>(holder->data()));
    a.check_shape(static_cast<std::int64_t>(holder->size()));
    return a;
  }

  // Memory-maps a .npy file (format 1.0/2.0/3.0, little-endian, C order, one of IndexDType).
  // Throws DataError naming the file and what is wrong with it.
  static IndexArray map_npy(const std::string& path);

  IndexDType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const;
  bool empty() const { return data_ == nullptr; }

  // Element i of the flattened array, widened to int64.
  std::int64_t at(std::int64_t i) const;
  // Raw little-endian bytes (numel() * index_dtype_size(dtype())).
  const std::byte* bytes() const { return data_.get(); }

 private:
  void check_shape(std::int64_t numel) const;

  IndexDType dtype_ = IndexDType::kI32;
  std::vector<std::int64_t> shape_;
  std::shared_ptr<const std::byte> data_;
};

// Writes `a` as a .npy file byte-identical to numpy.save (format 1.0, header padded to 64 bytes
// with numpy's growth-axis spaces). Written under a temporary name and renamed, so a reader never
// sees a partial file. Throws DataError when the file cannot be written.
void write_npy(const std::string& path, const IndexArray& a);

// Writes text to path atomically (temporary file + rename). Throws DataError on failure.
void write_text_file(const std::string& path, std::string_view text);
// The whole file, or nullopt if it cannot be opened.
std::optional<std::string> read_text_file(const std::string& path);

// Lower-case hex MD5 digest (RFC 1321) of the bytes of s; Megatron's cache key is
// hashlib.md5(description.encode("utf-8")).hexdigest().
std::string md5_hex(std::string_view s);

// Python's json.dumps(value, indent=4) with the default ensure_ascii=True: the same separators,
// the same escapes (\uXXXX for every character outside ' '..'~'), and floats written as Python's
// repr (shortest round-trip, "1.0", "1e-05", "1e+16"). Strings are read as UTF-8; invalid bytes
// are written as Python's surrogateescape would (\udcXX).
std::string python_json_dumps(const nlohmann::ordered_json& value);

// numpy.sum of a float64 vector (numpy's pairwise summation, so sums of more than 8 weights
// round exactly as numpy's do).
double numpy_sum(const std::vector<double>& v);

}  // namespace trident::data
