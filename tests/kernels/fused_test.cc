// Fused bias + GeLU and fused residual add + LayerNorm against references composed of the unfused
// references (ref::bias_gelu_*, ref::residual_layernorm_*), for every combination of FP32 / BF16
// outputs, with = / += semantics, aliasing, thread-count independence and argument checks.
//
// Tolerances.
// - GeLU values and gradients: kGeluTol (1e-6 + 1e-5 |ref|), as tests/kernels/elementwise_test.cc:
//   the kernel evaluates gelu with a polynomial exp (about 1 ulp), so it is within a few FP32 ulp;
//   the bias add is the same FP32 addition in kernel and reference.
// - LayerNorm: kLnTol (1e-5 + 1e-5 |ref|), as tests/kernels/layernorm_test.cc: FP32 row sums over
//   up to 3072 columns, outputs O(1-10); d_resid's absolute part grows with rstd
//   (testing::layernorm_d_in_tol, for the one-column rows).
// - Column sums (d_bias, d_weight): the kernels sum in double over the rows (by chunks of 64 rows;
//   bias-GeLU adds groups of four rows in FP32 first, ~1e-7 relative), the reference in double,
//   of terms that differ from the reference's by the tolerances above, so they get sum_tol:
//   1e-5 + 1e-5 |ref| with the absolute part scaled by sqrt(rows).
// - BF16 outputs: when an FP32 output is also written, the BF16 one must be its rounding, bit for
//   bit. Against the reference they may differ by one BF16 step where kernel and reference land on
//   opposite sides of a rounding boundary: kBf16Tol, 1e-6 + 2^-7 |ref| (2^-7 is the largest
//   relative spacing of bf16 numbers, 8 significant bits).
// - On cuda: GeLU through the device expf (2 ulp) with nvcc's FMA contraction, LayerNorm rows
//   summed over a 256-thread tree in FP32, column sums in the CPU's 64-row chunks in double: the
//   same error budgets as the CPU's, so the same tolerances. What is exact stays exact on every
//   backend: a + b (one FP32 add), a BF16 output as the rounding of the FP32 one written by the
//   same call, and a second call or an in-place call of the same kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/layernorm.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::randn;
using testing::Tol;
using testing::view_of;

constexpr Tol kGeluTol{1e-6, 1e-5};
constexpr Tol kLnTol{1e-5, 1e-5};
constexpr Tol kBf16Tol{1e-6, 1.0 / 128.0};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

Tol sum_tol(std::int64_t rows) {
  return {1e-5 * std::sqrt(std::max<double>(1.0, static_cast<double>(rows))), 1e-5};
}

core::ExecContext cpu_ctx(int threads = 0) {
  core::ExecContext ctx = testing::backend_ctx();
  ctx.num_threads = threads;
  return ctx;
}

struct Case {
  std::int64_t rows, cols;
};
// 1, odd sizes, one column, sizes that are not multiples of 16, several 64-row chunks with a
// partial last one (130 rows), and GPT-2 small shapes (MLP activation 3072 wide, hidden 768).
const Case kGeluCases[] = {{1, 1},    {1, 7},    {3, 17},   {67, 1},   {5, 33},
                           {17, 100}, {4, 1027}, {130, 40}, {64, 3072}};
const Case kLnCases[] = {{1, 1},    {1, 7},    {3, 17},   {67, 1},   {5, 33},
                         {17, 100}, {4, 1027}, {130, 40}, {256, 768}};

std::string shape_name(const std::string& tensor, const Case& c) {
  return tensor + " rows=" + std::to_string(c.rows) + " cols=" + std::to_string(c.cols);
}

enum class Outputs { kF32, kBf16, kBoth };
const Outputs kAllOutputs[] = {Outputs::kF32, Outputs::kBf16, Outputs::kBoth};
bool has_f32(Outputs o) { return o != Outputs::kBf16; }
bool has_bf16(Outputs o) { return o != Outputs::kF32; }
std::string outputs_name(Outputs o) {
  return o == Outputs::kF32 ? " [f32]" : (o == Outputs::kBf16 ? " [bf16]" : " [f32+bf16]");
}

std::vector<float> widen(const std::vector<core::bf16>& x) {
  testing::fetch(x);
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i].to_float();
  return y;
}

// The bf16 output must be the rounding of the f32 output written by the same call.
::testing::AssertionResult is_rounding_of(const std::string& name,
                                          const std::vector<core::bf16>& got16,
                                          const std::vector<float>& got32) {
  testing::fetch(got16);
  testing::fetch(got32);
  for (std::size_t i = 0; i < got16.size(); ++i) {
    if (got16[i].bits != core::bf16::from_float(got32[i]).bits) {
      return ::testing::AssertionFailure()
             << name << ": bf16 output at " << i << " is 0x" << std::hex << got16[i].bits
             << ", the rounding of the f32 output " << got32[i] << " is 0x"
             << core::bf16::from_float(got32[i]).bits;
    }
  }
  return ::testing::AssertionSuccess();
}

