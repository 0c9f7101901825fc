// CPU fused Lion: one pass over param, m and grad (bandwidth-bound), OpenMP + SIMD.
// See lion.h for the update rule (lion-pytorch semantics).
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void lion_update(const ExecContext& ctx, const LionHyper& hp, const LionArgs& args) {
  if (args.n == 0) return;  // the dispatch (kernels/lion.cc) checked the arguments
  const float decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  const float lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  const float grad_scale = hp.grad_scale;
  float* p = args.param;
  float* m = args.m;
  const float* grad = args.grad;
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = 0; i < args.n; ++i) {
    const float g = grad[i] * grad_scale;
    const float c = b1 * m[i] + one_minus_b1 * g;
    // sign(c), 0 at 0 (as torch.sign), without a branch.
    const float s = static_cast<float>(c > 0.0f) - static_cast<float>(c < 0.0f);
    p[i] = p[i] * decay - lr * s;
    m[i] = b2 * m[i] + one_minus_b2 * g;
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
