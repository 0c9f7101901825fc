// Backend dispatch of embedding.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/embedding.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/embedding.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void embedding_forward(const core::ExecContext& ctx, const EmbeddingForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "embedding_forward", 0,
                                  4.0 * 3 * args.batch * args.seq_len * args.hidden);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).embedding_forward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      // The CUDA kernel has no per-row position ids (--reset-position-ids).
      if (args.positions) no_cuda_backend("embedding_forward with position ids");
      return cuda::embedding_forward(ctx, args);
#else
      no_cuda_backend("embedding_forward");
#endif
  }
}

void embedding_backward(const core::ExecContext& ctx, const EmbeddingBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "embedding_backward", 0,
                                  4.0 * 3 * args.batch * args.seq_len * args.hidden);
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).embedding_backward(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      // The CUDA kernel has no per-row position ids (--reset-position-ids).
      if (args.positions) no_cuda_backend("embedding_backward with position ids");
      return cuda::embedding_backward(ctx, args);
#else
      no_cuda_backend("embedding_backward");
#endif
  }
}

}  // namespace trident::kernels
