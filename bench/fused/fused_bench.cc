// Bandwidth benchmark of the fused kernels against the unfused sequences they replace, on arrays
// far larger than the caches (GPT-2 124M activations, 32M AdamW parameters):
//   - bias + GeLU forward / backward vs a bias pass + gelu_forward / gelu_backward + a d_bias pass,
//   - residual add + LayerNorm forward / backward vs add_forward + layernorm_forward /
//     layernorm_backward,
//   - each with BF16 outputs (for the BF16 matmuls) vs the unfused sequence plus a conversion pass,
//   - fused AdamW (kernels/adamw.h, one pass) vs a 5-pass version written here,
//   - FP32 <-> BF16 conversions (vcvtne2ps2bf16 and the portable loop).
// GB/s = the bytes the fused kernel must move at least (each input read once, each output written
// once, no write-allocate) / median time, for both variants, so the GB/s ratio is the speed-up;
// the "traffic" column gives the bytes each variant moves by that count. The unfused variants are
// checked against the fused ones first (max |diff| column). Fused and unfused calls alternate and
// each time is the median of --reps calls; the machine is shared, so each row waits for an idle
// machine and prints the foreign load measured while it ran.
//
// Usage: trident_fused_bench [--reps N] [--threads 2,1]
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../kernels/bench_util.h"
#include "trident/core/view.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/layernorm.h"

namespace trident::bench {
namespace {

constexpr double kStreamTriadGBs = 29.0;  // 2 cores, reference/cpu-ceilings.md section 4

int threads_of(const core::ExecContext& ctx) {
  return ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads();
}

// ---- The unfused building blocks that have no library kernel (written here, bench only) ----

// t[r,c] = in[r,c] + bias[c]: the bias pass of an unfused linear layer.
void add_bias(const core::ExecContext& ctx, float* t, const float* in, const float* bias,
              std::int64_t rows, std::int64_t cols) {
#pragma omp parallel for num_threads(threads_of(ctx)) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) t[r * cols + c] = in[r * cols + c] + bias[c];
  }
}

// d_bias[c] += sum_r d[r,c], column blocks of 512 per thread, double sums (as the kernels do).
void add_column_sums(const core::ExecContext& ctx, float* d_bias, const float* d, std::int64_t rows,
                     std::int64_t cols) {
  constexpr std::int64_t kBlock = 512;
  const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads_of(ctx)) schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t c0 = b * kBlock, width = std::min(kBlock, cols - c0);
    double acc[kBlock] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) acc[j] += d[r * cols + c0 + j];
    }
    for (std::int64_t j = 0; j < width; ++j) d_bias[c0 + j] += static_cast<float>(acc[j]);
  }
}

// The portable FP32 -> BF16 loop over thread ranges (the library uses vcvtne2ps2bf16 here).
void convert_portable(const core::ExecContext& ctx, core::bf16* dst, const float* src,
                      std::int64_t n) {
  const int threads = threads_of(ctx);
  const std::int64_t chunk = (n + threads - 1) / threads;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const std::int64_t begin = std::min(n, chunk * t), end = std::min(n, begin + chunk);
    kernels::detail::f32_to_bf16_portable(dst + begin, src + begin, end - begin);
  }
}

// AdamW as five elementwise passes (what a framework without a fused optimizer runs, e.g.
// torch.optim.AdamW(foreach=True, fused=False)): m, v, decay, denominator, update. denom is
// scratch of n floats.
void adamw_5_pass(const core::ExecContext& ctx, const kernels::AdamWHyper& hp, float* p, float* m,
                  float* v, const float* grad, float* denom, std::int64_t n) {
  const double t = static_cast<double>(hp.step);
  const float step_size = static_cast<float>(hp.lr / (1.0 - std::pow(double(hp.beta1), t)));
  const float inv_sqrt_bc2 =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double(hp.beta2), t)));
  const float decay = static_cast<float>(1.0 - double(hp.lr) * hp.weight_decay);
  const float b1 = hp.beta1, b2 = hp.beta2, s = hp.grad_scale, eps = hp.eps;
  const int threads = threads_of(ctx);
#pragma omp parallel num_threads(threads)
  {
#pragma omp for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) m[i] = b1 * m[i] + (1.0f - b1) * (grad[i] * s);
#pragma omp for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const float g = grad[i] * s;
      v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    }
