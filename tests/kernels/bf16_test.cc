// FP32 <-> BF16 array conversions: both FP32 -> BF16 bodies (portable and vcvtne2ps2bf16) bit for
// bit against core::bf16::from_float over every high half-word (so every sign, exponent and top
// mantissa, all NaN payloads, infinities, zeros and subnormals) combined with the low half-words
// that decide rounding (ties with even and odd kept bits, just below and above a tie), every tail
// length, and the threaded entry points. Exact comparisons: conversion has one right answer, on
// every backend (the CUDA kernels round with core/bf16.h's integer arithmetic).
#include "trident/kernels/bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/dispatch.h"

namespace trident::kernels {
namespace {

// Whether this processor has avx512_bf16 (and so the vcvtne2ps2bf16 path must be taken).
const bool kCpuHasAvx512Bf16 =
    __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

// Every high half-word, each with the low half-words that matter for rounding: 0 (exact),
// 0x0001 and 0x7fff (just above/below nothing and a tie), 0x8000 (a tie: goes to the even
// neighbour), 0x8001 (just above a tie), 0xffff (rounds up, may carry into the exponent), plus two
// random ones. Order is shuffled so that NaN, subnormal and normal lanes share SIMD blocks.
std::vector<float> interesting_floats() {
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc3a5};
  std::vector<float> v;
  v.reserve(65536 * std::size(lows));
  for (std::uint32_t hi = 0; hi < 65536; ++hi) {
    for (std::uint32_t lo : lows) v.push_back(std::bit_cast<float>(hi << 16 | lo));
  }
  std::mt19937_64 gen(7);
  std::shuffle(v.begin(), v.end(), gen);
  return v;
}

std::vector<std::uint16_t> expected_bits(const std::vector<float>& x) {
  std::vector<std::uint16_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) bits[i] = core::bf16::from_float(x[i]).bits;
  return bits;
}

// Bitwise comparison naming the first mismatch, its input and both results.
::testing::AssertionResult same_bits(const std::string& name, const std::vector<core::bf16>& got,
                                     const std::vector<std::uint16_t>& want,
                                     const std::vector<float>& in) {
  std::int64_t num_bad = 0, first = -1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i].bits != want[i]) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++num_bad;
    }
  }
  if (num_bad == 0) return ::testing::AssertionSuccess();
  char buf[160];
  std::snprintf(buf, sizeof buf, "first at %lld: input bits 0x%08x, got 0x%04x, want 0x%04x",
                static_cast<long long>(first), std::bit_cast<std::uint32_t>(in[first]),
                got[first].bits, want[first]);
  return ::testing::AssertionFailure()
         << name << ": " << num_bad << " of " << want.size() << " differ; " << buf;
}

TEST(Bf16ConvertCpuOnly, NativePathIsTakenWhenTheProcessorHasIt) {
  TRIDENT_CPU_ONLY("the CPU's choice of conversion body");
  // The tests below compare the vcvtne2ps2bf16 path only where the processor runs it; this pins
  // that it is taken whenever the processor offers avx512_bf16 (the binary is built for any
  // x86-64; the path is chosen at run time).
  EXPECT_EQ(detail::has_avx512bf16_convert(), kCpuHasAvx512Bf16);
  RecordProperty("avx512bf16_path", detail::has_avx512bf16_convert() ? "yes" : "no");
}

TEST(Bf16ConvertCpuOnly, PortableMatchesScalarBitForBit) {
  TRIDENT_CPU_ONLY("the portable CPU body itself");
  const std::vector<float> x = interesting_floats();
  const auto want = expected_bits(x);
  std::vector<core::bf16> got(x.size());
  detail::f32_to_bf16_portable(got.data(), x.data(), static_cast<std::int64_t>(x.size()));
  EXPECT_TRUE(same_bits("portable", got, want, x));
}

TEST(Bf16ConvertCpuOnly, Avx512Bf16MatchesScalarBitForBit) {
  TRIDENT_CPU_ONLY("the avx512_bf16 CPU body itself");
  const std::vector<float> x = interesting_floats();
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<core::bf16> got(x.size());
  if (!detail::has_avx512bf16_convert()) {
    EXPECT_THROW(detail::f32_to_bf16_avx512bf16(got.data(), x.data(), n), core::Unavailable);
    return;
  }
  detail::f32_to_bf16_avx512bf16(got.data(), x.data(), n);
  EXPECT_TRUE(same_bits("avx512_bf16", got, expected_bits(x), x));
}

