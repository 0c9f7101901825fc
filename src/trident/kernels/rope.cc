// Backend dispatch of rope.h; CPU bodies in kernels/cpu/rope.cc, reference in kernels/ref/.
#include "trident/kernels/rope.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void rope_qkv_forward(const core::ExecContext& ctx, const RopeQkvForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rope_qkv_forward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).rope_qkv_forward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::rope_qkv_forward(ctx, args);
#else
      no_cuda_backend("rope_qkv_forward");
#endif
  }
}

void rope_qkv_backward(const core::ExecContext& ctx, const RopeQkvBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rope_qkv_backward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).rope_qkv_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::rope_qkv_backward(ctx, args);
#else
      no_cuda_backend("rope_qkv_backward");
#endif
  }
}

}  // namespace trident::kernels
