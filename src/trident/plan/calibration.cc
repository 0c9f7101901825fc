#include "trident/plan/calibration.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/matmul.h"

namespace trident::plan {

namespace {

namespace k = kernels;
using Clock = std::chrono::steady_clock;

// Best of a few batches of calls, each batch at least `min_s` long: seconds per call.
template <class F>
double time_call(F&& f, double min_s = 0.01, int batches = 3) {
  f();  // warm-up (first-touch, oneDNN's JIT)
  double best = 1e30;
  for (int b = 0; b < batches; ++b) {
    int n = 0;
    const auto t0 = Clock::now();
    double el = 0;
    do {
      f();
      ++n;
      el = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (el < min_s && n < 1000);
    best = std::min(best, el / n);
  }
  return best;
}

std::vector<float> filled(std::int64_t n, float v) {
  return std::vector<float>(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)), v);
}

// Fits overhead + per-element cost from a small and a large call.
template <class F>
LinearCost fit(F&& run, std::int64_t small, std::int64_t large) {
  const double ts = time_call([&] { run(small); });
  const double tl = time_call([&] { run(large); });
  LinearCost c;
  c.per_element_s = std::max(0.0, (tl - ts) / static_cast<double>(large - small));
  c.overhead_s = std::max(0.0, ts - c.per_element_s * static_cast<double>(small));
  return c;
}

constexpr double kFlopCap = 2147483648.0;  // rows * in * out above this is not measured

std::size_t idx3(std::size_t n, std::size_t r, std::size_t i, std::size_t o) {
  return (r * n + i) * n + o;
}

// log-linear interpolation of time along one sorted grid axis; beyond the ends the time scales
// linearly with the size above (the rate is saturated) and stays constant below.
struct AxisPos {
  std::size_t lo = 0, hi = 0;
  double w = 0;      // weight of hi
  double scale = 1;  // factor for sizes beyond the last point
};
AxisPos locate(const std::vector<std::int64_t>& g, double x) {
  AxisPos p;
  const std::size_t n = g.size();
  if (x <= static_cast<double>(g.front())) return p;
  if (x >= static_cast<double>(g.back())) {
    p.lo = p.hi = n - 1;
    p.scale = x / static_cast<double>(g.back());
    return p;
  }
  std::size_t j = 0;
  while (static_cast<double>(g[j + 1]) < x) ++j;
  p.lo = j;
  p.hi = j + 1;
  p.w = (std::log(x) - std::log(static_cast<double>(g[j]))) /
        (std::log(static_cast<double>(g[j + 1])) - std::log(static_cast<double>(g[j])));
  return p;
}

double interp3(const std::vector<std::int64_t>& g, const std::vector<double>& t, double r, double i,
               double o) {
  const AxisPos a = locate(g, r), b = locate(g, i), c = locate(g, o);
  double acc = 0;
  for (int da = 0; da < 2; ++da)
    for (int db = 0; db < 2; ++db)
      for (int dc = 0; dc < 2; ++dc) {
        const double w = (da ? a.w : 1 - a.w) * (db ? b.w : 1 - b.w) * (dc ? c.w : 1 - c.w);
        if (w == 0) continue;
        const double v = t[idx3(g.size(), da ? a.hi : a.lo, db ? b.hi : b.lo, dc ? c.hi : c.lo)];
        acc += w * std::log(v);
      }
  return std::exp(acc) * a.scale * b.scale * c.scale;
}

double interp2(const std::vector<std::int64_t>& ga, const std::vector<std::int64_t>& gb,
               const std::vector<double>& t, double x, double y, bool quadratic_a) {
  AxisPos a = locate(ga, x);
  const AxisPos b = locate(gb, y);
  if (quadratic_a) a.scale *= a.scale;  // attention grows with seq_len^2
  double acc = 0;
  for (int da = 0; da < 2; ++da)
    for (int db = 0; db < 2; ++db) {
      const double w = (da ? a.w : 1 - a.w) * (db ? b.w : 1 - b.w);
      if (w == 0) continue;
      acc += w * std::log(t[(da ? a.hi : a.lo) * gb.size() + (db ? b.hi : b.lo)]);
    }
  return std::exp(acc) * a.scale * b.scale;
}

}  // namespace

