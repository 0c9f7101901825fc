// Normal initialization, CPU: OpenMP over elements, one Philox draw each.
#include "trident/core/rng.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void init_normal(const ExecContext& ctx, const InitNormalArgs& a) {
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = a.begin; i < a.end; ++i) {
    const std::int64_t g =
        a.base + (i / a.local_cols) * a.global_cols + a.col_offset + i % a.local_cols;
    a.out[i - a.begin] = static_cast<float>(
        a.stddev * core::philox_normal(a.seed, a.stream, static_cast<std::uint64_t>(g)));
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
