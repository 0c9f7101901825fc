// MemoryResource: where an Arena's memory comes from. core cannot call a device runtime (the
// module order puts kernels/ above it), so a device's resource is handed in:
// kernels::memory_for(ctx) (kernels/memory.h) gives the host's or a CUDA device's. The host's is
// here.
#pragma once

#include <cstdint>

#include "trident/core/tensor.h"

namespace trident::core {

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  // `bytes` of memory on device(), aligned to at least 64 bytes; throws on failure (naming the
  // size and what to do).
  virtual void* allocate(std::int64_t bytes) = 0;
  virtual void deallocate(void* p, std::int64_t bytes) noexcept = 0;
  // Fills [p, p + bytes) with zero bytes, ordered before later work on the resource's device
  // (a device resource queues it on its stream).
  virtual void zero(void* p, std::int64_t bytes) = 0;
  virtual Device device() const = 0;
};

// The host's memory (aligned_alloc, memset).
MemoryResource& host_memory();

}  // namespace trident::core
