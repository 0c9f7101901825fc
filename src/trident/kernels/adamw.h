// AdamW (Loshchilov & Hutter), as torch.optim.AdamW:
//   g  = grad * grad_scale
//   m  = beta1 m + (1 - beta1) g
//   v  = beta2 v + (1 - beta2) g^2
//   p -= lr * weight_decay * p                               (decoupled decay)
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// One fused pass over flat buffers (bandwidth-bound).
//
// Callers use the typed views (AdamWViews, below): four f32 (n) views on ctx.device; a mismatch is
// a core::InvalidArgument naming the view. AdamWArgs is the backend contract the CPU body, the CUDA
// body and the reference implement.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct AdamWHyper {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t step = 1;    // 1-based, for bias correction
  float grad_scale = 1.0f;  // e.g. the clipping coefficient
};

struct AdamWArgs {
  float* param = nullptr;       // (n) updated in place
  float* m = nullptr;           // (n) updated in place
  float* v = nullptr;           // (n) updated in place
  const float* grad = nullptr;  // (n)
  std::int64_t n = 0;
};

// adamw_update over typed views; n is read from `param`.
struct AdamWViews {
  core::TensorView param{};  // (n) f32, updated in place
  core::TensorView m{};      // (n) f32, updated in place
  core::TensorView v{};      // (n) f32, updated in place
  core::TensorView grad{};   // (n) f32
};
void adamw_update(const core::ExecContext& ctx, const AdamWHyper& hp, const AdamWViews& views);

namespace ref {
// The specification (ref/adamw_ref.cc): the update in double, one element at a time.
void adamw_update(const AdamWHyper& hp, const AdamWArgs& args);
}  // namespace ref

}  // namespace trident::kernels
