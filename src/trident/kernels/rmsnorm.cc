// Backend dispatch of rmsnorm.h; CPU bodies in kernels/cpu/rmsnorm.cc, reference in kernels/ref/.
#include "trident/kernels/rmsnorm.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void rmsnorm_forward(const core::ExecContext& ctx, const RmsNormForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rmsnorm_forward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).rmsnorm_forward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::rmsnorm_forward(ctx, args);
#else
      no_cuda_backend("rmsnorm_forward");
#endif
  }
}

void rmsnorm_backward(const core::ExecContext& ctx, const RmsNormBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rmsnorm_backward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).rmsnorm_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::rmsnorm_backward(ctx, args);
#else
      no_cuda_backend("rmsnorm_backward");
#endif
  }
}

}  // namespace trident::kernels
