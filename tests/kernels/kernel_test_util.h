// Helpers for the kernel tests: seeded random fills, the |x - ref| <= atol + rtol*|ref| comparison
// with a failure message naming the tensor, the first bad index, both values and the max errors,
// and central finite differences for checking the reference backward passes in double.
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
#include <sstream>
#include <string>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/core/view.h"

namespace trident::kernels::testing {

// The backend this run of the kernel tests exercises, from TRIDENT_TEST_BACKEND: "cpu-x86_64",
// "cpu-avx2", "cpu-avx512" (a CPU instruction-set variant) or unset/"cpu" (the variant chosen at
// run time). CTest runs the whole binary once per backend the build has
// (tests/kernels/CMakeLists.txt), so a new backend adds no test files; backend_test.cc skips every
// test of a backend this machine cannot run, saying why.
struct TestBackend {
  const char* name = "cpu";
  core::ExecContext ctx{};
};
TestBackend test_backend();
inline core::ExecContext backend_ctx() { return test_backend().ctx; }

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

// The tolerance for comparing a double-precision analytic gradient with central differences at
// step 1e-6: truncation error O(h^2) ~ 1e-12 and cancellation error ~ 1e-16 / 1e-6 = 1e-10.
inline constexpr Tol kFiniteDiffTol{1e-7, 1e-6};

// A test buffer as a typed view on the host (the ops' Views entry points); the shape must cover
// the buffer exactly.
template <class T>
core::TensorView view_of(const std::vector<T>& v, core::Shape shape) {
  EXPECT_EQ(shape.numel(), static_cast<std::int64_t>(v.size()))
      << "view_of: shape " << core::to_string(shape) << " does not cover the buffer";
  return core::view(v.data(), shape);
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
