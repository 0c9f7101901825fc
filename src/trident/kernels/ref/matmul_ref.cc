// Reference gemm and linear layer: plain loops, double accumulation, one thread.
#include <algorithm>
#include <vector>

#include "trident/kernels/matmul.h"

namespace trident::kernels::ref {

// C[i,j] = alpha * sum_k opA[i,k] opB[k,j] + beta * C[i,j], with opA[i,k] = A[i*lda + k]
// (or A[k*lda + i] when transposed) and likewise for B. beta == 0 ignores C's old contents.
void gemm(const GemmArgs& g) {
  const bool ta = g.trans_a == Trans::kYes, tb = g.trans_b == Trans::kYes;
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t j = 0; j < g.n; ++j) {
      double acc = 0.0;
      for (std::int64_t k = 0; k < g.k; ++k) {
        const double a = ta ? g.a[k * g.lda + i] : g.a[i * g.lda + k];
        const double b = tb ? g.b[j * g.ldb + k] : g.b[k * g.ldb + j];
        acc += a * b;
      }
      float& c = g.c[i * g.ldc + j];
      const double old = g.beta == 0.0f ? 0.0 : static_cast<double>(g.beta) * c;
      c = static_cast<float>(static_cast<double>(g.alpha) * acc + old);
    }
  }
}

// out[r,o] = bias[o] + sum_i in[r,i] * weight[o,i]
template <class T>
void linear_forward(const BasicLinearForwardArgs<T>& a) {
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* x = a.in + r * a.in_features;
    for (std::int64_t o = 0; o < a.out_features; ++o) {
      const T* w = a.weight + o * a.in_features;
      double acc = a.bias ? static_cast<double>(a.bias[o]) : 0.0;
      for (std::int64_t i = 0; i < a.in_features; ++i) acc += static_cast<double>(x[i]) * w[i];
      a.out[r * a.out_features + o] = static_cast<T>(acc);
    }
  }
}

// With y = x W^T + b and upstream gradient dy:
//   d_in[r,i]     =  sum_o dy[r,o] W[o,i]
//   d_weight[o,i] += sum_r dy[r,o] x[r,i]
//   d_bias[o]     += sum_r dy[r,o]
// (The sums run in an order that keeps each output's accumulator in a double row buffer.)
template <class T>
void linear_backward(const BasicLinearBackwardArgs<T>& a) {
  const std::int64_t I = a.in_features, O = a.out_features;
  if (a.d_in) {
    std::vector<double> acc(I);
    for (std::int64_t r = 0; r < a.rows; ++r) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t o = 0; o < O; ++o) {
        const double g = a.d_out[r * O + o];
        const T* w = a.weight + o * I;
        for (std::int64_t i = 0; i < I; ++i) acc[i] += g * w[i];
      }
      for (std::int64_t i = 0; i < I; ++i) a.d_in[r * I + i] = static_cast<T>(acc[i]);
    }
  }
  std::vector<double> acc(I);
  for (std::int64_t o = 0; o < O; ++o) {
    std::fill(acc.begin(), acc.end(), 0.0);
    double acc_b = 0.0;
    for (std::int64_t r = 0; r < a.rows; ++r) {
      const double g = a.d_out[r * O + o];
      const T* x = a.in + r * I;
      for (std::int64_t i = 0; i < I; ++i) acc[i] += g * x[i];
      acc_b += g;
    }
    for (std::int64_t i = 0; i < I; ++i) {
      a.d_weight[o * I + i] = static_cast<T>(a.d_weight[o * I + i] + acc[i]);
    }
    if (a.d_bias) a.d_bias[o] = static_cast<T>(a.d_bias[o] + acc_b);
  }
}

template void linear_forward<float>(const BasicLinearForwardArgs<float>&);
template void linear_forward<double>(const BasicLinearForwardArgs<double>&);
template void linear_backward<float>(const BasicLinearBackwardArgs<float>&);
template void linear_backward<double>(const BasicLinearBackwardArgs<double>&);

}  // namespace trident::kernels::ref
