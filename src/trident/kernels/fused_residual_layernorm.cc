// Backend dispatch of fused_residual_layernorm.h: one switch on the device per op; the CPU bodies
// are in kernels/cpu/fused_residual_layernorm.cc (one per instruction-set variant), the reference
// in kernels/ref/.
#include "trident/kernels/fused_residual_layernorm.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif
#include "trident/kernels/row_partials.h"

namespace trident::kernels {

std::int64_t residual_layernorm_backward_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0,
                "residual_layernorm_backward_scratch_bytes: need rows >= 0 and cols > 0, got rows=",
                rows, " cols=", cols);
  return detail::num_row_chunks(rows) * 2 * cols * static_cast<std::int64_t>(sizeof(double));
}

void residual_layernorm_forward(const core::ExecContext& ctx,
                                const ResidualLayerNormForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "residual_layernorm_forward", 0,
                                  4.0 * 4 * args.rows * args.cols);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).residual_layernorm_forward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::residual_layernorm_forward(ctx, args);
#else
      no_cuda_backend("residual_layernorm_forward");
#endif
  }
}

void residual_layernorm_backward(const core::ExecContext& ctx,
                                 const ResidualLayerNormBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "residual_layernorm_backward", 0,
                                  4.0 * 4 * args.rows * args.cols);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).residual_layernorm_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::residual_layernorm_backward(ctx, args);
#else
      no_cuda_backend("residual_layernorm_backward");
#endif
  }
}

}  // namespace trident::kernels