double Calibration::linear_forward_s(std::int64_t rows, std::int64_t in, std::int64_t out) const {
  return interp3(grid, linear_fwd_s, static_cast<double>(rows), static_cast<double>(in),
                 static_cast<double>(out));
}
double Calibration::linear_backward_s(std::int64_t rows, std::int64_t in, std::int64_t out) const {
  return interp3(grid, linear_bwd_s, static_cast<double>(rows), static_cast<double>(in),
                 static_cast<double>(out));
}
double Calibration::attention_forward_s(bool flash, std::int64_t bh, std::int64_t seq,
                                        std::int64_t head_dim) const {
  return static_cast<double>(bh) *
         interp2(attn_seq, attn_head_dim, flash ? flash_fwd_s : attn_fwd_s,
                 static_cast<double>(seq), static_cast<double>(head_dim), true);
}
double Calibration::attention_backward_s(bool flash, std::int64_t bh, std::int64_t seq,
                                         std::int64_t head_dim) const {
  return static_cast<double>(bh) *
         interp2(attn_seq, attn_head_dim, flash ? flash_bwd_s : attn_bwd_s,
                 static_cast<double>(seq), static_cast<double>(head_dim), true);
}

Calibration calibrate(int threads) {
  TRIDENT_CHECK(threads >= 1, "--calibrate needs at least one thread per rank, got ", threads);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const core::ExecContext ctx{.num_threads = threads};
  Calibration c;
  c.threads = threads;
  c.cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));

  // Linear layers on the grid.
  c.grid = {8, 32, 128, 512, 2048};
  const std::size_t n = c.grid.size();
  c.linear_fwd_s.assign(n * n * n, 0.0);
  c.linear_bwd_s.assign(n * n * n, 0.0);
  const std::int64_t gmax = c.grid.back();
  std::vector<float> x = filled(gmax * gmax, 0.01f), w = filled(gmax * gmax, 0.02f),
                     y = filled(gmax * gmax, 0.0f), dx = filled(gmax * gmax, 0.0f),
                     dw = filled(gmax * gmax, 0.0f), db = filled(gmax, 0.0f);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t o = 0; o < n; ++o) {
        const std::int64_t R = c.grid[r], I = c.grid[i], O = c.grid[o];
        if (static_cast<double>(R) * static_cast<double>(I) * static_cast<double>(O) > kFlopCap)
          continue;
        c.linear_fwd_s[idx3(n, r, i, o)] = time_call([&] {
          k::linear_forward(ctx, {.out = y.data(),
                                  .in = x.data(),
                                  .weight = w.data(),
                                  .bias = db.data(),
                                  .rows = R,
                                  .in_features = I,
                                  .out_features = O});
        });
        c.linear_bwd_s[idx3(n, r, i, o)] = time_call([&] {
          k::linear_backward(ctx, {.d_in = dx.data(),
                                   .d_weight = dw.data(),
                                   .d_bias = db.data(),
                                   .d_out = y.data(),
                                   .in = x.data(),
                                   .weight = w.data(),
                                   .rows = R,
                                   .in_features = I,
                                   .out_features = O});
        });
        const double flops = 2.0 * static_cast<double>(R * I * O);
        c.peak_tflops = std::max(c.peak_tflops, flops / c.linear_fwd_s[idx3(n, r, i, o)] / 1e12);
      }
  // Unmeasured (large) points: the rate of the point with the largest dimension halved... down
  // to a measured one, scaled linearly.
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t o = 0; o < n; ++o) {
        if (c.linear_fwd_s[idx3(n, r, i, o)] > 0) continue;
        std::size_t d[3] = {r, i, o};
        double scale = 1;
        while (c.linear_fwd_s[idx3(n, d[0], d[1], d[2])] <= 0) {
          std::size_t* big = std::max_element(d, d + 3);
          scale *= static_cast<double>(c.grid[*big]) / static_cast<double>(c.grid[*big - 1]);
          --*big;
        }
        c.linear_fwd_s[idx3(n, r, i, o)] = scale * c.linear_fwd_s[idx3(n, d[0], d[1], d[2])];
        c.linear_bwd_s[idx3(n, r, i, o)] = scale * c.linear_bwd_s[idx3(n, d[0], d[1], d[2])];
      }

  // Attention kernels: seconds per (batch x head) at each (seq_len, head_dim).
  c.attn_seq = {16, 64, 256, 1024};
  c.attn_head_dim = {8, 32, 128};
  for (std::int64_t T : c.attn_seq)
    for (std::int64_t HS : c.attn_head_dim) {
      const std::int64_t NH =
          std::max<std::int64_t>(1, std::min<std::int64_t>(8, (1 << 22) / (T * T * HS) + 1));
      const std::int64_t B = 1, C = NH * HS;
      std::vector<float> qkv = filled(B * T * 3 * C, 0.01f), out = filled(B * T * C, 0.0f),
                         probs = filled(B * NH * T * T, 0.0f), dprobs = probs, dqkv = qkv,
                         dout = filled(B * T * C, 0.01f), lse = filled(B * NH * T, 0);
      const double bh = static_cast<double>(B * NH);
      c.attn_fwd_s.push_back(time_call([&] {
                               k::attention_forward(ctx, {.out = out.data(),
                                                          .probs = probs.data(),
                                                          .qkv = qkv.data(),
                                                          .batch = B,
                                                          .seq_len = T,
                                                          .num_heads = NH,
                                                          .head_dim = HS});
                             }) /
                             bh);
      c.attn_bwd_s.push_back(time_call([&] {
                               k::attention_backward(ctx, {.d_qkv = dqkv.data(),
                                                           .d_probs = dprobs.data(),
                                                           .d_out = dout.data(),
                                                           .qkv = qkv.data(),
                                                           .probs = probs.data(),
                                                           .batch = B,
                                                           .seq_len = T,
                                                           .num_heads = NH,
                                                           .head_dim = HS});
                             }) /
                             bh);
      c.flash_fwd_s.push_back(time_call([&] {
                                k::flash_attention_forward(ctx, {.out = out.data(),
                                                                 .lse = lse.data(),
                                                                 .qkv = qkv.data(),
                                                                 .alibi = nullptr,
                                                                 .dropout = {},
                                                                 .batch = B,
                                                                 .seq_len = T,
                                                                 .num_heads = NH,
                                                                 .head_dim = HS});
                              }) /
                              bh);
      c.flash_bwd_s.push_back(time_call([&] {
                                k::flash_attention_backward(ctx, {.d_qkv = dqkv.data(),
                                                                  .d_out = dout.data(),
                                                                  .qkv = qkv.data(),
                                                                  .out = out.data(),
                                                                  .lse = lse.data(),
                                                                  .alibi = nullptr,
                                                                  .dropout = {},
                                                                  .batch = B,
                                                                  .seq_len = T,
                                                                  .num_heads = NH,
                                                                  .head_dim = HS});
                              }) /
                              bh);
    }

  // Element-wise kernels: rows of 256 columns, from 8 rows to 8192 rows.
  const std::int64_t cols = 256, big = 8192 * cols;
  std::vector<float> a = filled(big, 0.5f), b = filled(big, 0.25f), o2 = filled(big, 0.0f),
                     mean = filled(8192, 0), rstd = filled(8192, 1), gw = filled(cols, 1),
                     gb = filled(cols, 0);
  std::vector<std::byte> scratch(
      static_cast<std::size_t>(k::bias_gelu_backward_scratch_bytes(8192, cols)));
  c.layernorm_fwd = fit(
      [&](std::int64_t e) {
        k::layernorm_forward(ctx, {.out = o2.data(),
                                   .mean = mean.data(),
                                   .rstd = rstd.data(),
                                   .in = a.data(),
                                   .weight = gw.data(),
                                   .bias = gb.data(),
                                   .rows = e / cols,
                                   .cols = cols});
      },
      8 * cols, big);
  c.layernorm_bwd = fit(
      [&](std::int64_t e) {
        k::layernorm_backward(ctx, {.d_in = o2.data(),
                                    .d_weight = gw.data(),
                                    .d_bias = gb.data(),
                                    .d_out = b.data(),
                                    .in = a.data(),
                                    .weight = gw.data(),
                                    .mean = mean.data(),
                                    .rstd = rstd.data(),
                                    .rows = e / cols,
                                    .cols = cols});
      },
      8 * cols, big);
  c.bias_gelu_fwd = fit(
      [&](std::int64_t e) {
        k::bias_gelu_forward(
            ctx,
            {.out = o2.data(), .in = a.data(), .bias = gb.data(), .rows = e / cols, .cols = cols});
      },
      8 * cols, big);
  c.bias_gelu_bwd = fit(
      [&](std::int64_t e) {
        k::bias_gelu_backward(ctx, {.d_in = o2.data(),
                                    .d_bias = gb.data(),
                                    .d_out = b.data(),
                                    .in = a.data(),
                                    .bias = gb.data(),
                                    .rows = e / cols,
                                    .cols = cols,
                                    .scratch = scratch});
      },
      8 * cols, big);
  c.add = fit([&](std::int64_t e) { k::add_forward(ctx, o2.data(), a.data(), b.data(), e); },
              8 * cols, big);
  std::vector<std::int32_t> targets(8192, 1);
  c.cross_entropy = fit(
      [&](std::int64_t e) {
        k::cross_entropy_forward_backward(ctx, {.losses = mean.data(),
                                                .d_logits = o2.data(),
                                                .logits = a.data(),
                                                .targets = targets.data(),
                                                .rows = e / cols,
                                                .vocab = cols,
                                                .vocab_padded = cols});
      },
      8 * cols, big);
  std::vector<float> m = filled(big, 0), v = filled(big, 0);
  c.adamw = fit(
      [&](std::int64_t e) {
        k::adamw_update(
            ctx, {}, {.param = o2.data(), .m = m.data(), .v = v.data(), .grad = b.data(), .n = e});
      },
      8 * cols, big);
  c.embedding = c.add;
  // Memory bandwidth: a 64 MiB copy.
  const std::size_t bytes = 64u << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  c.memory_bw = static_cast<double>(bytes) /
                time_call([&] { std::memcpy(dst.data(), src.data(), bytes); }, 0.05);
  omp_set_num_threads(saved);
  return c;
}

