// CPU overflow count: one OpenMP reduction over the buffer (see overflow.h). An integer count, so
// the result does not depend on the thread count.
#include <cmath>

#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

std::int64_t overflow_count(const core::ExecContext& ctx, const OverflowCountArgs& a) {
  TRIDENT_CHECK(a.n >= 0, "overflow_count: n must be >= 0, got ", a.n);
  TRIDENT_CHECK(a.n == 0 || a.x != nullptr, "overflow_count: x is null for n=", a.n);
  TRIDENT_CHECK(a.threshold >= 0.0f, "overflow_count: threshold must be >= 0, got ", a.threshold);
  const float* x = a.x;
  const float t = a.threshold;
  std::int64_t bad = 0;
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static) \
    reduction(+ : bad)
  for (std::int64_t i = 0; i < a.n; ++i) bad += std::abs(x[i]) <= t ? 0 : 1;  // NaN: counted
  return bad;
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
