// Helpers for the kernel tests: the backend this run tests and the buffers that follow it, seeded
// random fills, the |x - ref| <= atol + rtol*|ref| comparison with a failure message naming the
// tensor, the first bad index, both values and the max errors, and central finite differences for
// checking the reference backward passes in double.
// Set TRIDENT_PRINT_ERRORS=1 to print the max errors of every comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/core/view.h"

namespace trident::kernels::testing {

// The backend this run of the kernel tests exercises, from TRIDENT_TEST_BACKEND: "cpu-x86_64",
// "cpu-avx2", "cpu-avx512" (a CPU instruction-set variant), unset/"cpu" (the variant chosen at run
// time) or, in builds with CUDA (real or emulated), "cuda" (device 0, on a non-blocking stream the
// backend creates). CTest runs the whole binary once per backend the build has
// (tests/kernels/CMakeLists.txt), so a new backend adds no test files; backend_test.cc skips every
// test of a backend this machine cannot run, saying why.
struct TestBackend {
  const char* name = "cpu";
  core::ExecContext ctx{};
  // Why this machine cannot run the backend ("" when it can): no GPU, for instance.
  std::string unavailable;
};
// The same object for the whole run (the cuda backend's stream is made once).
const TestBackend& test_backend();
inline core::ExecContext backend_ctx() { return test_backend().ctx; }
inline bool on_cuda() { return backend_ctx().device.kind == core::DeviceKind::kCuda; }
// A device that is not the backend's: views on it are refused as "on another device".
inline core::Device other_device() {
  return on_cuda() ? core::Device{} : core::Device{core::DeviceKind::kCuda, 0};
}

// Tests of the CPU backend only (instruction-set variants, thread counts, oneDNN, the CPU bodies'
// own helpers, ops with no CUDA body) or of no backend at all (the references, host helpers) live
// in test suites named *CpuOnly, which the runs of other backends do not register
// (tests/kernels/CMakeLists.txt); their first statement is this guard, saying why. Run by hand on
// another backend they report SKIPPED with that reason, never passed.
#define TRIDENT_CPU_ONLY(why)                                                                      \
  if (::trident::kernels::testing::backend_ctx().device.kind != ::trident::core::DeviceKind::kCpu) \
  GTEST_SKIP() << "a test of the CPU backend only (" why "); the "                                 \
               << ::trident::kernels::testing::test_backend().name << " run does not register it"

// ---- Test buffers that follow the backend ----
//
// Tests hold host std::vectors. On the CPU backends the helpers below are the vectors themselves.
// On the cuda backend every vector handed to a kernel has a device mirror, kept coherent at each
// hand-over:
// - view_of(vec, shape), view_at(vec, offset, shape), dev(vec) and dev_span(vec) give the mirror
//   (made by uploading vec on first use) to a kernel;
// - all_close, all_equal and fetch(vec) bring a mirror's contents back before the host reads vec.
// At each of these the mirror is reconciled against a snapshot of what host and device held at
// the last hand-over: only the host changed -> upload; only the device changed (a kernel wrote
// it) -> download; neither -> nothing; both, differently -> the test fails, naming the buffer (a
// host write onto results it never fetched). So chained ops (one op's output is the next one's
// input) and accumulating ops called twice see the device's data, never a stale host copy, and a
// host edit is never lost. A mirror lives as long as its vector's memory: freeing that memory
// (the vector destroyed or reallocated) drops it (kernel_test_util.cc replaces operator delete
// for that), so a new vector at a reused address starts from its own contents. In-place use
// (.out = view_of(x), .in = view_of(x)) gets one device buffer. What the mechanism cannot see:
// - a host read of an output without fetch (a helper that returns results fetches them):
//   outputs start as NaN (or values the result must differ from), so such a read fails;
// - a host edit made after a view was taken and before that stored view is used: the edit goes
//   up at the next hand-over, so take views after editing their vectors.
// Use from the test's own thread. TestBuffers.* checks the mechanism itself;
// TRIDENT_TEST_BUFFERS_AUDIT=1 lists, per test, the buffers kernels wrote and nobody fetched.
namespace detail {
bool mirrors_enabled();
// The device mirror of [host, host + bytes), a whole vector's memory, reconciled first.
void* device_mirror(const void* host, std::size_t bytes);
// Reconciles every mirror overlapping [host, host + bytes) before the host reads it.
void sync_to_host(const void* host, std::size_t bytes);
// Frees every mirror (the global environment's TearDown).
void release_test_buffers();
}  // namespace detail

// The memory a kernel of this backend reads and writes for vec: vec.data() on the CPU, its device
// mirror on cuda.
template <class T>
T* dev(const std::vector<T>& v) {
  if (!detail::mirrors_enabled()) return const_cast<T*>(v.data());
  return static_cast<T*>(detail::device_mirror(v.data(), v.size() * sizeof(T)));
}

// Scratch for a kernel (the caller's working memory) as a span of this backend's memory.
template <class T>
std::span<T> dev_span(std::vector<T>& v) {
  return {dev(v), v.size()};
}

// Makes vec's host contents current (downloads what a kernel wrote) and returns it.
template <class T>
const std::vector<T>& fetch(const std::vector<T>& v) {
  if (detail::mirrors_enabled()) detail::sync_to_host(v.data(), v.size() * sizeof(T));
  return v;
}

// n values drawn from N(mean, stddev), reproducible from the seed.
template <class T = float>
std::vector<T> randn(std::int64_t n, std::uint64_t seed, double stddev = 1.0, double mean = 0.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// n values drawn uniformly from [lo, hi), reproducible from the seed.
template <class T = float>
std::vector<T> uniform(std::int64_t n, std::uint64_t seed, double lo, double hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

struct Tol {
  double atol = 1e-5;
  double rtol = 1e-5;
};

// Passes when every element satisfies |got - want| <= atol + rtol * |want| (NaN in either fails).
template <class A, class B>
::testing::AssertionResult all_close(const char* name, const A* got, const B* want, std::int64_t n,
                                     Tol tol) {
  if (detail::mirrors_enabled()) {
    detail::sync_to_host(got, static_cast<std::size_t>(n) * sizeof(A));
    detail::sync_to_host(want, static_cast<std::size_t>(n) * sizeof(B));
  }
  std::int64_t first_bad = -1, num_bad = 0;
  double max_abs = 0.0, max_rel = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double err = std::abs(g - w);
    const bool ok = err <= tol.atol + tol.rtol * std::abs(w);  // false for NaN
    if (!ok) {
      ++num_bad;
      if (first_bad < 0) first_bad = i;
    }
    // NaN errors stick, so that a NaN anywhere shows up in the reported maximum.
    if (std::isnan(err) || std::isnan(max_abs)) {
      max_abs = max_rel = std::nan("");
    } else {
      max_abs = std::max(max_abs, err);
      if (w != 0.0) max_rel = std::max(max_rel, err / std::abs(w));
    }
  }
  if (std::getenv("TRIDENT_PRINT_ERRORS") != nullptr) {  // to see the margin under the tolerance
    std::printf("  %-60s max abs err %.3g  max rel err %.3g  (atol %.3g, rtol %.3g)\n", name,
                max_abs, max_rel, tol.atol, tol.rtol);
  }
  if (num_bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << name << ": " << num_bad << " of " << n << " elements off (atol " << tol.atol << ", rtol "
     << tol.rtol << "); first bad index " << first_bad << ": got " << got[first_bad] << ", ref "
     << want[first_bad] << "; max abs err " << max_abs << ", max rel err " << max_rel;
  return ::testing::AssertionFailure() << os.str();
}

template <class A, class B>
::testing::AssertionResult all_close(const char* name, const std::vector<A>& got,
                                     const std::vector<B>& want, Tol tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << name << ": size " << got.size() << " vs ref size " << want.size();
  }
  return all_close(name, got.data(), want.data(), static_cast<std::int64_t>(got.size()), tol);
}

// Bitwise equality of two float vectors (determinism, causality, in-place use).
inline ::testing::AssertionResult all_equal(const char* name, const std::vector<float>& got,
                                            const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << name << ": size " << got.size() << " vs expected size " << want.size();
  }
  fetch(got);
  fetch(want);
  std::int64_t first_bad = -1, num_bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i])) {
      ++num_bad;
      if (first_bad < 0) first_bad = static_cast<std::int64_t>(i);
    }
  }
  if (num_bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << name << ": " << num_bad << " of " << got.size() << " elements not bitwise equal; first at "
     << first_bad << ": got " << got[first_bad] << ", expected " << want[first_bad];
  return ::testing::AssertionFailure() << os.str();
}

