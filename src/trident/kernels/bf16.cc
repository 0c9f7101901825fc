// FP32 <-> BF16 conversions: the backend dispatch of bf16.h, the portable single-threaded
// formula, and the avx512_bf16 body (compiled for that instruction set by a target attribute and
// run only on processors that have it).
#include "trident/kernels/bf16.h"

#include <immintrin.h>

#include <bit>

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

namespace {

constexpr std::int64_t kBlock = 32;  // floats per vcvtne2ps2bf16 pair

// bf16 bits of the float with bits u: the formula of core::bf16::from_float, branch-free.
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

bool has_avx512bf16_convert() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

// vcvtne2ps2bf16 rounds to nearest even and turns NaN into the same quiet NaN as from_float, but
// treats subnormal inputs as zero (DAZ). A lane is subnormal when (bits & 0x7fffffff) - 1 is below
// 0x7fffff (the subtraction wraps +-0 to a huge value); blocks with such a lane, and the last
// n % 32 elements, take the portable formula.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void f32_to_bf16_avx512bf16(
    core::bf16* dst, const float* src, std::int64_t n) {
  if (!has_avx512bf16_convert()) {
    throw core::Unavailable(
        "f32_to_bf16_avx512bf16: this processor has no avx512_bf16 instructions");
  }
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

}  // namespace detail

void convert_f32_to_bf16(const core::ExecContext& ctx, core::bf16* dst, const float* src,
                         std::int64_t n) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "convert_f32_to_bf16", 0, 6.0 * n);
  TRIDENT_DISPATCH(convert_f32_to_bf16, ctx, dst, src, n);
}

void convert_bf16_to_f32(const core::ExecContext& ctx, float* dst, const core::bf16* src,
                         std::int64_t n) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "convert_bf16_to_f32", 0, 6.0 * n);
  TRIDENT_DISPATCH(convert_bf16_to_f32, ctx, dst, src, n);
}

void convert(const core::ExecContext& ctx, const ConvertViews& v) {
  constexpr const char* op = "convert";
  constexpr core::DType f32 = core::DType::kF32, bf16 = core::DType::kBF16;
  TRIDENT_CHECK(!v.in.empty() || v.in.numel() == 0, op, ": view `in` is empty");
  TRIDENT_CHECK(v.in.dtype == f32 || v.in.dtype == bf16, op, ": view `in` holds ",
                core::dtype_name(v.in.dtype), "; the op converts f32 to bf16 and bf16 to f32");
  const core::DType to = v.in.dtype == f32 ? bf16 : f32;
  detail::check_view(op, "in", v.in, v.in.dtype, v.in.shape, ctx);
  detail::check_view(op, "out", v.out, to, v.in.shape, ctx,
                     to == bf16 ? " (in is f32: out gets its bf16 rounding)" : " (in is bf16)");
  if (to == bf16) {
    return convert_f32_to_bf16(ctx, detail::data_or_null<core::bf16>(v.out),
                               detail::data_or_null<float>(v.in), v.in.numel());
  }
  convert_bf16_to_f32(ctx, detail::data_or_null<float>(v.out),
                      detail::data_or_null<core::bf16>(v.in), v.in.numel());
}

}  // namespace trident::kernels
