// Backend dispatch of fill.h; the CPU bodies are in kernels/cpu/fill.cc (one per instruction-set
// variant), the reference in kernels/ref/fill_ref.cc.
#include "trident/kernels/fill.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void fill(const core::ExecContext& ctx, const FillArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "fill");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).fill(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::fill(ctx, args);
#else
      no_cuda_backend("fill");
#endif
  }
}

void copy(const core::ExecContext& ctx, const CopyArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "copy");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).copy(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::copy(ctx, args);
#else
      no_cuda_backend("copy");
#endif
  }
}

}  // namespace trident::kernels
