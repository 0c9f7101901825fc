// Backend dispatch of dropout.h; the CPU bodies are in kernels/cpu/dropout.cc (one per
// instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/dropout.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void hidden_dropout(const core::ExecContext& ctx, const HiddenDropoutArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "hidden_dropout");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).hidden_dropout(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::hidden_dropout(ctx, args);
#else
      no_cuda_backend("hidden_dropout");
#endif
  }
}

}  // namespace trident::kernels
