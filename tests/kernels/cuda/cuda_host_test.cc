// The parts of the CUDA backend that run on the host, so that they are checked on every machine
// (also without a GPU): the Philox stream and BF16 rounding shared by the kernels (kernels/cuda/
// philox.h) against core's, and the error a CUDA op gives when there is no GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "trident/core/bf16.h"
#include "trident/core/error.h"
#include "trident/core/rng.h"
#include "trident/kernels/cuda/device.h"
#include "trident/kernels/cuda/philox.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/flash_attention.h"

namespace trident::kernels {
namespace {

TEST(CudaHost, PhiloxIsCoresStream) {
  std::mt19937_64 gen(1);
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t seed = gen(), stream = gen() >> (i % 64), index = gen() >> (i % 61);
    ASSERT_EQ(cuda::philox_uniform(seed, stream, index), core::philox_uniform(seed, stream, index))
        << "seed " << seed << " stream " << stream << " index " << index;
    const float p = static_cast<float>(i % 10) / 10.0f;
    ASSERT_EQ(cuda::dropout_keep(seed, stream, index, p), dropout_keep(seed, stream, index, p));
  }
}

TEST(CudaHost, Bf16RoundingIsCores) {
  std::mt19937 gen(2);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t bits = gen();
    ASSERT_EQ(cuda::bf16_bits_from_float_bits(bits),
              core::bf16::from_float(std::bit_cast<float>(bits)).bits)
        << "bits " << bits;
  }
  for (float f : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), std::nanf(""),
                  std::numeric_limits<float>::denorm_min(), 1.0f + 0x1.0p-8f}) {
    EXPECT_EQ(cuda::bf16_bits_from_float_bits(std::bit_cast<std::uint32_t>(f)),
              core::bf16::from_float(f).bits);
  }
}

// Run by CTest with CUDA_VISIBLE_DEVICES set empty (tests/kernels/cuda/CMakeLists.txt), so that
// the CUDA runtime sees no GPU on every machine, with a GPU or without, real or emulated: a CUDA
// op is then Unavailable, saying why.
TEST(NoGpu, ACudaOpSaysSo) {
  ASSERT_EQ(cuda::device_count(), 0)
      << "this test needs CUDA_VISIBLE_DEVICES= (empty) set before the process starts";
  EXPECT_FALSE(cuda::no_device_reason().empty());
  float x = 1.0f;
  try {
    scale_inplace(cuda::cuda_context(0), &x, 2.0f, 1);
    FAIL() << "a CUDA op ran without a GPU";
  } catch (const core::Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("GPU"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident::kernels