#pragma omp for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) p[i] *= decay;
#pragma omp for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) denom[i] = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
#pragma omp for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) p[i] -= step_size * m[i] / denom[i];
  }
}

// ---- Cases ----

struct Case {
  std::string name;
  double fused_bytes;    // minimum traffic of the fused kernel: the GB/s numerator for both
  double unfused_bytes;  // the same count for the unfused sequence (sum over its passes)
  std::function<void(const core::ExecContext&)> fused, unfused;
  // Called after one fused and one unfused call: max |fused - unfused| over their outputs. Null
  // where the outputs accumulate over calls (LayerNorm backward; agreement is unit-tested).
  std::function<double(const core::ExecContext&)> check;
};

double max_abs_diff(const float* a, const float* b, std::int64_t n) {
  double worst = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}
double max_abs_diff(const core::bf16* a, const core::bf16* b, std::int64_t n) {
  double worst = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i].to_float()) - b[i].to_float()));
  }
  return worst;
}

struct Timing {
  double fused_s, unfused_s, foreign;
};

Timing time_alternating(const core::ExecContext& ctx, const Case& c, int reps) {
  Timing best{};
  for (int attempt = 0; attempt < 3; ++attempt) {
    wait_for_idle(0.1, 0.25, 20.0);
    ForeignLoad load;
    load.start();
    c.fused(ctx);  // warm-up: page faults, thread start
    c.unfused(ctx);
    std::vector<double> tf, tu;
    for (int i = 0; i < reps; ++i) {
      core::Timer timer;
      c.fused(ctx);
      tf.push_back(timer.elapsed_s());
      timer.reset();
      c.unfused(ctx);
      tu.push_back(timer.elapsed_s());
    }
    best = {median(tf), median(tu), load.stop()};
    if (best.foreign <= 0.2) break;
  }
  return best;
}

// The conversions, timed round-robin (one call of each per round), medians over --reps rounds.
void time_conversions(const core::ExecContext& ctx, int reps, const std::vector<float>& f32,
                      std::vector<core::bf16>& h1, std::vector<core::bf16>& h2,
                      std::vector<float>& back, const std::vector<float>& other) {
  const auto n = static_cast<std::int64_t>(f32.size());
  const std::function<void()> calls[] = {
      [&] {
        kernels::convert(ctx,
                         {.out = core::view(h1.data(), {n}), .in = core::view(f32.data(), {n})});
      },
      [&] { convert_portable(ctx, h2.data(), f32.data(), n); },
      [&] {
        kernels::convert(ctx,
                         {.out = core::view(back.data(), {n}), .in = core::view(h1.data(), {n})});
      },
      [&] {
        kernels::add(ctx, {.out = core::view(back.data(), {n}),
                           .a = core::view(f32.data(), {n}),
                           .b = core::view(other.data(), {n})});
      }};
  const char* names[] = {kernels::detail::has_avx512bf16_convert()
                             ? "convert_f32_to_bf16 (vcvtne2ps2bf16)"
                             : "convert_f32_to_bf16 (portable: no avx512_bf16 in this build)",
                         "f32 -> bf16, portable loop", "convert_bf16_to_f32",
                         "calibration: add_forward (STREAM add, 12 B each)"};
  for (const auto& call : calls) call();  // warm-up
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < h1.size(); ++i) mismatches += h1[i].bits != h2[i].bits ? 1 : 0;
  constexpr int kCalls = 4;
  std::vector<double> t[kCalls];
  double foreign = 0.0;
  for (int attempt = 0; attempt < 3; ++attempt) {  // repeated when other processes interfered
    wait_for_idle(0.1, 0.25, 20.0);
    ForeignLoad load;
    load.start();
    for (auto& v : t) v.clear();
    for (int r = 0; r < reps; ++r) {
      for (int k = 0; k < kCalls; ++k) {
        core::Timer timer;
        calls[k]();
        t[k].push_back(timer.elapsed_s());
      }
    }
    foreign = load.stop();
    if (foreign <= 0.2) break;
  }
  const double bytes = 6.0 * static_cast<double>(n);  // 4 B read + 2 B written, or the reverse
  std::printf(
      "| pass over %lld elements (6 B each unless noted) | ms | GB/s | of %.0f GB/s |\n"
      "|---|---|---|---|\n",
      static_cast<long long>(n), kStreamTriadGBs);
  for (int k = 0; k < kCalls; ++k) {
    const double s = median(t[k]);
    const double b = k == 3 ? 2.0 * bytes : bytes;
    std::printf("| %s | %.2f | %.1f | %.0f%% |\n", names[k], s * 1e3, b / s * 1e-9,
                100.0 * b / s * 1e-9 / kStreamTriadGBs);
  }
  std::printf("\nportable vs vcvtne2ps2bf16: %zu of %lld results differ; foreign load %.2f\n\n",
              mismatches, static_cast<long long>(n), foreign);
}

