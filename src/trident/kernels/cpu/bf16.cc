// CPU FP32 <-> BF16 array conversions (see bf16.h). The FP32 -> BF16 direction has two bodies: an
// integer-arithmetic loop that GCC vectorizes (here, once per instruction-set variant), and
// vcvtne2ps2bf16 intrinsics (kernels/bf16.cc), taken when the processor has avx512_bf16. The
// BF16 -> FP32 direction is a 16-bit shift, vectorized as is.
#include <algorithm>
#include <bit>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

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

void f32_to_bf16_block(core::bf16* dst, const float* src, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    dst[i].bits = bf16_bits(std::bit_cast<std::uint32_t>(src[i]));
  }
}

}  // namespace

void convert_f32_to_bf16(const core::ExecContext& ctx, core::bf16* dst, const float* src,
                         std::int64_t n) {
  check_args("convert_f32_to_bf16", dst, src, n);
  const bool native = detail::has_avx512bf16_convert();
  for_ranges(ctx, n, [&](std::int64_t begin, std::int64_t end) {
    if (native) {
      detail::f32_to_bf16_avx512bf16(dst + begin, src + begin, end - begin);
    } else {
      f32_to_bf16_block(dst + begin, src + begin, end - begin);
    }
  });
}

void convert_bf16_to_f32(const core::ExecContext& ctx, float* dst, const core::bf16* src,
                         std::int64_t n) {
  check_args("convert_bf16_to_f32", dst, src, n);
  for_ranges(ctx, n, [&](std::int64_t begin, std::int64_t end) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      dst[i] = std::bit_cast<float>(static_cast<std::uint32_t>(src[i].bits) << 16);
    }
  });
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