// Scratch for the backward kernels, sized by their query functions.
std::vector<std::byte> gelu_scratch(const Case& c) {
  return std::vector<std::byte>(
      static_cast<std::size_t>(bias_gelu_backward_scratch_bytes(c.rows, c.cols)));
}
std::vector<std::byte> ln_scratch(const Case& c) {
  return std::vector<std::byte>(
      static_cast<std::size_t>(residual_layernorm_backward_scratch_bytes(c.rows, c.cols)));
}

// ---------------------------------------------------------------------------------------------
// Bias + GeLU

struct GeluInputs {
  std::vector<float> in, bias, d_out;
};
GeluInputs gelu_inputs(const Case& c, std::uint64_t seed) {
  // Spread 3 around the GeLU knee, bias 0.5: covers the saturated tails on both sides.
  return {randn(c.rows * c.cols, seed, 3.0), randn(c.cols, seed + 1, 0.5),
          randn(c.rows * c.cols, seed + 2)};
}

TEST(BiasGelu, ForwardMatchesReference) {
  std::uint64_t seed = 10;
  for (const Case& c : kGeluCases) {
    for (Outputs o : kAllOutputs) {
      const GeluInputs x = gelu_inputs(c, seed += 3);
      const std::int64_t n = c.rows * c.cols;
      std::vector<float> out(n, kNaN), out_ref(n, kNaN);
      std::vector<core::bf16> out16(n), out16_ref(n);
      const core::Shape rc{c.rows, c.cols};
      bias_gelu(cpu_ctx(), {.out = has_f32(o) ? view_of(out, rc) : core::TensorView{},
                            .out_bf16 = has_bf16(o) ? view_of(out16, rc) : core::TensorView{},
                            .in = view_of(x.in, rc),
                            .bias = view_of(x.bias, {c.cols})});
      ref::bias_gelu_forward({.out = out_ref.data(),
                              .out_bf16 = out16_ref.data(),
                              .in = x.in.data(),
                              .bias = x.bias.data(),
                              .rows = c.rows,
                              .cols = c.cols});
      const std::string suffix = outputs_name(o);
      if (has_f32(o)) {
        EXPECT_TRUE(all_close(shape_name("bias_gelu out", c).append(suffix).c_str(), out, out_ref,
                              kGeluTol));
      }
      if (has_bf16(o)) {
        EXPECT_TRUE(all_close(shape_name("bias_gelu out_bf16", c).append(suffix).c_str(),
                              widen(out16), out_ref, kBf16Tol));
      }
      if (o == Outputs::kBoth) {
        EXPECT_TRUE(is_rounding_of(shape_name("bias_gelu", c), out16, out));
      }
    }
  }
}

TEST(BiasGelu, BackwardMatchesReferenceAndAccumulates) {
  std::uint64_t seed = 100;
  for (const Case& c : kGeluCases) {
    for (Outputs o : kAllOutputs) {
      const GeluInputs x = gelu_inputs(c, seed += 3);
      const std::int64_t n = c.rows * c.cols;
      std::vector<float> d_in(n, kNaN), d_in_ref(n, kNaN);
      std::vector<core::bf16> d_in16(n), d_in16_ref(n);
      auto d_bias = randn(c.cols, seed + 50);  // += : starts non-zero
      auto d_bias_ref = d_bias;
      auto scratch = gelu_scratch(c);
      const core::Shape rc{c.rows, c.cols};
      bias_gelu_backward(cpu_ctx(),
                         {.d_in = has_f32(o) ? view_of(d_in, rc) : core::TensorView{},
                          .d_in_bf16 = has_bf16(o) ? view_of(d_in16, rc) : core::TensorView{},
                          .d_bias = view_of(d_bias, {c.cols}),
                          .d_out = view_of(x.d_out, rc),
                          .in = view_of(x.in, rc),
                          .bias = view_of(x.bias, {c.cols}),
                          .scratch = testing::dev_span(scratch)});
      ref::bias_gelu_backward({.d_in = d_in_ref.data(),
                               .d_in_bf16 = d_in16_ref.data(),
                               .d_bias = d_bias_ref.data(),
                               .d_out = x.d_out.data(),
                               .in = x.in.data(),
                               .bias = x.bias.data(),
                               .rows = c.rows,
                               .cols = c.cols});
      const std::string suffix = outputs_name(o);
      if (has_f32(o)) {
        EXPECT_TRUE(all_close(shape_name("bias_gelu d_in", c).append(suffix).c_str(), d_in,
                              d_in_ref, kGeluTol));
      }
      if (has_bf16(o)) {
        EXPECT_TRUE(all_close(shape_name("bias_gelu d_in_bf16", c).append(suffix).c_str(),
                              widen(d_in16), d_in_ref, kBf16Tol));
      }
      if (o == Outputs::kBoth) {
        EXPECT_TRUE(is_rounding_of(shape_name("bias_gelu d_in", c), d_in16, d_in));
      }
      EXPECT_TRUE(all_close(shape_name("bias_gelu d_bias", c).append(suffix).c_str(), d_bias,
                            d_bias_ref, sum_tol(c.rows)));
    }
  }
}

