// MT19937 exactly as numpy's legacy numpy.random.RandomState draws it, so that dataset index
// shuffles (GPTDataset document/shuffle indices) are bit-identical to Megatron's. Only the pieces
// Megatron uses are here: integer seeding, 32/64-bit draws, bounded integers, in-place shuffle.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace trident::data {

// The Mersenne Twister of Matsumoto & Nishimura with numpy's legacy seeding and helpers.
//
// Contract (verified against numpy 1.24 in tests/data/mt19937_test.cc):
//  * Mt19937(seed) == numpy.random.RandomState(seed) for 0 <= seed < 2^32: the state is filled by
//    the reference init_genrand(seed) (numpy's `_legacy_seeding` for an int seed), not by
//    init_by_array.
//  * next_uint32() is one tempered MT output; next_uint64() is (first << 32) | second.
//  * random_interval(max) is numpy's legacy `random_interval`: a uniform integer in [0, max] by
//    masked rejection (mask = max with all lower bits set; draw 32 bits when max fits in 32 bits,
//    else 64 bits; retry while the masked value exceeds max). It also equals
//    RandomState.randint(0, max + 1, dtype=int64) for max != 2^32 - 1.
//  * shuffle(a) is RandomState.shuffle on a 1-D array: for i = n-1 down to 1,
//    j = random_interval(i), swap a[i], a[j]. The element type does not change the draws.
// Consecutive calls continue from the same state, as numpy's do. Not thread-safe.
class Mt19937 {
 public:
  explicit Mt19937(std::uint32_t seed);

  std::uint32_t next_uint32();
  std::uint64_t next_uint64();
  std::uint64_t random_interval(std::uint64_t max);

  template <class T>
  void shuffle(std::span<T> a) {
    const std::int64_t n = static_cast<std::int64_t>(a.size());
    for (std::int64_t i = n - 1; i >= 1; --i) {
      const auto j = static_cast<std::size_t>(random_interval(static_cast<std::uint64_t>(i)));
      std::swap(a[static_cast<std::size_t>(i)], a[j]);
    }
  }

 private:
  void regenerate();

  static constexpr int kStateSize = 624;
  std::array<std::uint32_t, kStateSize> state_{};
  int pos_ = kStateSize;
};

}  // namespace trident::data
