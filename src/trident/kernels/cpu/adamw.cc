// CPU fused AdamW: one pass over param, m, v and grad (bandwidth-bound), OpenMP + SIMD.
// See adamw.h for the update rule (torch.optim.AdamW semantics).
#include <cmath>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void adamw_update(const core::ExecContext& ctx, const AdamWHyper& hp, const AdamWArgs& args) {
  TRIDENT_CHECK(args.n >= 0, "adamw_update: n must be >= 0, got ", args.n);
  TRIDENT_CHECK(hp.step >= 1, "adamw_update: step is 1-based, got ", hp.step);
  TRIDENT_CHECK(hp.beta1 >= 0.0f && hp.beta1 < 1.0f && hp.beta2 >= 0.0f && hp.beta2 < 1.0f,
                "adamw_update: betas must be in [0, 1), got beta1=", hp.beta1, " beta2=", hp.beta2);
  TRIDENT_CHECK(hp.lr >= 0.0f && hp.eps >= 0.0f && hp.weight_decay >= 0.0f,
                "adamw_update: lr, eps and weight_decay must be >= 0, got lr=", hp.lr,
                " eps=", hp.eps, " weight_decay=", hp.weight_decay);
  if (args.n == 0) return;
  TRIDENT_CHECK(args.param && args.m && args.v && args.grad,
                "adamw_update: param, m, v and grad must be non-null");
  // Scalars in double once, as torch does: step_size = lr / (1 - beta1^t) and
  // 1 / sqrt(1 - beta2^t), so mhat / (sqrt(vhat) + eps) = m/bc1 / (sqrt(v)/sqrt(bc2) + eps).
  const double t = static_cast<double>(hp.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), t);
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  const float b1 = hp.beta1, b2 = hp.beta2;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  const float eps = hp.eps, grad_scale = hp.grad_scale;
  float* p = args.param;
  float* m = args.m;
  float* v = args.v;
  const float* grad = args.grad;
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = 0; i < args.n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float decayed = p[i] * decay;  // decoupled weight decay, before the Adam step
    p[i] = decayed - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