TEST(BiasGelu, InPlace) {
  const Case c{9, 70};
  const GeluInputs x = gelu_inputs(c, 5);
  const std::int64_t n = c.rows * c.cols;
  std::vector<float> expect(n), buf = x.in;
  bias_gelu_forward(cpu_ctx(), {.out = testing::dev(expect),
                                .in = testing::dev(x.in),
                                .bias = testing::dev(x.bias),
                                .rows = c.rows,
                                .cols = c.cols});
  bias_gelu_forward(cpu_ctx(), {.out = testing::dev(buf),
                                .in = testing::dev(buf),
                                .bias = testing::dev(x.bias),
                                .rows = c.rows,
                                .cols = c.cols});  // out aliases in
  EXPECT_TRUE(testing::all_equal("bias_gelu forward in place", buf, expect));
  std::vector<float> d_b1(c.cols, 0.0f), d_b2(c.cols, 0.0f);
  auto scratch = gelu_scratch(c);
  bias_gelu_backward(cpu_ctx(), {.d_in = testing::dev(expect),
                                 .d_bias = testing::dev(d_b1),
                                 .d_out = testing::dev(x.d_out),
                                 .in = testing::dev(x.in),
                                 .bias = testing::dev(x.bias),
                                 .rows = c.rows,
                                 .cols = c.cols,
                                 .scratch = testing::dev_span(scratch)});
  buf = x.d_out;
  bias_gelu_backward(cpu_ctx(), {.d_in = testing::dev(buf),
                                 .d_bias = testing::dev(d_b2),
                                 .d_out = testing::dev(buf),
                                 .in = testing::dev(x.in),
                                 .bias = testing::dev(x.bias),
                                 .rows = c.rows,
                                 .cols = c.cols,
                                 .scratch = testing::dev_span(scratch)});  // d_in aliases d_out
  EXPECT_TRUE(testing::all_equal("bias_gelu backward in place", buf, expect));
  EXPECT_TRUE(testing::all_equal("bias_gelu d_bias in place", d_b2, d_b1));
}

// d_bias is summed by fixed chunks of rows, whatever the thread count, so d_bias (and d_in) are
// bitwise the same for 1, 2 and 3 threads (200 rows: 4 chunks, the last one partial).
TEST(BiasGelu, BackwardIsIndependentOfThreadCount) {
  const Case c{200, 1500};
  const GeluInputs x = gelu_inputs(c, 77);
  std::vector<float> d_in[3], d_b[3];
  auto scratch = gelu_scratch(c);
  for (int t = 0; t < 3; ++t) {
    d_in[t].assign(c.rows * c.cols, 0.0f);
    d_b[t].assign(c.cols, 0.25f);
    bias_gelu_backward(cpu_ctx(t + 1), {.d_in = testing::dev(d_in[t]),
                                        .d_bias = testing::dev(d_b[t]),
                                        .d_out = testing::dev(x.d_out),
                                        .in = testing::dev(x.in),
                                        .bias = testing::dev(x.bias),
                                        .rows = c.rows,
                                        .cols = c.cols,
                                        .scratch = testing::dev_span(scratch)});
  }
  for (int t = 1; t < 3; ++t) {
    const std::string threads = std::to_string(t + 1);
    EXPECT_TRUE(
        testing::all_equal(("d_in 1 vs " + threads + " threads").c_str(), d_in[t], d_in[0]));
    EXPECT_TRUE(
        testing::all_equal(("d_bias 1 vs " + threads + " threads").c_str(), d_b[t], d_b[0]));
  }
}

// The fused kernel against the unfused kernels it replaces (bias add, gelu_forward/backward).
TEST(BiasGelu, AgreesWithTheUnfusedKernels) {
  const Case c{32, 3072};
  const GeluInputs x = gelu_inputs(c, 91);
  const std::int64_t n = c.rows * c.cols;
  std::vector<float> t(n), out(n), out_unfused(n), d_in(n), d_in_unfused(n);
  for (std::int64_t r = 0; r < c.rows; ++r)
    for (std::int64_t j = 0; j < c.cols; ++j) t[r * c.cols + j] = x.in[r * c.cols + j] + x.bias[j];
  gelu_forward(cpu_ctx(), testing::dev(out_unfused), testing::dev(t), n);
  gelu_backward(cpu_ctx(), testing::dev(d_in_unfused), testing::dev(x.d_out), testing::dev(t), n);
  std::vector<float> d_b(c.cols, 0.0f);
  auto scratch = gelu_scratch(c);
  bias_gelu_forward(cpu_ctx(), {.out = testing::dev(out),
                                .in = testing::dev(x.in),
                                .bias = testing::dev(x.bias),
                                .rows = c.rows,
                                .cols = c.cols});
  bias_gelu_backward(cpu_ctx(), {.d_in = testing::dev(d_in),
                                 .d_bias = testing::dev(d_b),
                                 .d_out = testing::dev(x.d_out),
                                 .in = testing::dev(x.in),
                                 .bias = testing::dev(x.bias),
                                 .rows = c.rows,
                                 .cols = c.cols,
                                 .scratch = testing::dev_span(scratch)});
  EXPECT_TRUE(all_close("fused vs unfused gelu out", out, out_unfused, kGeluTol));
  EXPECT_TRUE(all_close("fused vs unfused gelu d_in", d_in, d_in_unfused, kGeluTol));
}

