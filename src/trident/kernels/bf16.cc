// CPU FP32 <-> BF16 array conversions (see bf16.h). The FP32 -> BF16 direction has two bodies: an
// integer-arithmetic loop that GCC vectorizes, and vcvtne2ps2bf16 intrinsics compiled only when
// the target has avx512_bf16. The BF16 -> FP32 direction is a 16-bit shift, vectorized as is.
#include "trident/kernels/bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>

#include "trident/kernels/cpu_util.h"

namespace trident::kernels {

namespace {

// Below this many elements the conversion runs on the calling thread: waking the OpenMP team
// costs more than the copy (64 Ki floats = 256 KiB, about 10 us at the single-core bandwidth).
constexpr std::int64_t kMinParallel = 64 * 1024;
// Thread ranges start at multiples of this, so every range but the last is whole 32-float blocks.
constexpr std::int64_t kBlock = 32;

void check_args(const char* op, const void* dst, const void* src, std::int64_t n) {
  TRIDENT_CHECK(n >= 0, op, ": n must be >= 0, got ", n);
  TRIDENT_CHECK(n == 0 || (dst != nullptr && src != nullptr), op, ": dst or src is null for n=", n);
}

// Runs body(begin, end) over [0, n) split into one contiguous range per thread, or on the calling
// thread when n is small.
template <class Body>
void for_ranges(const core::ExecContext& ctx, std::int64_t n, const Body& body) {
  const int threads = n >= kMinParallel ? detail::num_threads(ctx) : 1;
  if (threads <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  const std::int64_t per_thread = (blocks + threads - 1) / threads * kBlock;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const std::int64_t begin = std::min(n, per_thread * t);
    const std::int64_t end = std::min(n, begin + per_thread);
    if (begin < end) body(begin, end);
  }
}

// bf16 bits of the float with bits u: the formula of core::bf16::from_float, written branch-free
// so that it vectorizes.
inline std::uint16_t bf16_bits(std::uint32_t u) {
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(is_nan ? ((u >> 16) | 0x0040u) : rounded);
}

}  // namespace

namespace detail {

void f32_to_bf16_portable(core::bf16* dst, const float* src, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    dst[i].bits = bf16_bits(std::bit_cast<std::uint32_t>(src[i]));
  }
}

#if defined(__AVX512BF16__)

bool has_avx512bf16_convert() { return true; }

// vcvtne2ps2bf16 rounds to nearest even and turns NaN into the same quiet NaN as from_float, but
// treats subnormal inputs as zero (DAZ). A lane is subnormal when (bits & 0x7fffffff) - 1 is below
// 0x7fffff (the subtraction wraps +-0 to a huge value); blocks with such a lane, and the last
// n % 32 elements, take the portable formula.
void f32_to_bf16_avx512bf16(core::bf16* dst, const float* src, std::int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i max_sub = _mm512_set1_epi32(0x007fffff);
  std::int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const __m512 lo = _mm512_loadu_ps(src + i);
    const __m512 hi = _mm512_loadu_ps(src + i + 16);
    const __m512i lo_abs = _mm512_and_si512(_mm512_castps_si512(lo), abs_mask);
    const __m512i hi_abs = _mm512_and_si512(_mm512_castps_si512(hi), abs_mask);
    const __mmask16 sub_lo = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(lo_abs, one), max_sub);
    const __mmask16 sub_hi = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(hi_abs, one), max_sub);
    if ((sub_lo | sub_hi) != 0) [[unlikely]] {
      f32_to_bf16_portable(dst + i, src + i, kBlock);
      continue;
    }
    // The second operand fills the low 16 results, the first the high 16.
    const __m512bh packed = _mm512_cvtne2ps_pbh(hi, lo);
    _mm512_storeu_si512(dst + i, (__m512i)packed);
  }
  f32_to_bf16_portable(dst + i, src + i, n - i);
}

#else  // no avx512_bf16 in the target: the portable loop is the only body

bool has_avx512bf16_convert() { return false; }

void f32_to_bf16_avx512bf16(core::bf16*, const float*, std::int64_t) {
  throw core::Unavailable(
      "f32_to_bf16_avx512bf16: this build's target has no avx512_bf16 (compile with "
      "-march=native on a CPU that has it)");
}

#endif

}  // namespace detail

void convert_f32_to_bf16(const core::ExecContext& ctx, core::bf16* dst, const float* src,
                         std::int64_t n) {
  core::require_cpu(ctx, "convert_f32_to_bf16");
  check_args("convert_f32_to_bf16", dst, src, n);
  const bool native = detail::has_avx512bf16_convert();
  for_ranges(ctx, n, [&](std::int64_t begin, std::int64_t end) {
    if (native) {
      detail::f32_to_bf16_avx512bf16(dst + begin, src + begin, end - begin);
    } else {
      detail::f32_to_bf16_portable(dst + begin, src + begin, end - begin);
    }
  });
}

void convert_bf16_to_f32(const core::ExecContext& ctx, float* dst, const core::bf16* src,
                         std::int64_t n) {
  core::require_cpu(ctx, "convert_bf16_to_f32");
  check_args("convert_bf16_to_f32", dst, src, n);
  for_ranges(ctx, n, [&](std::int64_t begin, std::int64_t end) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      dst[i] = std::bit_cast<float>(static_cast<std::uint32_t>(src[i].bits) << 16);
    }
  });
}

}  // namespace trident::kernels
