// Backend dispatch of layernorm.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/layernorm.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/layernorm.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void layernorm_forward(const core::ExecContext& ctx, const LayerNormForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "layernorm_forward", 0,
                                  4.0 * 2 * args.rows * args.cols);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).layernorm_forward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::layernorm_forward(ctx, args);
#else
      no_cuda_backend("layernorm_forward");
#endif
  }
}

void layernorm_backward(const core::ExecContext& ctx, const LayerNormBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "layernorm_backward", 0,
                                  4.0 * 3 * args.rows * args.cols);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).layernorm_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::layernorm_backward(ctx, args);
#else
      no_cuda_backend("layernorm_backward");
#endif
  }
}

}  // namespace trident::kernels