TEST(BiasGelu, RejectsBadArguments) {
  std::vector<float> buf(16, 1.0f);
  float* const d = testing::dev(buf);
  BiasGeluForwardArgs fwd{.out = d, .in = d, .bias = d + 8, .rows = 2, .cols = 2};
  bias_gelu_forward(cpu_ctx(), fwd);
  BiasGeluForwardArgs bad = fwd;
  bad.out = nullptr;  // and out_bf16 null: nothing to write
  EXPECT_THROW(bias_gelu_forward(cpu_ctx(), bad), core::InvalidArgument);
  bad = fwd;
  bad.bias = nullptr;
  EXPECT_THROW(bias_gelu_forward(cpu_ctx(), bad), core::InvalidArgument);
  bad = fwd;
  bad.cols = 0;
  EXPECT_THROW(bias_gelu_forward(cpu_ctx(), bad), core::InvalidArgument);
  bad = fwd;
  bad.rows = -1;
  EXPECT_THROW(bias_gelu_forward(cpu_ctx(), bad), core::InvalidArgument);
  BiasGeluBackwardArgs bwd{
      .d_in = d, .d_bias = nullptr, .d_out = d, .in = d, .bias = d + 8, .rows = 2, .cols = 2};
  EXPECT_THROW(bias_gelu_backward(cpu_ctx(), bwd), core::InvalidArgument);  // d_bias null
  bwd.d_bias = d + 12;
  bwd.d_in = nullptr;
  EXPECT_THROW(bias_gelu_backward(cpu_ctx(), bwd), core::InvalidArgument);  // no d_in at all
  core::ExecContext cuda = cpu_ctx();
  cuda.device.kind = core::DeviceKind::kCuda;
  // Unavailable without CUDA in the build (with it, see
  // Dispatch.HostMemoryInACudaViewIsAClearError).
  if (!cuda_built()) {
    EXPECT_THROW(bias_gelu_forward(cuda, fwd), core::Unavailable);
  }
  bias_gelu_forward(cpu_ctx(), {.rows = 0, .cols = 4});  // no rows: nothing to touch
}

// ---------------------------------------------------------------------------------------------
// Residual add + LayerNorm

struct LnInputs {
  std::vector<float> a, b, weight, bias, d_out;
};
LnInputs ln_inputs(const Case& c, std::uint64_t seed) {
  // A non-zero mean and a spread > 1 exercise the centring and the variance.
  return {randn(c.rows * c.cols, seed, 2.0, 0.5), randn(c.rows * c.cols, seed + 1, 1.0, -0.2),
          randn(c.cols, seed + 2, 0.1, 1.0), randn(c.cols, seed + 3, 0.1),
          randn(c.rows * c.cols, seed + 4)};
}

TEST(ResidualLayerNorm, ForwardMatchesReference) {
  std::uint64_t seed = 300;
  for (const Case& c : kLnCases) {
    for (Outputs o : kAllOutputs) {
      const LnInputs x = ln_inputs(c, seed += 5);
      const std::int64_t n = c.rows * c.cols;
      std::vector<float> resid(n, kNaN), out(n, kNaN), mean(c.rows, kNaN), rstd(c.rows, kNaN);
      auto resid_ref = resid, out_ref = out, mean_ref = mean, rstd_ref = rstd;
      std::vector<core::bf16> out16(n), out16_ref(n);
      const core::Shape rc{c.rows, c.cols};
      residual_layernorm(cpu_ctx(),
                         {.resid_out = view_of(resid, rc),
                          .out = has_f32(o) ? view_of(out, rc) : core::TensorView{},
                          .out_bf16 = has_bf16(o) ? view_of(out16, rc) : core::TensorView{},
                          .mean = view_of(mean, {c.rows}),
                          .rstd = view_of(rstd, {c.rows}),
                          .a = view_of(x.a, rc),
                          .b = view_of(x.b, rc),
                          .weight = view_of(x.weight, {c.cols}),
                          .bias = view_of(x.bias, {c.cols})});
      ref::residual_layernorm_forward({.resid_out = resid_ref.data(),
                                       .out = out_ref.data(),
                                       .out_bf16 = out16_ref.data(),
                                       .mean = mean_ref.data(),
                                       .rstd = rstd_ref.data(),
                                       .a = x.a.data(),
                                       .b = x.b.data(),
                                       .weight = x.weight.data(),
                                       .bias = x.bias.data(),
                                       .rows = c.rows,
                                       .cols = c.cols});
      const std::string suffix = outputs_name(o);
      // a + b is one FP32 addition in both: exact.
      EXPECT_TRUE(
          testing::all_equal(shape_name("resid_out", c).append(suffix).c_str(), resid, resid_ref));
      if (has_f32(o)) {
        EXPECT_TRUE(
            all_close(shape_name("ln out", c).append(suffix).c_str(), out, out_ref, kLnTol));
      }
      if (has_bf16(o)) {
        EXPECT_TRUE(all_close(shape_name("ln out_bf16", c).append(suffix).c_str(), widen(out16),
                              out_ref, kBf16Tol));
      }
      if (o == Outputs::kBoth) {
        EXPECT_TRUE(is_rounding_of(shape_name("ln", c), out16, out));
      }
      EXPECT_TRUE(
          all_close(shape_name("ln mean", c).append(suffix).c_str(), mean, mean_ref, kLnTol));
      EXPECT_TRUE(
          all_close(shape_name("ln rstd", c).append(suffix).c_str(), rstd, rstd_ref, kLnTol));
    }
  }
}