std::string default_calibration_path() {
  if (const char* p = std::getenv("TRIDENT_PLAN_CACHE"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/trident/plan-cpu.json";
}

namespace {
nlohmann::json cost_json(const LinearCost& c) { return {c.overhead_s, c.per_element_s}; }
LinearCost cost_of(const nlohmann::json& j) {
  return {j.at(0).get<double>(), j.at(1).get<double>()};
}
}  // namespace

void save_calibration(const std::string& path, const Calibration& c) {
  nlohmann::json all = nlohmann::json::object();
  if (std::ifstream in(path); in) {
    try {
      in >> all;
    } catch (const std::exception&) {
      all = nlohmann::json::object();
    }
  }
  nlohmann::json j = {{"threads", c.threads},
                      {"cores", c.cores},
                      {"grid", c.grid},
                      {"linear_fwd_s", c.linear_fwd_s},
                      {"linear_bwd_s", c.linear_bwd_s},
                      {"attn_seq", c.attn_seq},
                      {"attn_head_dim", c.attn_head_dim},
                      {"attn_fwd_s", c.attn_fwd_s},
                      {"attn_bwd_s", c.attn_bwd_s},
                      {"flash_fwd_s", c.flash_fwd_s},
                      {"flash_bwd_s", c.flash_bwd_s},
                      {"layernorm_fwd", cost_json(c.layernorm_fwd)},
                      {"layernorm_bwd", cost_json(c.layernorm_bwd)},
                      {"bias_gelu_fwd", cost_json(c.bias_gelu_fwd)},
                      {"bias_gelu_bwd", cost_json(c.bias_gelu_bwd)},
                      {"add", cost_json(c.add)},
                      {"cross_entropy", cost_json(c.cross_entropy)},
                      {"adamw", cost_json(c.adamw)},
                      {"embedding", cost_json(c.embedding)},
                      {"memory_bw", c.memory_bw},
                      {"peak_tflops", c.peak_tflops}};
  all[std::to_string(c.threads)] = j;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(path);
  TRIDENT_CHECK(static_cast<bool>(out), "cannot write the calibration cache ", path,
                " (set TRIDENT_PLAN_CACHE to a writable file)");
  out << all.dump(1) << "\n";
}

bool load_calibration(const std::string& path, int threads, Calibration& c) {
  std::ifstream in(path);
  if (!in) return false;
  nlohmann::json all;
  try {
    in >> all;
  } catch (const std::exception& e) {
    throw core::InvalidArgument(core::str("the calibration cache ", path, " is not JSON (",
                                          e.what(),
                                          "); delete it and run trident plan --calibrate"));
  }
  const std::string key = std::to_string(threads);
  if (!all.contains(key)) return false;
  const nlohmann::json& j = all[key];
  c.threads = j.at("threads");
  c.cores = j.at("cores");
  c.grid = j.at("grid").get<std::vector<std::int64_t>>();
  c.linear_fwd_s = j.at("linear_fwd_s").get<std::vector<double>>();
  c.linear_bwd_s = j.at("linear_bwd_s").get<std::vector<double>>();
  c.attn_seq = j.at("attn_seq").get<std::vector<std::int64_t>>();
  c.attn_head_dim = j.at("attn_head_dim").get<std::vector<std::int64_t>>();
  c.attn_fwd_s = j.at("attn_fwd_s").get<std::vector<double>>();
  c.attn_bwd_s = j.at("attn_bwd_s").get<std::vector<double>>();
  c.flash_fwd_s = j.at("flash_fwd_s").get<std::vector<double>>();
  c.flash_bwd_s = j.at("flash_bwd_s").get<std::vector<double>>();
  c.layernorm_fwd = cost_of(j.at("layernorm_fwd"));
  c.layernorm_bwd = cost_of(j.at("layernorm_bwd"));
  c.bias_gelu_fwd = cost_of(j.at("bias_gelu_fwd"));
  c.bias_gelu_bwd = cost_of(j.at("bias_gelu_bwd"));
  c.add = cost_of(j.at("add"));
  c.cross_entropy = cost_of(j.at("cross_entropy"));
  c.adamw = cost_of(j.at("adamw"));
  c.embedding = cost_of(j.at("embedding"));
  c.memory_bw = j.at("memory_bw");
  c.peak_tflops = j.at("peak_tflops");
  return true;
}

}  // namespace trident::plan
