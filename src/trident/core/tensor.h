// Core vocabulary: dtypes, devices, shapes and non-owning tensor views.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>

#include "trident/core/bf16.h"
#include "trident/core/error.h"

namespace trident::core {

enum class DType : std::uint8_t { kF32, kBF16, kF16, kI32, kI64, kU16 };
enum class DeviceKind : std::uint8_t { kCpu, kCuda };

constexpr std::int64_t size_of(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU16:
      return 2;
  }
  return 0;
}
const char* dtype_name(DType t);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::kBF16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType dtype_of<std::uint16_t>() {
  return DType::kU16;
}

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};

// Up to 4 dimensions, row-major.
struct Shape {
  std::array<std::int64_t, 4> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d) {
    TRIDENT_ASSERT(d.size() <= 4, "Shape supports at most 4 dims, got ", d.size());
    for (std::int64_t v : d) dims[static_cast<std::size_t>(rank++)] = v;
  }
  std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[static_cast<std::size_t>(i)];
    return n;
  }
  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i)
      if (a[i] != b[i]) return false;
    return true;
  }
};
std::ostream& operator<<(std::ostream& os, const Shape& s);
std::string to_string(const Shape& s);

// Non-owning view of contiguous, row-major memory. Storage belongs to an Arena (or a caller).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device{};
  Shape shape{};

  std::int64_t numel() const { return shape.numel(); }
  std::int64_t bytes() const { return numel() * size_of(dtype); }
  bool empty() const { return data == nullptr; }

  template <class T>
  T* as() const {
    TRIDENT_ASSERT(dtype_of<T>() == dtype, "TensorView::as: view holds ", dtype_name(dtype),
                   ", asked for ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(data);
  }
};

}  // namespace trident::core
