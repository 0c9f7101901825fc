// CPU fill and copy: OpenMP over static contiguous ranges (see fill.h).
#include <cstring>

#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void fill(const core::ExecContext& ctx, const FillArgs& a) {
  TRIDENT_CHECK(a.n >= 0, "fill: n must be >= 0, got ", a.n);
  TRIDENT_CHECK(a.n == 0 || a.out != nullptr, "fill: out is null for n=", a.n);
  float* out = a.out;
  const float value = a.value;
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = 0; i < a.n; ++i) out[i] = value;
}

void copy(const core::ExecContext& ctx, const CopyArgs& a) {
  TRIDENT_CHECK(a.n >= 0, "copy: n must be >= 0, got ", a.n);
  TRIDENT_CHECK(a.n == 0 || (a.out != nullptr && a.in != nullptr),
                "copy: a pointer is null for n=", a.n);
  TRIDENT_CHECK(a.n == 0 || a.out + a.n <= a.in || a.in + a.n <= a.out,
                "copy: out and in overlap (n=", a.n, ")");
  float* out = a.out;
  const float* in = a.in;
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = 0; i < a.n; ++i) out[i] = in[i];
}

void copy_columns(const core::ExecContext& ctx, const CopyColumnsArgs& a) {
  TRIDENT_CHECK(a.rows >= 0 && a.cols >= 0, "copy_columns: negative size (", a.rows, " x ", a.cols,
                ")");
  if (a.rows == 0 || a.cols == 0) return;
  TRIDENT_CHECK(a.out != nullptr && a.in != nullptr, "copy_columns: a pointer is null");
  const float* in = a.in + a.in_col;
  float* out = a.out + a.out_col;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows; ++r) {
    std::memcpy(out + r * a.out_width, in + r * a.in_width,
                static_cast<std::size_t>(a.cols) * sizeof(float));
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
