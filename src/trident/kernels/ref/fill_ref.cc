// Reference fill and copy: plain loops, one thread.
#include "trident/kernels/fill.h"

namespace trident::kernels::ref {

void fill(const FillArgs& a) {
  for (std::int64_t i = 0; i < a.n; ++i) a.out[i] = a.value;
}

void copy(const CopyArgs& a) {
  for (std::int64_t i = 0; i < a.n; ++i) a.out[i] = a.in[i];
}

}  // namespace trident::kernels::ref
