// Internal helpers (not public API) for kernels that write rows in parallel and also sum over the
// rows (bias and LayerNorm parameter gradients) in one pass: the rows are cut into fixed chunks,
// each chunk sums its rows in order into a double partial in caller scratch, and the partials are
// added in chunk order. The result depends on the chunk size only, never on the thread count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::detail {
inline namespace TRIDENT_CPU_INLINE_NS {  // see cpu_util.h

// Rows per chunk: enough work per chunk to amortize its partial (one double per column, read and
// written per row from L1/L2), small enough that 2-16 threads get several chunks each at the
// usual 1024-16384 rows.
inline constexpr std::int64_t kRowChunk = 64;

inline std::int64_t num_row_chunks(std::int64_t rows) { return (rows + kRowChunk - 1) / kRowChunk; }

// Checks that scratch holds `count` doubles (size and alignment) and returns it as doubles.
inline double* partials_from_scratch(const char* op, std::span<std::byte> scratch,
                                     std::int64_t count) {
  const auto need = static_cast<std::size_t>(count) * sizeof(double);
  TRIDENT_CHECK(scratch.size() >= need, op, ": scratch has ", scratch.size(), " bytes, needs ",
                need, " (ask ", op, "_scratch_bytes)");
  TRIDENT_CHECK(reinterpret_cast<std::uintptr_t>(scratch.data()) % alignof(double) == 0, op,
                ": scratch must be ", alignof(double), "-byte aligned");
  return reinterpret_cast<double*>(scratch.data());
}

// out[c] += sum_k partials[k * stride + c] over k = 0 .. chunks-1 in order, for c in [0, cols).
// Column blocks in parallel (each column's sum is sequential, so any split gives the same bits).
// Call from inside an OpenMP parallel region (it uses an orphaned `omp for`).
inline void add_partials_in_parallel(float* out, const double* partials, std::int64_t chunks,
                                     std::int64_t stride, std::int64_t cols) {
  constexpr std::int64_t kBlock = 256;
  const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
#pragma omp for schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t c0 = b * kBlock;
    const std::int64_t width = std::min(kBlock, cols - c0);
    double acc[kBlock];
    std::fill(acc, acc + width, 0.0);
    for (std::int64_t k = 0; k < chunks; ++k) {
      const double* p = partials + k * stride + c0;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) acc[j] += p[j];
    }
    for (std::int64_t j = 0; j < width; ++j) {
      out[c0 + j] = static_cast<float>(out[c0 + j] + acc[j]);
    }
  }
}

}  // namespace TRIDENT_CPU_INLINE_NS
}  // namespace trident::kernels::detail
