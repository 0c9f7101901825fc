// ExecContext: where kernels run. Every kernel takes it first. CPU: OpenMP threads; CUDA (later):
// the device and stream.
#pragma once

#include "trident/core/tensor.h"

namespace trident::core {

struct ExecContext {
  Device device{};
  int num_threads = 0;  // 0 = OpenMP's default

  static ExecContext cpu() { return {}; }
};

// Kernels call this to reject devices they have no implementation for.
inline void require_cpu(const ExecContext& ctx, const char* op) {
  if (ctx.device.kind != DeviceKind::kCpu) {
    throw Unavailable(str(op, ": this build has no CUDA kernels (build with the CUDA toolkit)"));
  }
}

}  // namespace trident::core
