// Reference AdamW step (torch.optim.AdamW semantics) in double, one thread.
#include <cmath>

#include "trident/kernels/adamw.h"

namespace trident::kernels::ref {

//   g = grad * grad_scale
//   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
//   p = p - lr * weight_decay * p                                   (decoupled decay, first)
//   p = p - lr * mhat / (sqrt(vhat) + eps),  mhat = m / (1 - beta1^t),  vhat = v / (1 - beta2^t)
void adamw_update(const AdamWHyper& hp, const AdamWArgs& a) {
  const double t = static_cast<double>(hp.step);
  const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
  const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  for (std::int64_t i = 0; i < a.n; ++i) {
    const double g = static_cast<double>(a.grad[i]) * hp.grad_scale;
    const double m = b1 * a.m[i] + (1.0 - b1) * g;
    const double v = b2 * a.v[i] + (1.0 - b2) * g * g;
    double p = a.param[i];
    p -= lr * hp.weight_decay * p;
    p -= lr * (m / bc1) / (std::sqrt(v / bc2) + hp.eps);
    a.m[i] = static_cast<float>(m);
    a.v[i] = static_cast<float>(v);
    a.param[i] = static_cast<float>(p);
  }
}

}  // namespace trident::kernels::ref