// Subnormals are where the instruction (which flushes them) and from_float (which rounds them)
// differ: blocks of pure subnormals, and single subnormals among normals, at every lane position.
TEST(Bf16ConvertCpuOnly, Avx512Bf16RoundsSubnormalsLikeScalar) {
  TRIDENT_CPU_ONLY("the avx512_bf16 CPU body itself");
  std::vector<float> x;
  for (std::uint32_t m = 1; m < 0x800000; m += 0x1357) {
    x.push_back(std::bit_cast<float>(m));                // positive subnormal
    x.push_back(std::bit_cast<float>(0x80000000u | m));  // negative subnormal
  }
  for (int lane = 0; lane < 64; ++lane) {
    for (int i = 0; i < 64; ++i) x.push_back(i == lane ? 1e-40f : 1.0f + static_cast<float>(i));
  }
  x.push_back(std::bit_cast<float>(0x007fffffu));  // largest subnormal: rounds up to 2^-126
  std::vector<core::bf16> got(x.size());
  if (!detail::has_avx512bf16_convert()) {  // pinned by NativePathIsTakenWhenTheProcessorHasIt
    EXPECT_THROW(detail::f32_to_bf16_avx512bf16(got.data(), x.data(), 1), core::Unavailable);
    return;
  }
  detail::f32_to_bf16_avx512bf16(got.data(), x.data(), static_cast<std::int64_t>(x.size()));
  EXPECT_TRUE(same_bits("avx512_bf16 subnormals", got, expected_bits(x), x));
}

// Every length 0..100 at unaligned starts: the 32-float blocks plus the scalar tail.
TEST(Bf16ConvertCpuOnly, AllTailLengthsAndOffsets) {
  TRIDENT_CPU_ONLY("the CPU bodies' blocks and tails; EveryLengthAndOffset runs on every backend");
  const std::vector<float> pool = testing::randn(200, 3, 100.0);
  const bool native = detail::has_avx512bf16_convert();
  for (std::int64_t offset : {0, 1, 5}) {
    for (std::int64_t n = 0; n <= 100; ++n) {
      const std::vector<float> x(pool.begin() + offset, pool.begin() + offset + n);
      const auto want = expected_bits(x);
      std::vector<core::bf16> got(x.size() + 1, core::bf16::from_bits(0xdead));
      detail::f32_to_bf16_portable(got.data(), x.data(), n);
      const std::string name = "n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      EXPECT_TRUE(same_bits("portable " + name, got, want, x));
      EXPECT_EQ(got[n].bits, 0xdead) << "portable wrote past the end, " << name;
      if (native) {
        got.assign(x.size() + 1, core::bf16::from_bits(0xdead));
        detail::f32_to_bf16_avx512bf16(got.data(), x.data(), n);
        EXPECT_TRUE(same_bits("avx512_bf16 " + name, got, want, x));
        EXPECT_EQ(got[n].bits, 0xdead) << "avx512_bf16 wrote past the end, " << name;
      }
    }
  }
}

// Every length 0..100 through the op, at element offsets 0, 1 and 5 into the source and
// destination buffers (addresses only element-aligned, as in a flat buffer), in both directions:
// the grid's and the vector blocks' tails; nothing is written past the end.
TEST(Bf16Convert, EveryLengthAndOffset) {
  const std::vector<float> pool = testing::randn(200, 3, 100.0);
  const std::vector<core::bf16> pool16 = [&] {
    std::vector<core::bf16> h(pool.size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = core::bf16::from_float(pool[i]);
    return h;
  }();
  for (std::int64_t offset : {0, 1, 5}) {
    for (std::int64_t n = 0; n <= 100; ++n) {
      const std::string name = "n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      std::vector<core::bf16> got(static_cast<std::size_t>(n + offset + 1),
                                  core::bf16::from_bits(0xdead));
      convert(cpu_ctx(), {.out = testing::view_at(got, offset, {n}),
                          .in = testing::view_at(pool, offset, {n})});
      testing::fetch(got);
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[offset + i].bits, core::bf16::from_float(pool[offset + i]).bits)
            << name << " i=" << i;
      }
      ASSERT_EQ(got[offset + n].bits, 0xdead) << "wrote past the end, " << name;
      if (offset > 0) {
        ASSERT_EQ(got[offset - 1].bits, 0xdead) << "wrote before, " << name;
      }
      std::vector<float> wide(static_cast<std::size_t>(n + offset + 1), -7.0f);
      convert(cpu_ctx(), {.out = testing::view_at(wide, offset, {n}),
                          .in = testing::view_at(pool16, offset, {n})});
      testing::fetch(wide);
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(wide[offset + i], pool16[offset + i].to_float()) << name << " i=" << i;
      }
      ASSERT_EQ(wide[offset + n], -7.0f) << "wrote past the end, " << name;
    }
  }
}

// The threaded entry point on arrays large enough to be split (1, 2 and 3 threads, odd length).
TEST(Bf16Convert, ThreadedF32ToBf16MatchesScalar) {
  const std::int64_t n = 1'000'003;
  const std::vector<float> x = testing::randn(n, 11, 10.0);
  const auto want = expected_bits(x);
  for (int threads : {1, 2, 3}) {
    std::vector<core::bf16> got(n);
    convert(cpu_ctx(threads), {.out = testing::view_of(got, {n}), .in = testing::view_of(x, {n})});
    EXPECT_TRUE(same_bits("threads=" + std::to_string(threads), testing::fetch(got), want, x));
  }
}

