// The kernel tests' own machinery (kernel_test_util.h, "Test buffers that follow the backend"):
// on the cuda backend a vector handed to a kernel has a device mirror that is reconciled at every
// hand-over; on the CPU backends the helpers are the vectors themselves. Each test states what
// must hold on either, and on cuda the cases a wrong design gets wrong: a missing fetch, chained
// and accumulating ops, a host edit, a vector at a freed address, in-place aliasing.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/fill.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRIDENT_HAS_ASAN 1
#endif
#endif
#ifndef TRIDENT_HAS_ASAN
#define TRIDENT_HAS_ASAN 0
#endif

namespace trident::kernels {
namespace {

using testing::view_of;

constexpr std::int64_t kN = 1000;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

core::ExecContext ctx() { return testing::backend_ctx(); }

// A kernel's output is on the device until fetched: a test that reads it without fetch sees the
// host's old contents (NaN here) and fails; all_close and fetch bring it back.
TEST(TestBuffers, AKernelsOutputReachesTheHostOnlyThroughFetch) {
  std::vector<float> out(kN, kNaN);
  fill(ctx(), {.out = view_of(out, {kN}), .value = 2.0f});
  const std::vector<float> want(kN, 2.0f);
  if (testing::on_cuda()) {
    EXPECT_TRUE(std::isnan(out[0])) << "the host copy changed without a fetch";
    // A comparison of the host copy without fetch: must fail (the test that forgot it fails).
    EXPECT_NONFATAL_FAILURE(EXPECT_EQ(out[kN - 1], 2.0f) << "read without fetch",
                            "read without fetch");
  }
  EXPECT_TRUE(testing::all_close("out", out, want, {0, 0}));  // fetches
  EXPECT_EQ(out[kN - 1], 2.0f);                               // and the host copy is now current
}

// One op's output as the next op's input, and an accumulating op called twice: each call sees the
// device's data (a design that re-uploaded the stale host copy at each view_of would give 2, not
// 4, and 1 + 4 = 5, not 6), with fresh and with stored views.
TEST(TestBuffers, ChainedAndAccumulatingOpsSeeTheDevicesData) {
  std::vector<float> x(kN, 1.0f), y(kN, kNaN), z(kN, 1.0f);
  scale(ctx(), {.x = view_of(x, {kN}), .s = 2.0f});
  scale(ctx(), {.x = view_of(x, {kN}), .s = 2.0f});  // fresh view: x is 4
  const core::TensorView stored = view_of(y, {kN});
  copy(ctx(), {.out = stored, .in = view_of(x, {kN})});  // y = x, never fetched
  add(ctx(), {.out = view_of(z, {kN}), .a = view_of(z, {kN}), .b = stored});  // z += y
  add(ctx(), {.out = view_of(z, {kN}), .a = view_of(z, {kN}), .b = view_of(y, {kN})});
  EXPECT_TRUE(testing::all_equal("x", x, std::vector<float>(kN, 4.0f)));
  EXPECT_TRUE(testing::all_equal("y", y, std::vector<float>(kN, 4.0f)));
  EXPECT_TRUE(testing::all_equal("z", z, std::vector<float>(kN, 9.0f)));
}

// A host edit reaches the kernel at the next hand-over (view_of, dev), and editing results that
// were never fetched is refused, naming the mistake: the edit would overwrite them unseen.
TEST(TestBuffers, HostEditsAreUploadedAndEditsOfUnfetchedResultsRefused) {
  std::vector<float> x(kN, 1.0f), y(kN, kNaN);
  copy(ctx(), {.out = view_of(y, {kN}), .in = view_of(x, {kN})});
  x[7] = 5.0f;  // x was only read by the kernel: the host edit is the newer
  copy(ctx(), {.out = view_of(y, {kN}), .in = view_of(x, {kN})});
  EXPECT_EQ(testing::fetch(y)[7], 5.0f);
  fill(ctx(), {.out = view_of(y, {kN}), .value = 3.0f});
  y[0] = -1.0f;  // onto results never fetched
  if (testing::on_cuda()) {
    try {
      (void)view_of(y, {kN});
      ADD_FAILURE() << "a host edit of unfetched results was accepted";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("never fetched"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(view_of(y, {kN}).data, y.data());
  }
}

// A vector allocated where a dead one was (malloc hands the same block back) starts from its own
// contents, even when they equal what the dead one's mirror last saw and the dead one's device
// copy holds results never fetched: its mirror died with its memory.
TEST(TestBuffers, AVectorAtAFreedAddressStartsFromItsOwnContents) {
  std::uintptr_t address = 0;  // only the number: the vector is gone when it is compared
  // Reserved first, so that nothing is allocated between the free and the tries (a small block
  // carved from the freed one would keep it from coming back: heap-layout luck otherwise).
  std::vector<std::vector<float>> tries;
  tries.reserve(64);
  {
    std::vector<float> dead(kN, 1.0f);
    address = reinterpret_cast<std::uintptr_t>(dead.data());
    fill(ctx(), {.out = view_of(dead, {kN}), .value = 2.0f});  // never fetched
  }
  const auto at = [](const std::vector<float>& v) {
    return reinterpret_cast<std::uintptr_t>(v.data());
  };
  for (int i = 0; i < 64 && (tries.empty() || at(tries.back()) != address); ++i) {
    tries.emplace_back(kN, 1.0f);
  }
#if defined(__SANITIZE_ADDRESS__) || TRIDENT_HAS_ASAN
  // ASan's quarantine keeps freed blocks out of reuse: the normal and emulated builds run this.
  if (at(tries.back()) != address)
    GTEST_SKIP() << "ASan's quarantine did not hand the freed block back: cannot be set up";
#endif
  ASSERT_EQ(at(tries.back()), address)
      << "malloc did not hand the freed block back in 64 tries: the case cannot be set up";
  std::vector<float> out(kN, kNaN);
  copy(ctx(), {.out = view_of(out, {kN}), .in = view_of(tries.back(), {kN})});
  EXPECT_TRUE(testing::all_equal("copy of the new vector", out, std::vector<float>(kN, 1.0f)));
}

// In-place use maps to one buffer of the backend's memory; a view into a buffer is that memory at
// the element offset (4-byte aligned only, as in a flat parameter buffer).
TEST(TestBuffers, AliasesAndOffsetsMapToTheSameMemory) {
  std::vector<float> x(kN, 1.0f);
  const core::TensorView a = view_of(x, {kN}), b = view_of(x, {kN});
  EXPECT_EQ(a.data, b.data);
  EXPECT_EQ(a.data, testing::dev(x));
  EXPECT_EQ(a.device, ctx().device);
  EXPECT_EQ(testing::view_at(x, 3, {5}).data, testing::dev(x) + 3);
  if (testing::on_cuda()) {
    EXPECT_NE(a.data, x.data()) << "the cuda backend must not hand host memory to a kernel";
  } else {
    EXPECT_EQ(a.data, x.data());
  }
  fill(ctx(), {.out = testing::view_at(x, 3, {5}), .value = -1.0f});
  testing::fetch(x);
  for (std::int64_t i = 0; i < kN; ++i) EXPECT_EQ(x[i], i >= 3 && i < 8 ? -1.0f : 1.0f) << i;
}

}  // namespace
}  // namespace trident::kernels
