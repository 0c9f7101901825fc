// Backend dispatch of cross_entropy.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/cross_entropy.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/cross_entropy.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void cross_entropy_forward_backward(const core::ExecContext& ctx, const CrossEntropyArgs& args) {
  const core::profile::Scope prof(
      core::profile::Kind::kLoss, "cross_entropy_forward_backward", 0,
      4.0 * (args.d_logits != nullptr ? 2 : 1) * args.rows * args.vocab_padded);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).cross_entropy_forward_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::cross_entropy_forward_backward(ctx, args);
#else
      no_cuda_backend("cross_entropy_forward_backward");
#endif
  }
}

}  // namespace trident::kernels