// The residual stream is usually updated in place: resid_out may alias a or b.
TEST(ResidualLayerNorm, ForwardInPlace) {
  const Case c{7, 300};
  const LnInputs x = ln_inputs(c, 31);
  const std::int64_t n = c.rows * c.cols;
  std::vector<float> resid(n), out(n), mean(c.rows), rstd(c.rows);
  ResidualLayerNormForwardArgs args{.resid_out = testing::dev(resid),
                                    .out = testing::dev(out),
                                    .mean = testing::dev(mean),
                                    .rstd = testing::dev(rstd),
                                    .a = testing::dev(x.a),
                                    .b = testing::dev(x.b),
                                    .weight = testing::dev(x.weight),
                                    .bias = testing::dev(x.bias),
                                    .rows = c.rows,
                                    .cols = c.cols};
  residual_layernorm_forward(cpu_ctx(), args);
  for (int which = 0; which < 2; ++which) {
    std::vector<float> a = x.a, b = x.b, out2(n), mean2(c.rows), rstd2(c.rows);
    ResidualLayerNormForwardArgs in_place = args;
    in_place.a = testing::dev(a);
    in_place.b = testing::dev(b);
    in_place.resid_out = which == 0 ? testing::dev(a) : testing::dev(b);
    in_place.out = testing::dev(out2);
    in_place.mean = testing::dev(mean2);
    in_place.rstd = testing::dev(rstd2);
    residual_layernorm_forward(cpu_ctx(), in_place);
    const std::string name = which == 0 ? "resid_out aliasing a" : "resid_out aliasing b";
    EXPECT_TRUE(testing::all_equal((name + ": resid").c_str(), which == 0 ? a : b, resid));
    EXPECT_TRUE(testing::all_equal((name + ": out").c_str(), out2, out));
    EXPECT_TRUE(testing::all_equal((name + ": rstd").c_str(), rstd2, rstd));
  }
}

TEST(ResidualLayerNorm, BackwardMatchesReferenceAndAccumulates) {
  std::uint64_t seed = 600;
  for (const Case& c : kLnCases) {
    for (bool with_bf16 : {false, true}) {
      const LnInputs x = ln_inputs(c, seed += 5);
      const std::int64_t n = c.rows * c.cols;
      // Saved activations from the reference forward, shared by both backward passes.
      std::vector<float> resid(n), out(n), mean(c.rows), rstd(c.rows);
      ref::residual_layernorm_forward({.resid_out = resid.data(),
                                       .out = out.data(),
                                       .mean = mean.data(),
                                       .rstd = rstd.data(),
                                       .a = x.a.data(),
                                       .b = x.b.data(),
                                       .weight = x.weight.data(),
                                       .bias = x.bias.data(),
                                       .rows = c.rows,
                                       .cols = c.cols});
      // Every f32 output accumulates: prefill with known values (d_resid: the gradient arriving
      // from the next residual add).
      auto d_resid = randn(n, seed + 100), d_w = randn(c.cols, seed + 101);
      auto d_b = randn(c.cols, seed + 102);
      auto d_resid_ref = d_resid, d_w_ref = d_w, d_b_ref = d_b;
      std::vector<core::bf16> d16(n), d16_ref(n);
      auto scratch = ln_scratch(c);
      const core::Shape rc{c.rows, c.cols};
      residual_layernorm_backward(
          cpu_ctx(), {.d_resid = view_of(d_resid, rc),
                      .d_resid_bf16 = with_bf16 ? view_of(d16, rc) : core::TensorView{},
                      .d_weight = view_of(d_w, {c.cols}),
                      .d_bias = view_of(d_b, {c.cols}),
                      .d_out = view_of(x.d_out, rc),
                      .resid = view_of(resid, rc),
                      .weight = view_of(x.weight, {c.cols}),
                      .mean = view_of(mean, {c.rows}),
                      .rstd = view_of(rstd, {c.rows}),
                      .scratch = testing::dev_span(scratch)});
      ref::residual_layernorm_backward({.d_resid = d_resid_ref.data(),
                                        .d_resid_bf16 = d16_ref.data(),
                                        .d_weight = d_w_ref.data(),
                                        .d_bias = d_b_ref.data(),
                                        .d_out = x.d_out.data(),
                                        .resid = resid.data(),
                                        .weight = x.weight.data(),
                                        .mean = mean.data(),
                                        .rstd = rstd.data(),
                                        .rows = c.rows,
                                        .cols = c.cols});
      const std::string suffix = with_bf16 ? " [f32+bf16]" : " [f32]";
      EXPECT_TRUE(all_close(shape_name("d_resid", c).append(suffix).c_str(), d_resid, d_resid_ref,
                            testing::layernorm_d_in_tol(kLnTol, rstd, x.d_out, x.weight)));
      EXPECT_TRUE(all_close(shape_name("ln d_weight", c).append(suffix).c_str(), d_w, d_w_ref,
                            sum_tol(c.rows)));
      EXPECT_TRUE(all_close(shape_name("ln d_bias", c).append(suffix).c_str(), d_b, d_b_ref,
                            sum_tol(c.rows)));
      if (with_bf16) {
        EXPECT_TRUE(is_rounding_of(shape_name("d_resid", c), d16, d_resid));
        EXPECT_TRUE(
            all_close(shape_name("d_resid_bf16", c).c_str(), widen(d16), d_resid_ref, kBf16Tol));
      }
    }
  }
}

