// Arena: owns one 64-byte-aligned allocation and hands out TensorViews from it (bump allocation).
// One arena per purpose (parameters, gradients, optimizer state, activations, workspace); each is
// sized from a table computed from the config before anything is allocated. The memory comes from
// a MemoryResource (core/memory.h): the host's, or a device's (kernels::memory_for), and the
// views it hands out are on that resource's device.
#pragma once

#include <cstdint>
#include <utility>

#include "trident/core/memory.h"
#include "trident/core/tensor.h"

namespace trident::core {

class Arena {
 public:
  static constexpr std::int64_t kAlign = 64;

  Arena() = default;
  // Allocates `capacity_bytes` (zero-filled) of host memory.
  explicit Arena(std::int64_t capacity_bytes) : Arena(capacity_bytes, host_memory()) {}
  // Allocates `capacity_bytes` from `memory` (zero-filled, in the resource's order).
  Arena(std::int64_t capacity_bytes, MemoryResource& memory);
  Arena(Arena&& o) noexcept { *this = std::move(o); }
  Arena& operator=(Arena&& o) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // A view of `shape` elements of `dtype`, aligned to kAlign. Throws InternalError when the arena
  // is too small (the size table was wrong).
  TensorView alloc(DType dtype, const Shape& shape);
  // Forget every allocation (the memory stays, contents are kept).
  void reset() { used_ = 0; }

  std::int64_t capacity() const { return capacity_; }
  std::int64_t used() const { return used_; }
  void* base() const { return data_; }
  Device device() const { return memory_ ? memory_->device() : Device{}; }

  // Bytes `shape` of `dtype` takes in an arena, padding included; for size tables.
  static std::int64_t footprint(DType dtype, const Shape& shape) {
    const std::int64_t b = shape.numel() * size_of(dtype);
    return (b + kAlign - 1) / kAlign * kAlign;
  }

 private:
  MemoryResource* memory_ = nullptr;
  void* data_ = nullptr;
  std::int64_t capacity_ = 0;
  std::int64_t used_ = 0;
};

}  // namespace trident::core
