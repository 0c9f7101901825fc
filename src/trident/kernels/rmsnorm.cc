// Backend dispatch of rmsnorm.h; CPU bodies in kernels/cpu/rmsnorm.cc, reference in kernels/ref/.
#include "trident/kernels/rmsnorm.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"

namespace trident::kernels {

void rmsnorm_forward(const core::ExecContext& ctx, const RmsNormForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rmsnorm_forward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).rmsnorm_forward(ctx, args);
    case core::DeviceKind::kCuda:
      no_cuda_backend("rmsnorm_forward");
  }
}

void rmsnorm_backward(const core::ExecContext& ctx, const RmsNormBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rmsnorm_backward");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).rmsnorm_backward(ctx, args);
    case core::DeviceKind::kCuda:
      no_cuda_backend("rmsnorm_backward");
  }
}

}  // namespace trident::kernels
