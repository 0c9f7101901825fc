// Backend dispatch of fused_bias_gelu.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/fused_bias_gelu.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/fused_bias_gelu.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif
#include "trident/kernels/row_partials.h"

namespace trident::kernels {

std::int64_t bias_gelu_backward_scratch_bytes(std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0,
                "bias_gelu_backward_scratch_bytes: need rows >= 0 and cols > 0, got rows=", rows,
                " cols=", cols);
  return detail::num_row_chunks(rows) * cols * static_cast<std::int64_t>(sizeof(double));
}

void bias_gelu_forward(const core::ExecContext& ctx, const BiasGeluForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "bias_gelu_forward", 0,
                                  4.0 * 2 * args.rows * args.cols);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).bias_gelu_forward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::bias_gelu_forward(ctx, args);
#else
      no_cuda_backend("bias_gelu_forward");
#endif
  }
}

void bias_gelu_backward(const core::ExecContext& ctx, const BiasGeluBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "bias_gelu_backward", 0,
                                  4.0 * 3 * args.rows * args.cols);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).bias_gelu_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::bias_gelu_backward(ctx, args);
#else
      no_cuda_backend("bias_gelu_backward");
#endif
  }
}

}  // namespace trident::kernels
