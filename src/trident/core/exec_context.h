// ExecContext: where kernels run. Every kernel takes it first and dispatches on it (see
// kernels/backend.h): the device (CPU or a CUDA device), the CPU instruction-set variant and thread
// count, and for GPU backends the stream the kernel is queued on.
#pragma once

#include <cstdint>

#include "trident/core/tensor.h"
#include "trident/core/workspace.h"

namespace trident::core {

// The CPU kernels' instruction-set variants (kernels/cpu/cpu_ops.h). kAuto: the widest variant the
// processor runs, chosen at run time; the others pin one (tests run every variant the processor
// has; asking for one it lacks is an error).
enum class CpuIsa : std::uint8_t { kAuto, kX86_64, kAvx2, kAvx512 };

struct ExecContext {
  Device device{};
  int num_threads = 0;             // CPU: threads a kernel uses; 0 = OpenMP's default
  CpuIsa cpu_isa = CpuIsa::kAuto;  // CPU: instruction-set variant
  void* stream = nullptr;          // CUDA: the cudaStream_t kernels are queued on (null: default)
  // Kernels' scratch (core/workspace.h), owned by the context's owner; null: the calling thread's
  // own (workspace()).
  Workspace* workspace = nullptr;

  static ExecContext cpu() { return {}; }
  // The workspace kernels use: `workspace`, or one of the calling thread's own, kept for the
  // thread's lifetime (so a context without one still allocates only while warming up).
  Workspace& scratch() const;
};

}  // namespace trident::core