// d loss / d x[i] by central differences (loss reads x by reference), one element at a time.
inline std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& loss,
                                        double h = 1e-6) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2.0 * h);
  }
  return g;
}

// sum_i w[i] * y[i]: the scalar whose gradient with respect to y is w.
inline double dot(const std::vector<double>& w, const std::vector<double>& y) {
  double s = 0.0;
  for (std::size_t i = 0; i < w.size(); ++i) s += w[i] * y[i];
  return s;
}

// The tolerance of a LayerNorm input gradient, base plus what its rstd amplifies: d_in is rstd
// times a bracket (g - mean(g) - xhat mean(g xhat), g = d_out w) whose terms, of size max |g|,
// cancel exactly in a row of zero variance (one column). rstd is then 1/sqrt(eps) ~ 316, and where
// the compiler contracts d_out * w - mean(g) into an FMA (the AVX2 and AVX-512 builds, nvcc) the
// bracket keeps the rounding of d_out * w: the absolute part gains 4 FP32 ulps of max |g| times
// the largest rstd (~1e-6 for rows of unit variance, ~5e-4 for one-column rows).
inline Tol layernorm_d_in_tol(Tol base, const std::vector<float>& rstd,
                              const std::vector<float>& d_out, const std::vector<float>& weight) {
  double max_rstd = 0.0, max_g = 0.0;
  for (float r : rstd) max_rstd = std::max(max_rstd, static_cast<double>(std::abs(r)));
  for (std::size_t i = 0; i < d_out.size(); ++i) {
    max_g = std::max(max_g, std::abs(static_cast<double>(d_out[i]) * weight[i % weight.size()]));
  }
  return {base.atol + 4.0 * 0x1.0p-23 * max_g * max_rstd, base.rtol};
}

