// LayerNorm over the last dimension: out = (x - mean) * rstd * weight + bias, with the population
// variance and rstd = 1 / sqrt(var + eps).
//
// Callers use the typed views (LayerNormViews, at the end): every view f32, contiguous, on
// ctx.device, with the shapes given; a mismatch is a core::InvalidArgument naming the view. The
// raw-pointer Args structs are the backend contract the CPU bodies (kernels/cpu), the CUDA bodies
// (kernels/cuda) and the reference (kernels/ref) implement.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

// Overwrites out, mean and rstd; mean and rstd are saved for the backward pass.
template <class T>
struct BasicLayerNormForwardArgs {
  T* out = nullptr;           // (rows, cols)  written (=)
  T* mean = nullptr;          // (rows)        written (=)
  T* rstd = nullptr;          // (rows)        written (=)
  const T* in = nullptr;      // (rows, cols)
  const T* weight = nullptr;  // (cols)
  const T* bias = nullptr;    // (cols)
  std::int64_t rows = 0, cols = 0;
  T eps = T(1e-5);
};
using LayerNormForwardArgs = BasicLayerNormForwardArgs<float>;

// ACCUMULATES into d_in (+=): LayerNorm inputs sit on the residual stream, whose gradient is
// already in d_in. Accumulates into d_weight and d_bias (+=) for micro-batch accumulation.
template <class T>
struct BasicLayerNormBackwardArgs {
  T* d_in = nullptr;          // (rows, cols)  accumulated (+=)
  T* d_weight = nullptr;      // (cols)        accumulated (+=)
  T* d_bias = nullptr;        // (cols)        accumulated (+=)
  const T* d_out = nullptr;   // (rows, cols)
  const T* in = nullptr;      // (rows, cols)
  const T* weight = nullptr;  // (cols)
  const T* mean = nullptr;    // (rows)
  const T* rstd = nullptr;    // (rows)
  std::int64_t rows = 0, cols = 0;
};
using LayerNormBackwardArgs = BasicLayerNormBackwardArgs<float>;

// layernorm_forward over typed views; rows and cols are read from `in`.
struct LayerNormViews {
  core::TensorView out{};     // (rows, cols) f32, written (=)
  core::TensorView mean{};    // (rows)       f32, written (=)
  core::TensorView rstd{};    // (rows)       f32, written (=)
  core::TensorView in{};      // (rows, cols) f32
  core::TensorView weight{};  // (cols)       f32
  core::TensorView bias{};    // (cols)       f32
  float eps = 1e-5f;
};
void layernorm(const core::ExecContext& ctx, const LayerNormViews& v);

// layernorm_backward over typed views (d_in, d_weight, d_bias accumulate +=); sizes from `in`.
struct LayerNormBackwardViews {
  core::TensorView d_in{};      // (rows, cols) f32, accumulated (+=)
  core::TensorView d_weight{};  // (cols)       f32, accumulated (+=)
  core::TensorView d_bias{};    // (cols)       f32, accumulated (+=)
  core::TensorView d_out{};     // (rows, cols) f32
  core::TensorView in{};        // (rows, cols) f32
  core::TensorView weight{};    // (cols)       f32
  core::TensorView mean{};      // (rows)       f32, from the forward
  core::TensorView rstd{};      // (rows)       f32, from the forward
};
void layernorm_backward(const core::ExecContext& ctx, const LayerNormBackwardViews& v);

namespace ref {
// The specification (ref/layernorm_ref.cc), over the element type T (docs/architecture.md, "How to
// add an op").
template <class T = float>
void layernorm_forward(const BasicLayerNormForwardArgs<T>& args);
template <class T = float>
void layernorm_backward(const BasicLayerNormBackwardArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