// The fused kernels against the unfused sequence they replace: add_forward + layernorm_forward,
// and layernorm_backward (whose d_in is the residual gradient).
TEST(ResidualLayerNorm, AgreesWithTheUnfusedKernels) {
  const Case c{64, 768};
  const LnInputs x = ln_inputs(c, 41);
  const std::int64_t n = c.rows * c.cols;
  std::vector<float> s(n), y(n), mean(c.rows), rstd(c.rows);
  add_forward(cpu_ctx(), testing::dev(s), testing::dev(x.a), testing::dev(x.b), n);
  layernorm_forward(cpu_ctx(), {.out = testing::dev(y),
                                .mean = testing::dev(mean),
                                .rstd = testing::dev(rstd),
                                .in = testing::dev(s),
                                .weight = testing::dev(x.weight),
                                .bias = testing::dev(x.bias),
                                .rows = c.rows,
                                .cols = c.cols});
  std::vector<float> s2(n), y2(n), mean2(c.rows), rstd2(c.rows);
  residual_layernorm_forward(cpu_ctx(), {.resid_out = testing::dev(s2),
                                         .out = testing::dev(y2),
                                         .mean = testing::dev(mean2),
                                         .rstd = testing::dev(rstd2),
                                         .a = testing::dev(x.a),
                                         .b = testing::dev(x.b),
                                         .weight = testing::dev(x.weight),
                                         .bias = testing::dev(x.bias),
                                         .rows = c.rows,
                                         .cols = c.cols});
  EXPECT_TRUE(testing::all_equal("fused vs unfused resid", s2, s));
  EXPECT_TRUE(all_close("fused vs unfused ln out", y2, y, kLnTol));
  EXPECT_TRUE(all_close("fused vs unfused ln rstd", rstd2, rstd, kLnTol));
  std::vector<float> d_in(n, 0.5f), d_w(c.cols, 0.0f), d_b(c.cols, 0.0f);
  auto d_in2 = d_in, d_w2 = d_w, d_b2 = d_b;
  auto scratch = ln_scratch(c);
  layernorm_backward(cpu_ctx(), {.d_in = testing::dev(d_in),
                                 .d_weight = testing::dev(d_w),
                                 .d_bias = testing::dev(d_b),
                                 .d_out = testing::dev(x.d_out),
                                 .in = testing::dev(s),
                                 .weight = testing::dev(x.weight),
                                 .mean = testing::dev(mean),
                                 .rstd = testing::dev(rstd),
                                 .rows = c.rows,
                                 .cols = c.cols});
  residual_layernorm_backward(cpu_ctx(), {.d_resid = testing::dev(d_in2),
                                          .d_weight = testing::dev(d_w2),
                                          .d_bias = testing::dev(d_b2),
                                          .d_out = testing::dev(x.d_out),
                                          .resid = testing::dev(s),
                                          .weight = testing::dev(x.weight),
                                          .mean = testing::dev(mean),
                                          .rstd = testing::dev(rstd),
                                          .rows = c.rows,
                                          .cols = c.cols,
                                          .scratch = testing::dev_span(scratch)});
  EXPECT_TRUE(all_close("fused vs unfused d_resid", d_in2, d_in, kLnTol));
  EXPECT_TRUE(all_close("fused vs unfused d_weight", d_w2, d_w, kLnTol));
  EXPECT_TRUE(all_close("fused vs unfused d_bias", d_b2, d_b, kLnTol));
}

