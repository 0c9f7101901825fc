// core/: bf16 rounding, Philox RNG, shapes, arenas and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "trident/core/arena.h"
#include "trident/core/bf16.h"
#include "trident/core/error.h"
#include "trident/core/rng.h"
#include "trident/core/tensor.h"

namespace trident::core {
namespace {

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits32(std::uint32_t u) { return std::bit_cast<float>(u); }

// Reference rounding computed in double: the bf16 value nearest to f, ties to the even mantissa.
float nearest_bf16_double(float f) {
  const std::uint32_t u = bits_of(f);
  const float lo = from_bits32(u & 0xffff0000u);
  const float hi = from_bits32((u & 0xffff0000u) + 0x10000u);
  const double dlo = std::abs(static_cast<double>(f) - lo);
  const double dhi = std::abs(static_cast<double>(hi) - f);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return ((u >> 16) & 1u) ? hi : lo;  // tie: keep the even one
}

TEST(Bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f}) {
    EXPECT_EQ(bf16::from_float(f).to_float(), f);
  }
  EXPECT_EQ(bf16::from_float(-0.0f).bits, 0x8000u);
}

TEST(Bf16, TiesRoundToEven) {
  // 1 + 2^-8 is exactly half-way between 1 and 1 + 2^-7: round to even -> 1.
  EXPECT_EQ(bf16::from_float(1.0f + 0x1.0p-8f).to_float(), 1.0f);
  // 1 + 3*2^-8 is half-way between 1+2^-7 (odd) and 1+2^-6 (even) -> 1+2^-6.
  EXPECT_EQ(bf16::from_float(1.0f + 3 * 0x1.0p-8f).to_float(), 1.0f + 0x1.0p-6f);
  // Just above the tie rounds up.
  EXPECT_EQ(bf16::from_float(from_bits32(bits_of(1.0f + 0x1.0p-8f) + 1)).to_float(),
            1.0f + 0x1.0p-7f);
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16::from_float(inf).to_float(), inf);
  EXPECT_EQ(bf16::from_float(-inf).to_float(), -inf);
  EXPECT_TRUE(std::isnan(bf16::from_float(std::nanf("")).to_float()));
  // A NaN whose payload sits only in the low bits must not round to infinity.
  EXPECT_TRUE(std::isnan(bf16::from_float(from_bits32(0x7f800001u)).to_float()));
  // The largest finite float rounds up to infinity (as IEEE RNE demands).
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::max()).to_float(), inf);
  // Subnormals round like any other value.
  const float sub = from_bits32(0x00012345u);
  EXPECT_EQ(bf16::from_float(sub).to_float(), nearest_bf16_double(sub));
}

TEST(Bf16, MatchesDoubleReferenceOnSweep) {
  std::uint32_t u = 12345;
  for (int i = 0; i < 200000; ++i) {
    u = u * 1664525u + 1013904223u;
    const float f = from_bits32(u);
    if (!std::isfinite(f) || std::abs(f) > 3.0e38f) continue;
    ASSERT_EQ(bf16::from_float(f).to_float(), nearest_bf16_double(f)) << "bits " << std::hex << u;
  }
}

TEST(Philox, KnownAnswer) {
  // Random123's published known-answer vector for philox4x32-10 with all-ones input.
  const Philox4x32 r =
      philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r[0], 0x408f276du);
  EXPECT_EQ(r[1], 0x41c83b0eu);
  EXPECT_EQ(r[2], 0xa20bc7c6u);
  EXPECT_EQ(r[3], 0x6d5451fdu);
  const Philox4x32 z = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(z[0], 0x6627e8d5u);
  EXPECT_EQ(z[1], 0xe169c58du);
  EXPECT_EQ(z[2], 0xbc57ac4cu);
  EXPECT_EQ(z[3], 0x9b00dbd8u);
}

TEST(Philox, NormalIsAPureFunctionWithTheRightMoments) {
  EXPECT_EQ(philox_normal(7, 3, 1000), philox_normal(7, 3, 1000));
  EXPECT_NE(philox_normal(7, 3, 1000), philox_normal(7, 4, 1000));
  EXPECT_NE(philox_normal(7, 3, 1000), philox_normal(8, 3, 1000));
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = philox_normal(1234, 1, static_cast<std::uint64_t>(i));
    sum += x;
    sum_sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.01);
}

TEST(Shape, NumelAndEquality) {
  EXPECT_EQ((Shape{2, 3, 4}).numel(), 24);
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ((Shape{2, 3}), (Shape{2, 3}));
  EXPECT_FALSE((Shape{2, 3}) == (Shape{3, 2}));
  EXPECT_EQ(to_string(Shape{2, 3}), "(2, 3)");
}

TEST(Arena, AlignedDisjointZeroedAllocations) {
  Arena arena(4096);
  TensorView a = arena.alloc(DType::kF32, {3});
  TensorView b = arena.alloc(DType::kBF16, {5, 2});
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data) % Arena::kAlign, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data) % Arena::kAlign, 0u);
  EXPECT_GE(static_cast<char*>(b.data) - static_cast<char*>(a.data), 12);
  EXPECT_EQ(a.as<float>()[2], 0.0f);
  EXPECT_THROW(a.as<bf16>(), InternalError);
  EXPECT_THROW(arena.alloc(DType::kF32, {2000}), InternalError);
}

TEST(Errors, CheckNamesTheProblem) {
  try {
    const int heads = 5;
    TRIDENT_CHECK(heads == 4, "--num-attention-heads (", heads, ") must be 4");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--num-attention-heads (5) must be 4"), std::string::npos);
  }
  EXPECT_THROW(TRIDENT_ASSERT(1 == 2, "bug"), InternalError);
}

}  // namespace
}  // namespace trident::core
