// Internal helpers shared by the CPU kernels (not part of the public API): thread counts, the
// oneDNN sgemm call, argument checks and a vectorizable exp. Included only by kernels/*.cc.
#pragma once

#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/kernels/matmul.h"

// Inline helpers defined in headers are compiled into every instruction-set variant that includes
// them (kernels/cpu/cpu_ops.h); an inline namespace per variant keeps their symbols apart, so the
// linker can never hand AVX-512 code to a processor without it.
#ifdef TRIDENT_CPU_ISA
#define TRIDENT_CPU_INLINE_NS TRIDENT_CPU_ISA
#else
#define TRIDENT_CPU_INLINE_NS generic
#endif

namespace trident::kernels::detail {

// gemm (matmul.h) through dnnl_sgemm without argument checks (callers have checked). Inside an
// OpenMP parallel region oneDNN runs it on the calling thread only. beta == 0 overwrites C without
// reading it. Throws InternalError if oneDNN reports a failure.
void sgemm(const GemmArgs& g);

inline namespace TRIDENT_CPU_INLINE_NS {

// Threads a kernel uses: ctx.num_threads, or OpenMP's default when it is 0.
inline int num_threads(const core::ExecContext& ctx) {
  return ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads();
}

// Width of the column blocks that column-parallel reductions hand to threads: one block per
// thread when that fits in max_width, rounded up to 16 floats. Wide blocks make each row's share
// one long contiguous read; the per-column arithmetic is the same for any width, so results do not
// depend on it (or on the thread count).
inline std::int64_t column_block_width(std::int64_t cols, int threads, std::int64_t max_width) {
  const std::int64_t per_thread = (cols + threads - 1) / threads;
  const std::int64_t width = (per_thread + 15) / 16 * 16;
  return width < 16 ? 16 : (width > max_width ? max_width : width);
}

// oneDNN's sgemm takes its thread count from omp_get_max_threads() of the calling thread. This
// sets that per-thread value for one call and restores it afterwards, so ctx.num_threads is
// honoured without changing the process-wide default.
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int n) : saved_(omp_get_max_threads()) {
    if (n > 0 && n != saved_) {
      omp_set_num_threads(n);
      changed_ = true;
    }
  }
  ~OmpThreadsScope() {
    if (changed_) omp_set_num_threads(saved_);
  }
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int saved_;
  bool changed_ = false;
};

// exp(x) in float, written so that GCC vectorizes loops calling it under `#pragma omp simd`
// (glibc's expf is not vectorized without -ffast-math). x = n ln2 + r with |r| <= ln2/2, exp(r)
// by its degree-7 Taylor polynomial (truncation error < 1e-8 relative), 2^n from exponent bits.
// Relative error below 1e-7 (7.4e-8 measured, about 1 ulp). Returns exactly 0 below -87.3 (where
// expf goes subnormal) and exp(88) for x >= 88; NaN gives NaN.
inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 split so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // NaN becomes 0 here (converting NaN to an integer below is undefined) and is returned as x.
  const float xc = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : (x != x ? 0.0f : x));
  const float n = (xc * kLog2e + kRoundMagic) - kRoundMagic;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t e = static_cast<std::int32_t>(n) + 127;
  const float scale = std::bit_cast<float>(static_cast<std::uint32_t>(e) << 23);
  const float y = p * scale;
  return x < -87.3f ? 0.0f : (x != x ? x : y);
}

// The dropout decisions of kernels::dropout_keep (flash_attention.h) without a call per element.
// Element `index` takes 32-bit word index % 4 of the Philox4x32-10 block for counter index / 4
// (core/rng.cc's rounds) and is kept when that word >= floor(p 2^32): four decisions per block, as
// curand_uniform4 / PyTorch's fused dropout draw them. dropout_keep_run draws a run of consecutive
// indices with the whole blocks in one loop that GCC vectorizes (32x32->64-bit products in 64-bit
// lanes) and the partial blocks at either end one element at a time.
inline std::uint64_t dropout_threshold(float p) {
  return static_cast<std::uint64_t>(std::floor(static_cast<double>(p) * 0x1.0p32));
}
struct PhiloxWords {
  std::uint32_t w0, w1, w2, w3;
};
inline PhiloxWords philox_block(std::uint64_t seed, std::uint64_t stream, std::uint64_t block) {
  std::uint32_t c0 = static_cast<std::uint32_t>(block),
                c1 = static_cast<std::uint32_t>(block >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(stream),
                c3 = static_cast<std::uint32_t>(stream >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<std::uint32_t>(p1);
    c3 = static_cast<std::uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}
inline bool dropout_keep_bits(std::uint64_t seed, std::uint64_t stream, std::uint64_t index,
                              std::uint64_t threshold) {
  const PhiloxWords w = philox_block(seed, stream, index >> 2);
  const std::uint32_t lane = static_cast<std::uint32_t>(index & 3);
  const std::uint32_t word = lane == 0 ? w.w0 : lane == 1 ? w.w1 : lane == 2 ? w.w2 : w.w3;
  return word >= threshold;
}
// keep[j] = the decision for index first + j (1 kept, 0 dropped), j < n.
template <class T>
inline void dropout_keep_run(std::uint64_t seed, std::uint64_t stream, std::uint64_t first,
                             std::int64_t n, std::uint64_t threshold, T* keep) {
  std::int64_t j = 0;
  for (; j < n && ((first + static_cast<std::uint64_t>(j)) & 3) != 0; ++j) {
    keep[j] = dropout_keep_bits(seed, stream, first + static_cast<std::uint64_t>(j), threshold);
  }
  const std::uint64_t b0 = (first + static_cast<std::uint64_t>(j)) >> 2;
  const std::int64_t blocks = (n - j) / 4;
  T* out = keep + j;
#pragma omp simd
  for (std::int64_t b = 0; b < blocks; ++b) {
    const PhiloxWords w = philox_block(seed, stream, b0 + static_cast<std::uint64_t>(b));
    out[4 * b] = static_cast<T>(w.w0 >= threshold);
    out[4 * b + 1] = static_cast<T>(w.w1 >= threshold);
    out[4 * b + 2] = static_cast<T>(w.w2 >= threshold);
    out[4 * b + 3] = static_cast<T>(w.w3 >= threshold);
  }
  for (j += 4 * blocks; j < n; ++j) {
    keep[j] = dropout_keep_bits(seed, stream, first + static_cast<std::uint64_t>(j), threshold);
  }
}

}  // namespace TRIDENT_CPU_INLINE_NS
}  // namespace trident::kernels::detail
