// Reference Lion step (lion-pytorch semantics) in double, one thread.
#include "trident/kernels/lion.h"

namespace trident::kernels::ref {

//   g = grad * grad_scale
//   p = p (1 - lr weight_decay) - lr sign(beta1 m + (1 - beta1) g),   sign(0) = 0
//   m = beta2 m + (1 - beta2) g
void lion_update(const LionHyper& hp, const LionArgs& a) {
  const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
  for (std::int64_t i = 0; i < a.n; ++i) {
    const double g = static_cast<double>(a.grad[i]) * hp.grad_scale;
    const double c = b1 * a.m[i] + (1.0 - b1) * g;
    const double s = c > 0.0 ? 1.0 : (c < 0.0 ? -1.0 : 0.0);
    a.param[i] = static_cast<float>(a.param[i] * (1.0 - lr * hp.weight_decay) - lr * s);
    a.m[i] = static_cast<float>(b2 * a.m[i] + (1.0 - b2) * g);
  }
}

}  // namespace trident::kernels::ref
