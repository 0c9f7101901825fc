// Backend dispatch of embedding.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/embedding.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/embedding.h"

#include "trident/kernels/backend.h"

namespace trident::kernels {

void embedding_forward(const core::ExecContext& ctx, const EmbeddingForwardArgs& args) {
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).embedding_forward(ctx, args);
    case core::DeviceKind::kCuda:
      no_cuda_backend("embedding_forward");
  }
}

void embedding_backward(const core::ExecContext& ctx, const EmbeddingBackwardArgs& args) {
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).embedding_backward(ctx, args);
    case core::DeviceKind::kCuda:
      no_cuda_backend("embedding_backward");
  }
}

}  // namespace trident::kernels
