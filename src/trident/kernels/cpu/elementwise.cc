// CPU elementwise kernels: GeLU (tanh form) forward and backward, add, scale, and the
// sum-of-squares and finiteness reductions used by gradient clipping. See elementwise.h.
#include <algorithm>
#include <bit>
#include <cmath>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

void check_n(const char* op, std::int64_t n, bool pointers_ok) {
  TRIDENT_CHECK(n >= 0, op, ": n must be >= 0, got ", n);
  TRIDENT_CHECK(n == 0 || pointers_ok, op, ": a pointer is null for n=", n);
}

// Static split of [0, n) into `parts` contiguous ranges; part p gets [begin, end).
struct Range {
  std::int64_t begin, end;
};
Range split(std::int64_t n, int parts, int p) {
  const std::int64_t chunk = (n + parts - 1) / parts;
  const std::int64_t begin = std::min(n, chunk * p);
  return {begin, std::min(n, begin + chunk)};
}

}  // namespace

// 0.5 (1 + tanh(u)) = sigmoid(2u), so gelu(x) = x / (1 + e) with e = exp(-2u),
// u = sqrt(2/pi) (x + 0.044715 x^3). exp_approx saturates at exp(88), so a large positive x gives
// x and a large negative x a tiny value (|x| / 1.6e38) instead of overflowing.
void gelu_forward(const core::ExecContext& ctx, float* out, const float* in, std::int64_t n) {
  check_n("gelu_forward", n, out && in);
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = in[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = x / (1.0f + detail::exp_approx(-2.0f * u));
  }
}

// gelu'(x) = s + 2 x s (1 - s) u'(x) with s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3*0.044715 x^2).
// With e = exp(-2u): s = 1 / (1 + e) and s (1 - s) = (e s) s, which avoids the cancellation in
// 1 - s; e s = e / (1 + e) <= 1 is formed first so that the product cannot overflow.
void gelu_backward(const core::ExecContext& ctx, float* d_in, const float* d_out, const float* in,
                   std::int64_t n) {
  check_n("gelu_backward", n, d_in && d_out && in);
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = in[i];
    const float x2 = x * x;
    const float u = kSqrt2OverPi * (x + kGeluCubic * x2 * x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x2);
    const float e = detail::exp_approx(-2.0f * u);
    const float s = 1.0f / (1.0f + e);
    d_in[i] = d_out[i] * (s + 2.0f * x * du * ((e * s) * s));
  }
}

void add_forward(const core::ExecContext& ctx, float* out, const float* a, const float* b,
                 std::int64_t n) {
  check_n("add_forward", n, out && a && b);
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void scale_inplace(const core::ExecContext& ctx, float* x, float s, std::int64_t n) {
  check_n("scale_inplace", n, x != nullptr);
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) x[i] *= s;
}

// Each thread sums a fixed contiguous range in double; the partial sums are added in thread order,
// so the result is bitwise reproducible for a given thread count.
double sum_squares(const core::ExecContext& ctx, const float* x, std::int64_t n) {
  check_n("sum_squares", n, x != nullptr);
  constexpr int kMaxParts = 256;
  const int parts = std::clamp(detail::num_threads(ctx), 1, kMaxParts);
  double partial[kMaxParts] = {};
#pragma omp parallel num_threads(parts)
  {
    // The team may be smaller than asked for; a thread takes every part congruent to its id.
    for (int p = omp_get_thread_num(); p < parts; p += omp_get_num_threads()) {
      const Range rg = split(n, parts, p);
      double acc = 0.0;
#pragma omp simd reduction(+ : acc)
      for (std::int64_t i = rg.begin; i < rg.end; ++i) {
        const double v = x[i];
        acc += v * v;
      }
      partial[p] = acc;
    }
  }
  double total = 0.0;
  for (int p = 0; p < parts; ++p) total += partial[p];
  return total;
}

// A float is non-finite when all its exponent bits are set (inf or NaN).
bool all_finite(const core::ExecContext& ctx, const float* x, std::int64_t n) {
  check_n("all_finite", n, x != nullptr);
  std::uint32_t bad = 0;
#pragma omp parallel for simd num_threads(detail::num_threads(ctx)) schedule(static) \
    reduction(|                                                                      \
              : bad)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x[i]);
    bad |= (bits & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
  }
  return bad == 0;
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
