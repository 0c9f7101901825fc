// Overflow count for loss-scaled (FP16) training: the number of elements that are not finite or
// whose magnitude exceeds `threshold` (FP16's largest value under --fp16). A step with any such
// gradient on any rank is skipped.
//   count = #{ i in [0, n) : !(|x[i]| <= threshold) }      (NaN compares false: counted)
// Callers use the typed view (OverflowCountViews); OverflowCountArgs is the backend contract.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct OverflowCountArgs {
  const float* x = nullptr;  // (n)
  float threshold = 0.0f;    // >= 0 (with +inf only NaN counts: |inf| <= inf holds)
  std::int64_t n = 0;
};

// overflow_count over a typed view: x an f32 view of any shape on ctx.device (n = its elements;
// a view of no elements counts 0).
struct OverflowCountViews {
  core::TensorView x{};    // f32
  float threshold = 0.0f;  // >= 0
};
std::int64_t overflow_count(const core::ExecContext& ctx, const OverflowCountViews& v);

namespace ref {
// The specification (ref/overflow_ref.cc).
std::int64_t overflow_count(const OverflowCountArgs& args);
}  // namespace ref

}  // namespace trident::kernels
