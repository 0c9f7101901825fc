// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A value is a pure function of
// (seed, stream, index): parameter initialization keys the stream by the parameter's id and the
// index by the element's *global* index, so every parallel layout draws the same weights, and
// dropout keys it by (layer, micro-batch, element), independent of thread counts.
#pragma once

#include <array>
#include <cstdint>

namespace trident::core {

using Philox4x32 = std::array<std::uint32_t, 4>;

// One Philox4x32-10 block: counter (4 words) under key (2 words).
Philox4x32 philox4x32(Philox4x32 counter, std::array<std::uint32_t, 2> key);

// Uniform in (0, 1], from (seed, stream, index).
double philox_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);
// Standard normal N(0, 1) by Box-Muller, from (seed, stream, index).
double philox_normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

// A stable 64-bit id of a string (FNV-1a); used to turn parameter names into RNG streams.
constexpr std::uint64_t fnv1a64(const char* s) {
  std::uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) {
    h ^= static_cast<unsigned char>(*s);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace trident::core
