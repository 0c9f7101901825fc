// Backend dispatch of attention.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/attention.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/attention.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void attention_forward(const core::ExecContext& ctx, const AttentionForwardArgs& args) {
  const core::profile::Scope prof(
      core::profile::Kind::kAttention, "attention_forward",
      2.0 * args.batch * args.seq_len * args.seq_len * args.num_heads * args.head_dim, 0);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).attention_forward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      // The CUDA kernel has no document masks (--reset-attention-mask).
      if (args.doc) no_cuda_backend("attention_forward with document ids");
      return cuda::attention_forward(ctx, args);
#else
      no_cuda_backend("attention_forward");
#endif
  }
}

void attention_backward(const core::ExecContext& ctx, const AttentionBackwardArgs& args) {
  const core::profile::Scope prof(
      core::profile::Kind::kAttention, "attention_backward",
      4.0 * args.batch * args.seq_len * args.seq_len * args.num_heads * args.head_dim, 0);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).attention_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::attention_backward(ctx, args);
#else
      no_cuda_backend("attention_backward");
#endif
  }
}

}  // namespace trident::kernels
