// Arena: owns one 64-byte-aligned allocation and hands out TensorViews from it (bump allocation).
// One arena per purpose (parameters, gradients, optimizer state, activations, workspace); each is
// sized from a table computed from the config before anything is allocated.
#pragma once

#include <cstdint>
#include <memory>

#include "trident/core/tensor.h"

namespace trident::core {

class Arena {
 public:
  static constexpr std::int64_t kAlign = 64;

  Arena() = default;
  // Allocates `capacity_bytes` (zero-filled) on `device`. CPU only for now.
  explicit Arena(std::int64_t capacity_bytes, Device device = {});

  // A view of `shape` elements of `dtype`, aligned to kAlign. Throws InternalError when the arena
  // is too small (the size table was wrong).
  TensorView alloc(DType dtype, const Shape& shape);
  // Forget every allocation (the memory stays, contents are kept).
  void reset() { used_ = 0; }

  std::int64_t capacity() const { return capacity_; }
  std::int64_t used() const { return used_; }
  void* base() const { return data_.get(); }

  // Bytes `shape` of `dtype` takes in an arena, padding included; for size tables.
  static std::int64_t footprint(DType dtype, const Shape& shape) {
    const std::int64_t b = shape.numel() * size_of(dtype);
    return (b + kAlign - 1) / kAlign * kAlign;
  }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  std::int64_t capacity_ = 0;
  std::int64_t used_ = 0;
  Device device_{};
};

}  // namespace trident::core
