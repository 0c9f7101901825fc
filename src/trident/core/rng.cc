#include "trident/core/rng.h"

#include <cmath>
#include <numbers>

namespace trident::core {

namespace {
constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace

Philox4x32 philox4x32(Philox4x32 c, std::array<std::uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

namespace {
Philox4x32 draw(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return philox4x32({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                     static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                    {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}
// 53 random bits -> (0, 1].
double to_unit(std::uint32_t a, std::uint32_t b) {
  const std::uint64_t bits = (static_cast<std::uint64_t>(a) << 21) ^ (b >> 11);
  return (static_cast<double>(bits & ((1ull << 53) - 1)) + 1.0) * 0x1.0p-53;
}
}  // namespace

double philox_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const Philox4x32 r = draw(seed, stream, index);
  return to_unit(r[0], r[1]);
}

double philox_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const Philox4x32 r = draw(seed, stream, index);
  const double u1 = to_unit(r[0], r[1]);
  const double u2 = to_unit(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace trident::core
