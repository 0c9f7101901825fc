// Philox4x32-10 and the dropout decision as host/device functions: the same arithmetic as
// core/rng.cc (philox_uniform) and kernels/flash_attention.cc (dropout_keep), so a CUDA kernel
// draws exactly the CPU's masks. tests/kernels/cuda_host_test.cc compares them on the host with
// core's functions (that part runs without a GPU), and the CUDA tests compare the masks in use.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TRIDENT_HD __host__ __device__ __forceinline__
#else
#define TRIDENT_HD inline
#endif

namespace trident::kernels::cuda {

struct Philox4 {
  std::uint32_t x[4];
};

TRIDENT_HD Philox4 philox4x32_10(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                 std::uint32_t c3, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32),
                        lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32),
                        lo1 = static_cast<std::uint32_t>(p1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// core::philox_uniform: uniform in (0, 1] from 53 bits of the block for (seed, stream, index).
TRIDENT_HD double philox_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const Philox4 r =
      philox4x32_10(static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                    static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32),
                    static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  const std::uint64_t bits = (static_cast<std::uint64_t>(r.x[0]) << 21) ^ (r.x[1] >> 11);
  return (static_cast<double>(bits & ((1ull << 53) - 1)) + 1.0) * 0x1.0p-53;
}

// kernels::dropout_keep: word index % 4 of the block for counter index / 4, kept when it is at
// least floor(p 2^32).
TRIDENT_HD bool dropout_keep(std::uint64_t seed, std::uint64_t stream, std::uint64_t index,
                             float p) {
  const std::uint64_t block = index >> 2;
  const Philox4 r =
      philox4x32_10(static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                    static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32),
                    static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  return static_cast<double>(r.x[index & 3]) >= floor(static_cast<double>(p) * 0x1.0p32);
}

// core::bf16::from_float's bits: round to nearest even, NaN kept quiet with its sign.
TRIDENT_HD std::uint16_t bf16_bits_from_float_bits(std::uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

}  // namespace trident::kernels::cuda
