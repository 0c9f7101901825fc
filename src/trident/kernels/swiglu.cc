// Backend dispatch of swiglu.h; CPU bodies in kernels/cpu/swiglu.cc, reference in kernels/ref/.
#include "trident/kernels/swiglu.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"

namespace trident::kernels {

void swiglu_forward(const core::ExecContext& ctx, const SwiGluForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "swiglu_forward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).swiglu_forward(ctx, args);
    case core::DeviceKind::kCuda:
      no_cuda_backend("swiglu_forward");
  }
}

void swiglu_backward(const core::ExecContext& ctx, const SwiGluBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "swiglu_backward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).swiglu_backward(ctx, args);
    case core::DeviceKind::kCuda:
      no_cuda_backend("swiglu_backward");
  }
}

}  // namespace trident::kernels
