// MT19937 (Matsumoto & Nishimura 1998) with numpy's legacy seeding and bounded draws; see
// mt19937.h for the contract and the numpy functions each method reproduces.
#include "trident/data/mt19937.h"

namespace trident::data {

namespace {
constexpr int kShift = 397;  // the "m" of MT19937
constexpr std::uint32_t kMatrixA = 0x9908b0dfu;
constexpr std::uint32_t kUpperMask = 0x80000000u;
constexpr std::uint32_t kLowerMask = 0x7fffffffu;
}  // namespace

Mt19937::Mt19937(std::uint32_t seed) {
  // init_genrand: x[0] = seed, x[i] = 1812433253 * (x[i-1] ^ (x[i-1] >> 30)) + i (mod 2^32).
  state_[0] = seed;
  for (int i = 1; i < kStateSize; ++i) {
    const std::uint32_t prev = state_[static_cast<std::size_t>(i - 1)];
    state_[static_cast<std::size_t>(i)] =
        1812433253u * (prev ^ (prev >> 30)) + static_cast<std::uint32_t>(i);
  }
  pos_ = kStateSize;  // the first draw regenerates the whole block
}

void Mt19937::regenerate() {
  auto twist = [](std::uint32_t upper, std::uint32_t lower, std::uint32_t far) {
    const std::uint32_t y = (upper & kUpperMask) | (lower & kLowerMask);
    return far ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
  };
  for (int k = 0; k < kStateSize; ++k) {
    const auto i = static_cast<std::size_t>(k);
    const auto next = static_cast<std::size_t>((k + 1) % kStateSize);
    const auto far = static_cast<std::size_t>((k + kShift) % kStateSize);
    state_[i] = twist(state_[i], state_[next], state_[far]);
  }
  pos_ = 0;
}

std::uint32_t Mt19937::next_uint32() {
  if (pos_ >= kStateSize) regenerate();
  std::uint32_t y = state_[static_cast<std::size_t>(pos_++)];
  // Tempering.
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

std::uint64_t Mt19937::next_uint64() {
  const std::uint64_t hi = next_uint32();
  return (hi << 32) | next_uint32();
}

std::uint64_t Mt19937::random_interval(std::uint64_t max) {
  if (max == 0) return 0;
  std::uint64_t mask = max;
  for (int s = 1; s <= 32; s *= 2) mask |= mask >> s;
  std::uint64_t value = 0;
  if (max <= 0xffffffffull) {
    do {
      value = next_uint32() & mask;
    } while (value > max);
  } else {
    do {
      value = next_uint64() & mask;
    } while (value > max);
  }
  return value;
}

}  // namespace trident::data
