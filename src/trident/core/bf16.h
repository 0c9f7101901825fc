// bf16: the upper 16 bits of an IEEE float32. Conversion from float rounds to nearest, ties to
// even; NaN stays NaN (quiet), infinities and signed zeros are preserved.
#pragma once

#include <bit>
#include <cstdint>

namespace trident::core {

struct bf16 {
  std::uint16_t bits = 0;

  static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  static constexpr bf16 from_float(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the sign, force a quiet NaN
      return from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));
    }
    // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return from_bits(static_cast<std::uint16_t>((u + rounding) >> 16));
  }
  constexpr float to_float() const {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  friend constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

inline constexpr float round_to_bf16(float f) { return bf16::from_float(f).to_float(); }

}  // namespace trident::core