TEST(ResidualLayerNorm, BackwardIsIndependentOfThreadCount) {
  const Case c{200, 1100};
  const LnInputs x = ln_inputs(c, 77);
  const std::int64_t n = c.rows * c.cols;
  std::vector<float> resid(n), out(n), mean(c.rows), rstd(c.rows);
  residual_layernorm_forward(cpu_ctx(), {.resid_out = testing::dev(resid),
                                         .out = testing::dev(out),
                                         .mean = testing::dev(mean),
                                         .rstd = testing::dev(rstd),
                                         .a = testing::dev(x.a),
                                         .b = testing::dev(x.b),
                                         .weight = testing::dev(x.weight),
                                         .bias = testing::dev(x.bias),
                                         .rows = c.rows,
                                         .cols = c.cols});
  std::vector<float> d_resid[3], d_w[3], d_b[3];
  auto scratch = ln_scratch(c);
  for (int t = 0; t < 3; ++t) {
    d_resid[t].assign(n, 0.5f);
    d_w[t].assign(c.cols, 0.25f);
    d_b[t].assign(c.cols, -0.25f);
    residual_layernorm_backward(cpu_ctx(t + 1), {.d_resid = testing::dev(d_resid[t]),
                                                 .d_weight = testing::dev(d_w[t]),
                                                 .d_bias = testing::dev(d_b[t]),
                                                 .d_out = testing::dev(x.d_out),
                                                 .resid = testing::dev(resid),
                                                 .weight = testing::dev(x.weight),
                                                 .mean = testing::dev(mean),
                                                 .rstd = testing::dev(rstd),
                                                 .rows = c.rows,
                                                 .cols = c.cols,
                                                 .scratch = testing::dev_span(scratch)});
  }
  for (int t = 1; t < 3; ++t) {
    const std::string threads = " 1 vs " + std::to_string(t + 1) + " threads";
    EXPECT_TRUE(testing::all_equal(("d_resid" + threads).c_str(), d_resid[t], d_resid[0]));
    EXPECT_TRUE(testing::all_equal(("d_weight" + threads).c_str(), d_w[t], d_w[0]));
    EXPECT_TRUE(testing::all_equal(("d_bias" + threads).c_str(), d_b[t], d_b[0]));
  }
}

TEST(ResidualLayerNorm, RejectsBadArguments) {
  std::vector<float> buf(16, 1.0f);
  float* const d = testing::dev(buf);
  const ResidualLayerNormForwardArgs fwd{.resid_out = d,
                                         .out = d,
                                         .mean = d,
                                         .rstd = d,
                                         .a = d,
                                         .b = d,
                                         .weight = d,
                                         .bias = d,
                                         .rows = 2,
                                         .cols = 2};
  ResidualLayerNormForwardArgs bad = fwd;
  bad.out = nullptr;  // and out_bf16 null
  EXPECT_THROW(residual_layernorm_forward(cpu_ctx(), bad), core::InvalidArgument);
  bad = fwd;
  bad.b = nullptr;
  EXPECT_THROW(residual_layernorm_forward(cpu_ctx(), bad), core::InvalidArgument);
  bad = fwd;
  bad.eps = -1.0f;
  EXPECT_THROW(residual_layernorm_forward(cpu_ctx(), bad), core::InvalidArgument);
  bad = fwd;
  bad.cols = 0;
  EXPECT_THROW(residual_layernorm_forward(cpu_ctx(), bad), core::InvalidArgument);
  const ResidualLayerNormBackwardArgs bwd{.d_resid = nullptr,
                                          .d_weight = d,
                                          .d_bias = d,
                                          .d_out = d,
                                          .resid = d,
                                          .weight = d,
                                          .mean = d,
                                          .rstd = d,
                                          .rows = 2,
                                          .cols = 2};
  EXPECT_THROW(residual_layernorm_backward(cpu_ctx(), bwd), core::InvalidArgument);
  core::ExecContext cuda = cpu_ctx();
  cuda.device.kind = core::DeviceKind::kCuda;
  // Unavailable without CUDA in the build (with it, see
  // Dispatch.HostMemoryInACudaViewIsAClearError).
  if (!cuda_built()) {
    EXPECT_THROW(residual_layernorm_forward(cuda, fwd), core::Unavailable);
  }
}

// The backward kernels need their scratch: too small or misaligned is refused, naming the size.
TEST(FusedScratch, RejectsTooSmallOrMisalignedScratch) {
  const Case c{100, 48};
  const GeluInputs g = gelu_inputs(c, 3);
  const std::int64_t n = c.rows * c.cols;
  std::vector<float> d_in(n), d_b(c.cols), d_w(c.cols), resid(n, 1.0f), stat(c.rows, 1.0f);
  const std::int64_t gelu_bytes = bias_gelu_backward_scratch_bytes(c.rows, c.cols);
  const std::int64_t ln_bytes = residual_layernorm_backward_scratch_bytes(c.rows, c.cols);
  EXPECT_EQ(gelu_bytes, 2 * c.cols * 8);  // 2 chunks of 64 rows, one double per column
  EXPECT_EQ(ln_bytes, 2 * 2 * c.cols * 8);
  std::vector<std::byte> buf(static_cast<std::size_t>(ln_bytes) + 8);
  const std::span<std::byte> all = testing::dev_span(buf);
  BiasGeluBackwardArgs gelu{.d_in = testing::dev(d_in),
                            .d_bias = testing::dev(d_b),
                            .d_out = testing::dev(g.d_out),
                            .in = testing::dev(g.in),
                            .bias = testing::dev(g.bias),
                            .rows = c.rows,
                            .cols = c.cols,
                            .scratch = all.first(static_cast<std::size_t>(gelu_bytes - 8))};
  EXPECT_THROW(bias_gelu_backward(cpu_ctx(), gelu), core::InvalidArgument);
  gelu.scratch = all.subspan(1, static_cast<std::size_t>(gelu_bytes));  // misaligned
  EXPECT_THROW(bias_gelu_backward(cpu_ctx(), gelu), core::InvalidArgument);
  gelu.scratch = all.first(static_cast<std::size_t>(gelu_bytes));
  bias_gelu_backward(cpu_ctx(), gelu);  // exactly enough: runs
  ResidualLayerNormBackwardArgs ln{.d_resid = testing::dev(d_in),
                                   .d_weight = testing::dev(d_w),
                                   .d_bias = testing::dev(d_b),
                                   .d_out = testing::dev(g.d_out),
                                   .resid = testing::dev(resid),
                                   .weight = testing::dev(g.bias),
                                   .mean = testing::dev(stat),
                                   .rstd = testing::dev(stat),
                                   .rows = c.rows,
                                   .cols = c.cols,
                                   .scratch = all.first(static_cast<std::size_t>(ln_bytes - 1))};
  EXPECT_THROW(residual_layernorm_backward(cpu_ctx(), ln), core::InvalidArgument);
  ln.scratch = all.first(static_cast<std::size_t>(ln_bytes));
  residual_layernorm_backward(cpu_ctx(), ln);  // exactly enough: runs
}