// bf16 -> f32 is exact: every one of the 65536 bit patterns becomes its bits << 16 (NaN payloads
// included), and converting back gives the same bits except that a signalling NaN comes back quiet.
TEST(Bf16Convert, Bf16ToF32IsExactForEveryPattern) {
  // Repeated so that the threaded path runs too.
  const std::int64_t n = 65536 * 4;
  std::vector<core::bf16> x(n);
  for (std::int64_t i = 0; i < n; ++i) x[i] = core::bf16::from_bits(static_cast<std::uint16_t>(i));
  std::vector<float> y(n);
  convert(cpu_ctx(2), {.out = testing::view_of(y, {n}), .in = testing::view_of(x, {n})});
  std::vector<core::bf16> back(n);
  convert(cpu_ctx(2), {.out = testing::view_of(back, {n}), .in = testing::view_of(y, {n})});
  testing::fetch(y);
  testing::fetch(back);
  std::int64_t bad_widen = 0, bad_back = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = x[i].bits;
    if (std::bit_cast<std::uint32_t>(y[i]) != bits << 16) ++bad_widen;
    const bool signalling_nan = (bits & 0x7fffu) > 0x7f80u && (bits & 0x0040u) == 0;
    const std::uint32_t want_back = signalling_nan ? (bits | 0x0040u) : bits;
    if (back[i].bits != want_back) ++bad_back;
  }
  EXPECT_EQ(bad_widen, 0) << "bf16 -> f32 is not bits << 16";
  EXPECT_EQ(bad_back, 0) << "f32 -> bf16 does not invert bf16 -> f32";
}

// The views op: the dtypes pick the direction, the same bits as the two functions.
TEST(Bf16Convert, ViewsPickTheDirectionFromTheDtypes) {
  const std::int64_t rows = 3, cols = 37;
  const std::vector<float> x = testing::randn(rows * cols, 12, 10.0);
  std::vector<core::bf16> h(x.size());
  convert(cpu_ctx(),
          {.out = testing::view_of(h, {rows, cols}), .in = testing::view_of(x, {rows, cols})});
  EXPECT_TRUE(same_bits("convert f32 -> bf16", testing::fetch(h), expected_bits(x), x));
  std::vector<float> back(x.size()), back_want(x.size());
  convert(cpu_ctx(),
          {.out = testing::view_of(back, {rows, cols}), .in = testing::view_of(h, {rows, cols})});
  for (std::size_t i = 0; i < h.size(); ++i) back_want[i] = h[i].to_float();  // exact
  EXPECT_TRUE(testing::all_equal("convert bf16 -> f32", back, back_want));
  std::string e = testing::invalid_argument_of([&] {
    convert(cpu_ctx(),
            {.out = testing::view_of(back, {rows, cols}), .in = testing::view_of(x, {rows, cols})});
  });
  EXPECT_NE(e.find("convert: view `out` holds f32, the op needs bf16 (in is f32"),
            std::string::npos)
      << e;
  e = testing::invalid_argument_of([&] {
    convert(cpu_ctx(),
            {.out = testing::view_of(h, {cols, rows}), .in = testing::view_of(x, {rows, cols})});
  });
  EXPECT_NE(e.find("view `out` has shape (37, 3), the op needs (3, 37)"), std::string::npos) << e;
}

// The raw entry points' own checks (the backend contract, kernels/dispatch.h); a view of no
// elements needs no memory.
TEST(Bf16Convert, RejectsBadArguments) {
  std::vector<float> f(4);
  std::vector<core::bf16> h(4);
  convert(cpu_ctx(),
          {.out = core::view<core::bf16>(nullptr, {0}), .in = core::view<float>(nullptr, {0})});
  core::bf16* const h_dev = testing::dev(h);
  float* const f_dev = testing::dev(f);
  EXPECT_THROW(convert_f32_to_bf16(cpu_ctx(), h_dev, nullptr, 4), core::InvalidArgument);
  EXPECT_THROW(convert_f32_to_bf16(cpu_ctx(), h_dev, f_dev, -1), core::InvalidArgument);
  EXPECT_THROW(convert_bf16_to_f32(cpu_ctx(), nullptr, h_dev, 4), core::InvalidArgument);
  EXPECT_THROW(convert_bf16_to_f32(cpu_ctx(), f_dev, h_dev, -2), core::InvalidArgument);
  convert_f32_to_bf16(cpu_ctx(), nullptr, nullptr, 0);  // n = 0: nothing to touch
  convert_bf16_to_f32(cpu_ctx(), nullptr, nullptr, 0);
}

}  // namespace
}  // namespace trident::kernels