int run(int reps, const std::vector<int>& thread_counts) {
  const double f = sizeof(float), h = sizeof(core::bf16);
  // Bias + GeLU over the MLP activation of 8192 tokens: 8192 x 3072.
  const std::int64_t g_rows = 8192, g_cols = 3072, gn = g_rows * g_cols;
  // Residual + LayerNorm over 16384 tokens x 768.
  const std::int64_t l_rows = 16384, l_cols = 768, ln = l_rows * l_cols;
  // AdamW over 32M parameters (a quarter of GPT-2 124M); conversions over 32M elements.
  const std::int64_t an = 32 * 1024 * 1024, cn = 32 * 1024 * 1024;

  std::vector<float> g_in(gn), g_bias(g_cols), g_dout(gn), g_out(gn), g_out2(gn), g_t(gn),
      g_db(g_cols), g_db2(g_cols);
  std::vector<core::bf16> g_out16(gn), g_out16b(gn);
  fill_uniform(g_in.data(), gn, 1);
  fill_uniform(g_bias.data(), g_cols, 2);
  fill_uniform(g_dout.data(), gn, 3);

  std::vector<float> l_a(ln), l_b(ln), l_w(l_cols), l_bias(l_cols), l_dout(ln), l_s(ln), l_s2(ln),
      l_y(ln), l_y2(ln), l_mean(l_rows), l_rstd(l_rows), l_dres(ln), l_dres2(ln), l_dw(l_cols),
      l_dbias(l_cols);
  std::vector<core::bf16> l_y16(ln), l_y16b(ln);
  fill_uniform(l_a.data(), ln, 4);
  fill_uniform(l_b.data(), ln, 5);
  fill_uniform(l_w.data(), l_cols, 6);
  fill_uniform(l_bias.data(), l_cols, 7);
  fill_uniform(l_dout.data(), ln, 8);
  fill_uniform(l_dres.data(), ln, 9);

  std::vector<float> a_p(an), a_m(an, 0.0f), a_v(an, 0.0f), a_g(an), a_denom(an);
  fill_uniform(a_p.data(), an, 10);
  fill_uniform(a_g.data(), an, 11);

  std::vector<float> c_f(cn), c_back(cn);
  std::vector<core::bf16> c_h(cn), c_h2(cn);
  fill_uniform(c_f.data(), cn, 12);

  const kernels::AdamWHyper hp{.lr = 1e-4f, .weight_decay = 0.1f, .step = 10};

  std::vector<std::byte> g_scratch(
      static_cast<std::size_t>(kernels::bias_gelu_backward_scratch_bytes(g_rows, g_cols)));
  std::vector<std::byte> l_scratch(
      static_cast<std::size_t>(kernels::residual_layernorm_backward_scratch_bytes(l_rows, l_cols)));
  auto gelu_fwd_fused = [&](const core::ExecContext& ctx, float* out, core::bf16* out16) {
    // A null out or out16 is an empty view: the op does not write that copy.
    kernels::bias_gelu(ctx, {.out = core::view(out, {g_rows, g_cols}),
                             .out_bf16 = core::view(out16, {g_rows, g_cols}),
                             .in = core::view(g_in.data(), {g_rows, g_cols}),
                             .bias = core::view(g_bias.data(), {g_cols})});
  };
  auto gelu_bwd_fused = [&](const core::ExecContext& ctx, float* d_in, core::bf16* d_in16,
                            float* d_bias) {
    kernels::bias_gelu_backward(ctx, {.d_in = core::view(d_in, {g_rows, g_cols}),
                                      .d_in_bf16 = core::view(d_in16, {g_rows, g_cols}),
                                      .d_bias = core::view(d_bias, {g_cols}),
                                      .d_out = core::view(g_dout.data(), {g_rows, g_cols}),
                                      .in = core::view(g_in.data(), {g_rows, g_cols}),
                                      .bias = core::view(g_bias.data(), {g_cols}),
                                      .scratch = g_scratch});
  };
  auto ln_fwd_fused = [&](const core::ExecContext& ctx, float* s, float* y, core::bf16* y16) {
    kernels::residual_layernorm(ctx, {.resid_out = core::view(s, {l_rows, l_cols}),
                                      .out = core::view(y, {l_rows, l_cols}),
                                      .out_bf16 = core::view(y16, {l_rows, l_cols}),
                                      .mean = core::view(l_mean.data(), {l_rows}),
                                      .rstd = core::view(l_rstd.data(), {l_rows}),
                                      .a = core::view(l_a.data(), {l_rows, l_cols}),
                                      .b = core::view(l_b.data(), {l_rows, l_cols}),
                                      .weight = core::view(l_w.data(), {l_cols}),
                                      .bias = core::view(l_bias.data(), {l_cols})});
  };
  auto ln_fwd_unfused = [&](const core::ExecContext& ctx, float* s, float* y) {
    kernels::add(ctx, {.out = core::view(s, {ln}),
                       .a = core::view(l_a.data(), {ln}),
                       .b = core::view(l_b.data(), {ln})});
    kernels::layernorm(ctx, {.out = core::view(y, {l_rows, l_cols}),
                             .mean = core::view(l_mean.data(), {l_rows}),
                             .rstd = core::view(l_rstd.data(), {l_rows}),
                             .in = core::view(s, {l_rows, l_cols}),
                             .weight = core::view(l_w.data(), {l_cols}),
                             .bias = core::view(l_bias.data(), {l_cols})});
  };
  // Backward calls accumulate into d_resid; repeated calls only grow it (no refill in the timing).
  auto ln_bwd_fused = [&](const core::ExecContext& ctx, float* d_resid, core::bf16* d16) {
    kernels::residual_layernorm_backward(ctx, {.d_resid = core::view(d_resid, {l_rows, l_cols}),
                                               .d_resid_bf16 = core::view(d16, {l_rows, l_cols}),
                                               .d_weight = core::view(l_dw.data(), {l_cols}),
                                               .d_bias = core::view(l_dbias.data(), {l_cols}),
                                               .d_out = core::view(l_dout.data(), {l_rows, l_cols}),
                                               .resid = core::view(l_s.data(), {l_rows, l_cols}),
                                               .weight = core::view(l_w.data(), {l_cols}),
                                               .mean = core::view(l_mean.data(), {l_rows}),
                                               .rstd = core::view(l_rstd.data(), {l_rows}),
                                               .scratch = l_scratch});
  };
  auto ln_bwd_unfused = [&](const core::ExecContext& ctx, float* d_resid) {
    kernels::layernorm_backward(ctx, {.d_in = core::view(d_resid, {l_rows, l_cols}),
                                      .d_weight = core::view(l_dw.data(), {l_cols}),
                                      .d_bias = core::view(l_dbias.data(), {l_cols}),
                                      .d_out = core::view(l_dout.data(), {l_rows, l_cols}),
                                      .in = core::view(l_s.data(), {l_rows, l_cols}),
                                      .weight = core::view(l_w.data(), {l_cols}),
                                      .mean = core::view(l_mean.data(), {l_rows}),
                                      .rstd = core::view(l_rstd.data(), {l_rows})});
  };

  // AdamW check on a slice: the 5-pass version against the fused kernel from the same state.
  auto adamw_check = [&](const core::ExecContext& ctx) {
    const std::int64_t n = 1 << 20;
    std::vector<float> p1(a_p.begin(), a_p.begin() + n), p2 = p1, m1(n, 0.01f), m2 = m1,
                                                         v1(n, 0.02f), v2 = v1, d(n);
    kernels::adamw_update(ctx, hp,
                          {.param = core::view(p1.data(), {n}),
                           .m = core::view(m1.data(), {n}),
                           .v = core::view(v1.data(), {n}),
                           .grad = core::view(a_g.data(), {n})});
    adamw_5_pass(ctx, hp, p2.data(), m2.data(), v2.data(), a_g.data(), d.data(), n);
    return max_abs_diff(p1.data(), p2.data(), n);
  };

  const std::vector<Case> cases = {
      {"bias+gelu forward, f32 out (8192x3072)", 2 * f * gn, 4 * f * gn,
       [&](const core::ExecContext& ctx) { gelu_fwd_fused(ctx, g_out.data(), nullptr); },
       [&](const core::ExecContext& ctx) {
         add_bias(ctx, g_t.data(), g_in.data(), g_bias.data(), g_rows, g_cols);
         kernels::gelu(
             ctx, {.out = core::view(g_out2.data(), {gn}), .in = core::view(g_t.data(), {gn})});
       },
       [&](const core::ExecContext&) { return max_abs_diff(g_out.data(), g_out2.data(), gn); }},
      {"bias+gelu forward, bf16 out (8192x3072)", (f + h) * gn, (4 * f + f + h) * gn,
       [&](const core::ExecContext& ctx) { gelu_fwd_fused(ctx, nullptr, g_out16.data()); },
       [&](const core::ExecContext& ctx) {
         add_bias(ctx, g_t.data(), g_in.data(), g_bias.data(), g_rows, g_cols);
         kernels::gelu(
             ctx, {.out = core::view(g_out2.data(), {gn}), .in = core::view(g_t.data(), {gn})});
         kernels::convert(ctx, {.out = core::view(g_out16b.data(), {gn}),
                                .in = core::view(g_out2.data(), {gn})});
       },
       [&](const core::ExecContext&) { return max_abs_diff(g_out16.data(), g_out16b.data(), gn); }},
      // Unfused backward: t = in + bias was saved by the unfused forward, so no recompute.
      {"bias+gelu backward, f32 d_in (8192x3072)", 3 * f * gn, 4 * f * gn,
       [&](const core::ExecContext& ctx) {
         gelu_bwd_fused(ctx, g_out.data(), nullptr, g_db.data());
       },
       [&](const core::ExecContext& ctx) {
         kernels::gelu_backward(ctx, {.d_in = core::view(g_out2.data(), {gn}),
                                      .d_out = core::view(g_dout.data(), {gn}),
                                      .in = core::view(g_t.data(), {gn})});
         add_column_sums(ctx, g_db2.data(), g_out2.data(), g_rows, g_cols);
       },
       [&](const core::ExecContext&) { return max_abs_diff(g_out.data(), g_out2.data(), gn); }},
      {"bias+gelu backward, bf16 d_in (8192x3072)", (2 * f + h) * gn, (4 * f + f + h) * gn,
       [&](const core::ExecContext& ctx) {
         gelu_bwd_fused(ctx, nullptr, g_out16.data(), g_db.data());
       },
       [&](const core::ExecContext& ctx) {
         kernels::gelu_backward(ctx, {.d_in = core::view(g_out2.data(), {gn}),
                                      .d_out = core::view(g_dout.data(), {gn}),
                                      .in = core::view(g_t.data(), {gn})});
         add_column_sums(ctx, g_db2.data(), g_out2.data(), g_rows, g_cols);
         kernels::convert(ctx, {.out = core::view(g_out16b.data(), {gn}),
                                .in = core::view(g_out2.data(), {gn})});
       },
       [&](const core::ExecContext&) { return max_abs_diff(g_out16.data(), g_out16b.data(), gn); }},
      {"resid+layernorm forward, f32 out (16384x768)", 4 * f * ln, 5 * f * ln,
       [&](const core::ExecContext& ctx) { ln_fwd_fused(ctx, l_s.data(), l_y.data(), nullptr); },
       [&](const core::ExecContext& ctx) { ln_fwd_unfused(ctx, l_s2.data(), l_y2.data()); },
       [&](const core::ExecContext&) { return max_abs_diff(l_y.data(), l_y2.data(), ln); }},
      {"resid+layernorm forward, bf16 out (16384x768)", (3 * f + h) * ln, (6 * f + h) * ln,
       [&](const core::ExecContext& ctx) { ln_fwd_fused(ctx, l_s.data(), nullptr, l_y16.data()); },
       [&](const core::ExecContext& ctx) {
         ln_fwd_unfused(ctx, l_s2.data(), l_y2.data());
         kernels::convert(
             ctx, {.out = core::view(l_y16b.data(), {ln}), .in = core::view(l_y2.data(), {ln})});
       },
       [&](const core::ExecContext&) { return max_abs_diff(l_y16.data(), l_y16b.data(), ln); }},
      // d_out, resid read; d_resid read and written. layernorm_backward's weight-gradient pass
      // re-reads d_out and resid (2 more floats per element); the fused kernel does not.
      {"resid+layernorm backward, f32 (16384x768)", 4 * f * ln, 6 * f * ln,
       [&](const core::ExecContext& ctx) { ln_bwd_fused(ctx, l_dres.data(), nullptr); },
       [&](const core::ExecContext& ctx) { ln_bwd_unfused(ctx, l_dres2.data()); }, nullptr},
      {"resid+layernorm backward, +bf16 d_resid (16384x768)", (4 * f + h) * ln, (7 * f + h) * ln,
       [&](const core::ExecContext& ctx) { ln_bwd_fused(ctx, l_dres.data(), l_y16.data()); },
       [&](const core::ExecContext& ctx) {
         ln_bwd_unfused(ctx, l_dres2.data());
         kernels::convert(
             ctx, {.out = core::view(l_y16b.data(), {ln}), .in = core::view(l_dres2.data(), {ln})});
       },
       nullptr},
      // param, m, v read and written, grad read: 7 floats per parameter; the 5 passes move 14.
      {"adamw 32M params (fused vs 5-pass)", 7 * f * an, 14 * f * an,
       [&](const core::ExecContext& ctx) {
         kernels::adamw_update(ctx, hp,
                               {.param = core::view(a_p.data(), {an}),
                                .m = core::view(a_m.data(), {an}),
                                .v = core::view(a_v.data(), {an}),
                                .grad = core::view(a_g.data(), {an})});
       },
       [&](const core::ExecContext& ctx) {
         adamw_5_pass(ctx, hp, a_p.data(), a_m.data(), a_v.data(), a_g.data(), a_denom.data(), an);
       },
       adamw_check},
  };

  std::printf(
      "# trident_fused_bench (median of %d alternating calls; GB/s = the fused kernel's minimum "
      "bytes / time for both columns; STREAM triad on 2 cores ~ %.0f GB/s)\n\n",
      reps, kStreamTriadGBs);
  for (int threads : thread_counts) {
    core::ExecContext ctx = core::ExecContext::cpu();
    ctx.num_threads = threads;
    std::printf("## %d thread%s\n\n", threads, threads > 1 ? "s" : "");
    std::printf(
        "| case | fused ms | unfused ms | fused GB/s | unfused GB/s | speed-up | traffic "
        "unfused/fused | max abs diff | foreign load |\n"
        "|---|---|---|---|---|---|---|---|---|\n");
    for (const Case& c : cases) {
      c.fused(ctx);
      c.unfused(ctx);
      char diff[32] = "n/a";
      if (c.check) std::snprintf(diff, sizeof diff, "%.1e", c.check(ctx));
      const Timing t = time_alternating(ctx, c, reps);
      std::printf("| %s | %.2f | %.2f | %.1f | %.1f | %.2fx | %.2f | %s | %.2f |\n", c.name.c_str(),
                  t.fused_s * 1e3, t.unfused_s * 1e3, c.fused_bytes / t.fused_s * 1e-9,
                  c.fused_bytes / t.unfused_s * 1e-9, t.unfused_s / t.fused_s,
                  c.unfused_bytes / c.fused_bytes, diff, t.foreign);
      std::fflush(stdout);
    }
    std::printf("\n");
    time_conversions(ctx, reps, c_f, c_h, c_h2, c_back, a_g);
  }
  return 0;
}

}  // namespace
}  // namespace trident::bench

int main(int argc, char** argv) {
  int reps = 7;
  std::vector<int> threads = {2};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (flag == "--threads") {
      threads.clear();
      for (const char* s = argv[i + 1]; *s;) {
        char* end = nullptr;
        threads.push_back(static_cast<int>(std::strtol(s, &end, 10)));
        if (end == s) break;
        s = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    return trident::bench::run(reps, threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident_fused_bench: %s\n", e.what());
    return 1;
  }
}