// The typed views: the BF16 copies are bf16 views, and every view is checked before a pointer is
// read, the error naming the op and the view.
TEST(FusedViews, ViewsOfTheWrongDtypeShapeOrDeviceAreClearErrors) {
  const std::int64_t rows = 3, cols = 8;
  const core::Shape rc{rows, cols};
  std::vector<float> x(rows * cols, 1.0f), y(rows * cols), w(cols, 1.0f), b(cols), st(rows);
  std::vector<core::bf16> x16(rows * cols);
  auto scratch = gelu_scratch({rows, cols});
  const auto gelu_error = [](const BiasGeluViews& v) {
    return testing::invalid_argument_of([&] { bias_gelu(cpu_ctx(), v); });
  };
  const BiasGeluViews gelu{.out = view_of(y, rc), .in = view_of(x, rc), .bias = view_of(b, {cols})};
  EXPECT_EQ(gelu_error(gelu), "no error");
  BiasGeluViews g = gelu;
  g.out_bf16 = view_of(y, rc);  // an f32 buffer where the BF16 copy goes
  EXPECT_NE(gelu_error(g).find("bias_gelu: view `out_bf16` holds f32, the op needs bf16"),
            std::string::npos)
      << gelu_error(g);
  g = gelu;
  g.out = {};
  EXPECT_NE(gelu_error(g).find("views `out` and `out_bf16` are both empty"), std::string::npos)
      << gelu_error(g);
  g.out_bf16 = view_of(x16, rc);
  EXPECT_EQ(gelu_error(g), "no error");
  const std::string bwd = testing::invalid_argument_of([&] {
    bias_gelu_backward(cpu_ctx(), {.d_in = view_of(y, rc),
                                   .d_bias = testing::view_claiming(b, {cols - 1}),
                                   .d_out = view_of(x, rc),
                                   .in = view_of(x, rc),
                                   .bias = view_of(b, {cols}),
                                   .scratch = testing::dev_span(scratch)});
  });
  EXPECT_NE(bwd.find("bias_gelu_backward: view `d_bias` has shape (7), the op needs (8)"),
            std::string::npos)
      << bwd;

  const ResidualLayerNormViews ln{.resid_out = view_of(y, rc),
                                  .out = view_of(x, rc),
                                  .mean = view_of(st, {rows}),
                                  .rstd = view_of(st, {rows}),
                                  .a = view_of(y, rc),
                                  .b = view_of(y, rc),
                                  .weight = view_of(w, {cols}),
                                  .bias = view_of(b, {cols})};
  ResidualLayerNormViews l = ln;
  l.b = core::view(testing::dev(y), rc, testing::other_device());
  std::string e = testing::invalid_argument_of([&] { residual_layernorm(cpu_ctx(), l); });
  EXPECT_NE(e.find("residual_layernorm: view `b` is on another device"), std::string::npos) << e;
  l = ln;
  l.out_bf16 = testing::view_claiming(x16, {rows, cols + 1});
  e = testing::invalid_argument_of([&] { residual_layernorm(cpu_ctx(), l); });
  EXPECT_NE(e.find("view `out_bf16` has shape (3, 9)"), std::string::npos) << e;
  e = testing::invalid_argument_of([&] {
    residual_layernorm_backward(cpu_ctx(), {.d_resid = view_of(y, rc),
                                            .d_resid_bf16 = view_of(y, rc),
                                            .d_weight = view_of(w, {cols}),
                                            .d_bias = view_of(b, {cols}),
                                            .d_out = view_of(x, rc),
                                            .resid = view_of(x, rc),
                                            .weight = view_of(w, {cols}),
                                            .mean = view_of(st, {rows}),
                                            .rstd = view_of(st, {rows})});
  });
  EXPECT_NE(e.find("residual_layernorm_backward: view `d_resid_bf16` holds f32, the op needs bf16"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace trident::kernels
