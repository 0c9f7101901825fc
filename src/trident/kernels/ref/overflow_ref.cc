// Reference overflow count, in double: an element counts when it is NaN, infinite beyond the
// threshold, or |x| > threshold.
#include <cmath>

#include "trident/kernels/overflow.h"

namespace trident::kernels::ref {

std::int64_t overflow_count(const OverflowCountArgs& a) {
  std::int64_t count = 0;
  const double t = a.threshold;
  for (std::int64_t i = 0; i < a.n; ++i) {
    const double x = a.x[i];
    if (std::isnan(x) || std::abs(x) > t) ++count;
  }
  return count;
}

}  // namespace trident::kernels::ref
