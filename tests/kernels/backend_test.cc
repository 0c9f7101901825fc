// The kernel tests' backend loop (see kernel_test_util.h): a global environment that skips every
// test when this machine cannot run the backend (and names the GPU on the cuda backend), and tests
// of the run-time instruction-set choice itself (CPU-only: the cuda run does not register them).
#include "trident/kernels/backend.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "trident/core/error.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/layernorm.h"
#ifdef TRIDENT_TEST_CUDA
#include "trident/kernels/cuda/device.h"
#endif

namespace trident::kernels::testing {

namespace {

class BackendEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const TestBackend& b = test_backend();
    if (b.ctx.device.kind == core::DeviceKind::kCuda) {
      // The message CTest reads as skipped in a CUDA build without a GPU
      // (tests/kernels/CMakeLists.txt); nothing else may skip in the cuda runs.
      if (!b.unavailable.empty())
        GTEST_SKIP() << "backend cuda: CUDA tests need a GPU: " << b.unavailable;
#ifdef TRIDENT_TEST_CUDA
      std::printf("kernel tests on backend cuda (device 0: %s; stream %p, non-blocking)\n",
                  cuda::device_name(0).c_str(), b.ctx.stream);
#endif
      return;
    }
    if (!cpu_built(b.ctx.cpu_isa)) {
      GTEST_SKIP() << "backend " << b.name << ": this build has no " << cpu_isa_name(b.ctx.cpu_isa)
                   << " kernels (TRIDENT_CPU_ISAS=" << cpu_isas_built()
                   << "; the sanitizer build compiles only the baseline)";
    }
    if (!cpu_supports(b.ctx.cpu_isa)) {
      GTEST_SKIP() << "backend " << b.name << ": this processor lacks the instructions of the "
                   << cpu_isa_name(b.ctx.cpu_isa) << " kernels (it runs "
                   << cpu_isa_name(best_cpu_isa()) << ")";
    }
    std::printf("kernel tests on backend %s (CPU kernels: %s)\n", b.name, cpu_ops(b.ctx).isa);
  }
  void TearDown() override {
    detail::release_test_buffers();
#ifdef TRIDENT_TEST_CUDA
    const TestBackend& b = test_backend();
    if (b.ctx.stream != nullptr) cuda::destroy_stream(b.ctx.stream);
#endif
  }
};

[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new BackendEnvironment);

// The variant chosen at run time is the widest this build has and this processor runs, and the
// dispatch takes it.
TEST(IsaCpuOnly, AutoTakesTheWidestVariantTheProcessorRuns) {
  TRIDENT_CPU_ONLY("the CPU instruction-set choice");
  const bool avx512 = cpu_built(core::CpuIsa::kAvx512) && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  const bool avx2 = cpu_built(core::CpuIsa::kAvx2) && __builtin_cpu_supports("avx2") &&
                    __builtin_cpu_supports("fma");
  const core::CpuIsa want = avx512 ? core::CpuIsa::kAvx512
                            : avx2 ? core::CpuIsa::kAvx2
                                   : core::CpuIsa::kX86_64;
  EXPECT_EQ(best_cpu_isa(), want);
  const core::ExecContext automatic{};
  EXPECT_STREQ(cpu_ops(automatic).isa, cpu_isa_name(want));
  RecordProperty("cpu_kernels", cpu_ops(automatic).isa);
}

TEST(IsaCpuOnly, PinnedVariantIsTheOneThatRuns) {
  TRIDENT_CPU_ONLY("the CPU instruction-set choice");
  core::ExecContext ctx{};
  ctx.cpu_isa = core::CpuIsa::kX86_64;
  EXPECT_STREQ(cpu_ops(ctx).isa, "x86_64");
  ctx.cpu_isa = core::CpuIsa::kAvx2;
  if (cpu_built(core::CpuIsa::kAvx2) && cpu_supports(core::CpuIsa::kAvx2)) {
    EXPECT_STREQ(cpu_ops(ctx).isa, "avx2");
  } else {
    EXPECT_THROW((void)cpu_ops(ctx), core::InvalidArgument);
  }
}

// The sanitizer build compiles only the baseline (TRIDENT_CPU_ISAS=x86_64): asking for a variant
// it lacks is an error that says so, not another variant's kernels.
TEST(IsaCpuOnly, AVariantTheBuildLacksIsAClearError) {
  TRIDENT_CPU_ONLY("the CPU instruction-set choice");
  bool missing = false;
  for (const core::CpuIsa isa : {core::CpuIsa::kAvx2, core::CpuIsa::kAvx512}) {
    if (cpu_built(isa)) continue;
    missing = true;
    core::ExecContext ctx{};
    ctx.cpu_isa = isa;
    try {
      (void)cpu_ops(ctx);
      ADD_FAILURE() << "expected an error for " << cpu_isa_name(isa);
    } catch (const core::InvalidArgument& e) {
      EXPECT_NE(std::strstr(e.what(), "this build has no"), nullptr) << e.what();
      EXPECT_NE(std::strstr(e.what(), cpu_isas_built()), nullptr) << e.what();
    }
  }
  if (!missing) GTEST_SKIP() << "this build has every variant (" << cpu_isas_built() << ")";
}

TEST(IsaCpuOnly, AVariantTheProcessorLacksIsAClearError) {
  TRIDENT_CPU_ONLY("the CPU instruction-set choice");
  if (!cpu_built(core::CpuIsa::kAvx512)) {
    GTEST_SKIP() << "this build has no avx512 kernels (TRIDENT_CPU_ISAS=" << cpu_isas_built()
                 << "): AVariantTheBuildLacksIsAClearError checks that error";
  }
  if (cpu_supports(core::CpuIsa::kAvx512)) GTEST_SKIP() << "this processor has AVX-512";
  core::ExecContext ctx{};
  ctx.cpu_isa = core::CpuIsa::kAvx512;
  try {
    (void)cpu_ops(ctx);
    FAIL() << "expected an error";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::strstr(e.what(), "lacks AVX-512"), nullptr) << e.what();
  }
}

// A CUDA tensor: without CUDA in the build the op is Unavailable, naming it; in a build with CUDA
// (real or emulated) a typed view that claims a CUDA device but holds host memory is refused by
// the views' memory check, naming the op, the view and the memory.
TEST(DispatchCpuOnly, HostMemoryInACudaViewIsAClearError) {
  TRIDENT_CPU_ONLY("its own CUDA context, the same on every backend");
  core::ExecContext ctx{};
  ctx.device = {core::DeviceKind::kCuda, 0};
  std::vector<float> x(4, 1.0f), y(4), mean(1), rstd(1), w(4, 1.0f), b(4);
  const core::Device dev = ctx.device;
  const LayerNormViews v{.out = core::view(y.data(), {1, 4}, dev),
                         .mean = core::view(mean.data(), {1}, dev),
                         .rstd = core::view(rstd.data(), {1}, dev),
                         .in = core::view(x.data(), {1, 4}, dev),
                         .weight = core::view(w.data(), {4}, dev),
                         .bias = core::view(b.data(), {4}, dev)};
  try {
    layernorm(ctx, v);
    FAIL() << "expected an error";
  } catch (const core::InvalidArgument& e) {
    EXPECT_TRUE(cuda_built()) << e.what();
    EXPECT_NE(std::string(e.what()).find("layernorm: view `in` is host memory"), std::string::npos)
        << e.what();
  } catch (const core::Unavailable& e) {
    EXPECT_FALSE(cuda_built()) << e.what();
    EXPECT_NE(std::string(e.what()).find("layernorm_forward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident::kernels::testing
