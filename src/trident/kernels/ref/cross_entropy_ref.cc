// Reference softmax cross-entropy with gradient over a padded vocabulary: double, one thread.
#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/kernels/cross_entropy.h"

namespace trident::kernels::ref {
// Over the real columns c < V only (padding columns [V, Vp) are -inf):
//   lse = max + log sum_c exp(x_c - max),   loss = lse - x_target,
//   d_logits_c = d_scale * (exp(x_c - lse) - [c == target])   (c < V),   0 on padding.
// A negative target is ignored: loss 0, gradient row 0. A target >= V is a bug.
template <class T>
void cross_entropy_forward_backward(const BasicCrossEntropyArgs<T>& a) {
  const std::int64_t V = a.vocab, Vp = a.vocab_padded;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* x = a.logits + r * Vp;
    T* dx = a.d_logits ? a.d_logits + r * Vp : nullptr;  // may alias x: read x[c] before dx[c]
    const std::int32_t target = a.targets[r];
    TRIDENT_ASSERT(target < V, "ref::cross_entropy_forward_backward: targets[", r, "] = ", target,
                   " is outside the real vocabulary [0, ", V, ")");
    if (target < 0) {
      a.losses[r] = T(0);
      if (dx) std::fill(dx, dx + Vp, T(0));
      continue;
    }
    double max = x[0];
    for (std::int64_t c = 1; c < V; ++c) max = std::max(max, static_cast<double>(x[c]));
    double sum = 0.0;
    for (std::int64_t c = 0; c < V; ++c) sum += std::exp(x[c] - max);
    const double lse = max + std::log(sum);
    const double x_target = x[target];
    a.losses[r] = static_cast<T>(lse - x_target);
    if (!dx) continue;
    for (std::int64_t c = 0; c < Vp; ++c) {
      const double onehot = c == target ? 1.0 : 0.0;
      dx[c] = c < V ? static_cast<T>(a.d_scale * (std::exp(x[c] - lse) - onehot)) : T(0);
    }
  }
}

template void cross_entropy_forward_backward<float>(const BasicCrossEntropyArgs<float>&);
template void cross_entropy_forward_backward<double>(const BasicCrossEntropyArgs<double>&);

}  // namespace trident::kernels::ref