// The tolerance for comparing a double-precision analytic gradient with central differences at
// step 1e-6: truncation error O(h^2) ~ 1e-12 and cancellation error ~ 1e-16 / 1e-6 = 1e-10.
inline constexpr Tol kFiniteDiffTol{1e-7, 1e-6};

// A test buffer as a typed view of this backend's memory (the ops' Views entry points); the shape
// must cover the buffer exactly.
template <class T>
core::TensorView view_of(const std::vector<T>& v, core::Shape shape) {
  EXPECT_EQ(shape.numel(), static_cast<std::int64_t>(v.size()))
      << "view_of: shape " << core::to_string(shape) << " does not cover the buffer";
  return core::view(dev(v), shape, backend_ctx().device);
}

// A view of part of a buffer, from element `offset` (an operand inside a larger buffer, as the
// model's flat weight and gradient buffers hold them: its address is only element-aligned).
template <class T>
core::TensorView view_at(const std::vector<T>& v, std::int64_t offset, core::Shape shape) {
  EXPECT_TRUE(offset >= 0 && offset + shape.numel() <= static_cast<std::int64_t>(v.size()))
      << "view_at: elements [" << offset << ", " << offset + shape.numel() << ") of a buffer of "
      << v.size();
  return core::view(dev(v) + offset, shape, backend_ctx().device);
}

// A view of vec's memory on this backend that claims `shape`, which need not fit the buffer: for
// the views' shape checks, which refuse it before any element is read.
template <class T>
core::TensorView view_claiming(const std::vector<T>& v, core::Shape shape) {
  return core::view(dev(v), shape, backend_ctx().device);
}

// The message of the core::InvalidArgument that fn() throws, or "no error".
template <class F>
std::string invalid_argument_of(F&& fn) {
  try {
    fn();
  } catch (const core::InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace trident::kernels::testing
