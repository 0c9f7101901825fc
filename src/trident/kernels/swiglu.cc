// Backend dispatch of swiglu.h; CPU bodies in kernels/cpu/swiglu.cc, reference in kernels/ref/.
#include "trident/kernels/swiglu.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void swiglu_forward(const core::ExecContext& ctx, const SwiGluForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "swiglu_forward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).swiglu_forward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::swiglu_forward(ctx, args);
#else
      no_cuda_backend("swiglu_forward");
#endif
  }
}

void swiglu_backward(const core::ExecContext& ctx, const SwiGluBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "swiglu_backward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).swiglu_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::swiglu_backward(ctx, args);
#else
      no_cuda_backend("swiglu_backward");
#endif
  }
}

}  // namespace trident::kernels
