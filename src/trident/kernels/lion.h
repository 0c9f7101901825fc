// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), as lion-pytorch and
// DeepSpeed's FusedLion:
//   g  = grad * grad_scale
//   p *= 1 - lr * weight_decay                                   (decoupled decay)
//   p -= lr * sign(beta1 m + (1 - beta1) g)                      (sign(0) = 0)
//   m  = beta2 m + (1 - beta2) g
// One state array (the momentum m); one fused pass over flat buffers (bandwidth-bound).
//
// Callers use the typed views (LionViews): three f32 (n) views on ctx.device; a mismatch is a
// core::InvalidArgument naming the view. LionArgs is the backend contract the CPU body, the CUDA
// body and the reference implement.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct LionHyper {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;  // e.g. the clipping coefficient
};

struct LionArgs {
  float* param = nullptr;       // (n) updated in place
  float* m = nullptr;           // (n) updated in place
  const float* grad = nullptr;  // (n)
  std::int64_t n = 0;
};

// lion_update over typed views; n is read from `param`.
struct LionViews {
  core::TensorView param{};  // (n) f32, updated in place
  core::TensorView m{};      // (n) f32, updated in place
  core::TensorView grad{};   // (n) f32
};
void lion_update(const core::ExecContext& ctx, const LionHyper& hp, const LionViews& views);

namespace ref {
// The specification (ref/lion_ref.cc): the update in double, one element at a time.
void lion_update(const LionHyper& hp, const LionArgs& args);
}  // namespace ref

}  // namespace trident::kernels
