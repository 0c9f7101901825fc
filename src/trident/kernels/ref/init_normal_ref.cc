// Reference normal initialization: one element at a time.
#include "trident/core/rng.h"
#include "trident/kernels/init_normal.h"

namespace trident::kernels::ref {

void init_normal(const InitNormalArgs& a) {
  for (std::int64_t i = a.begin; i < a.end; ++i) {
    const std::int64_t g =
        a.base + (i / a.local_cols) * a.global_cols + a.col_offset + i % a.local_cols;
    a.out[i - a.begin] = static_cast<float>(
        a.stddev * core::philox_normal(a.seed, a.stream, static_cast<std::uint64_t>(g)));
  }
}

}  // namespace trident::kernels::ref
