// Reference grouped linear layer (grouped_linear.h): the linear layer's reference on each group.
#include <type_traits>

#include "trident/kernels/grouped_linear.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"

namespace trident::kernels::ref {

template <class T>
void grouped_linear_forward(const BasicGroupedLinearForwardArgs<T>& a) {
  const std::int64_t in = a.in_features, out = a.out_features;
  for (std::int64_t g = 0; g < a.num_groups; ++g) {
    const RowGroup r = a.groups[g];
    if (r.rows == 0) continue;
    if constexpr (std::is_same_v<T, float>) {
      linear_forward({.out = a.out + r.first * out,
                      .in = a.in + r.first * in,
                      .weight = a.weight + g * out * in,
                      .rows = r.rows,
                      .in_features = in,
                      .out_features = out});
    } else {
      linear_forward_bf16({.out = a.out + r.first * out,
                           .in = a.in + r.first * in,
                           .weight = a.weight + g * out * in,
                           .rows = r.rows,
                           .in_features = in,
                           .out_features = out});
    }
  }
}

template <class T>
void grouped_linear_backward(const BasicGroupedLinearBackwardArgs<T>& a) {
  const std::int64_t in = a.in_features, out = a.out_features;
  for (std::int64_t g = 0; g < a.num_groups; ++g) {
    const RowGroup r = a.groups[g];
    if (r.rows == 0) continue;
    float* d_in = a.d_in != nullptr ? a.d_in + r.first * in : nullptr;
    if constexpr (std::is_same_v<T, float>) {
      linear_backward({.d_in = d_in,
                       .d_weight = a.d_weight + g * out * in,
                       .d_out = a.d_out + r.first * out,
                       .in = a.in + r.first * in,
                       .weight = a.weight + g * out * in,
                       .rows = r.rows,
                       .in_features = in,
                       .out_features = out});
    } else {
      linear_backward_bf16({.d_in = d_in,
                            .d_weight = a.d_weight + g * out * in,
                            .d_out_bf16 = a.d_out + r.first * out,
                            .in = a.in + r.first * in,
                            .weight = a.weight + g * out * in,
                            .rows = r.rows,
                            .in_features = in,
                            .out_features = out});
    }
  }
}

template void grouped_linear_forward<float>(const GroupedLinearForwardArgs&);
template void grouped_linear_forward<core::bf16>(const GroupedLinearForwardBf16Args&);
template void grouped_linear_backward<float>(const GroupedLinearBackwardArgs&);
template void grouped_linear_backward<core::bf16>(const GroupedLinearBackwardBf16Args&);

}  // namespace trident::kernels::ref
