// Backend dispatch of vocab_parallel_cross_entropy.h; the CPU bodies are in
// kernels/cpu/vocab_parallel_cross_entropy.cc (one per instruction-set variant), the reference in
// kernels/ref/.
#include "trident/kernels/vocab_parallel_cross_entropy.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void vocab_parallel_ce_max(const core::ExecContext& ctx, const VocabParallelCeMaxArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kLoss, "vocab_parallel_ce_max");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).vocab_parallel_ce_max(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::vocab_parallel_ce_max(ctx, args);
#else
      no_cuda_backend("vocab_parallel_ce_max");
#endif
  }
}

void vocab_parallel_ce_sum_target(const core::ExecContext& ctx,
                                  const VocabParallelCeSumArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kLoss, "vocab_parallel_ce_sum_target");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).vocab_parallel_ce_sum_target(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::vocab_parallel_ce_sum_target(ctx, args);
#else
      no_cuda_backend("vocab_parallel_ce_sum_target");
#endif
  }
}

void vocab_parallel_ce_loss(const core::ExecContext& ctx, const VocabParallelCeLossArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kLoss, "vocab_parallel_ce_loss");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).vocab_parallel_ce_loss(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::vocab_parallel_ce_loss(ctx, args);
#else
      no_cuda_backend("vocab_parallel_ce_loss");
#endif
  }
}

TokenLossSum sum_token_losses(const core::ExecContext& ctx, const float* losses,
                              const std::int32_t* targets, std::int64_t rows) {
  const core::profile::Scope prof(core::profile::Kind::kLoss, "sum_token_losses");
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).sum_token_losses(ctx, losses, targets, rows);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::sum_token_losses(ctx, losses, targets, rows);
#else
      no_cuda_backend("sum_token_losses");
#endif
  }
  unknown_device("sum_token_losses");
}

}  // namespace trident::kernels
