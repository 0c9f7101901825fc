#include "trident/plan/calibration.h"

#include <omp.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/core/view.h"
#include "trident/data/json_io.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/dropout.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/linear.h"

namespace trident::plan {

double calibration_clock_s(int threads) {
  if (threads == 1) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

namespace k = kernels;
using Clock = std::chrono::steady_clock;

// The thread count calibrate() times with (calibration_clock_s).
int g_threads = 1;
double now_s() { return calibration_clock_s(g_threads); }

// The median of a few batches of calls, each batch at least `min_s` long: seconds per call. The
// median, not the best: the plan predicts a typical iteration (bench/plan/compare_cpu.py compares
// it with the median one), and on a machine whose speed moves by 10 % from one second to the next
// the best batch is a lucky one (session 7: every layout predicted 5-10 % fast with the best).
template <class F>
double time_call(F&& f, double min_s = 0.01, int batches = 3) {
  f();  // warm-up (first-touch, oneDNN's JIT)
  std::vector<double> per_call;
  for (int b = 0; b < batches; ++b) {
    int n = 0;
    const double t0 = now_s();
    double el = 0;
    do {
      f();
      ++n;
      el = now_s() - t0;
    } while (el < min_s && n < 1000);
    per_call.push_back(el / n);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

std::vector<float> filled(std::int64_t n, float v) {
  return std::vector<float>(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)), v);
}

// Activation-like values: N(0, std). Some kernels' speed depends on the values (the GeLU's
// exponential saturates for large inputs), so constants would time them wrongly.
std::vector<float> normal(std::int64_t n, float std, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
  for (float& x : v) x = d(rng);
  return v;
}

// A view of the first shape.numel() elements of x (the element-wise kernels are timed on
// prefixes of one set of buffers).
template <class T>
core::TensorView prefix(const std::vector<T>& x, core::Shape shape) {
  TRIDENT_ASSERT(shape.numel() <= static_cast<std::int64_t>(x.size()), "calibration: a view of ",
                 shape.numel(), " elements of a buffer of ", x.size());
  return core::view(x.data(), shape);
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

std::string linear_key(std::int64_t r, std::int64_t i, std::int64_t o) {
  return std::to_string(r) + "," + std::to_string(i) + "," + std::to_string(o);
}
std::string attention_key(bool flash, std::int64_t bh, std::int64_t t, std::int64_t hs) {
  return std::string(flash ? "1," : "0,") + std::to_string(bh) + "," + std::to_string(t) + "," +
         std::to_string(hs);
}

double CommCosts::at(const std::vector<std::int64_t>& bytes, const std::vector<double>& t,
                     double b) {
  if (bytes.empty() || t.size() != bytes.size()) return 0;
  const std::size_t n = bytes.size();
  if (b <= static_cast<double>(bytes.front())) return t.front();
  if (b >= static_cast<double>(bytes.back()))
    return t.back() * b / static_cast<double>(bytes.back());
  std::size_t j = 0;
  while (j + 2 < n && static_cast<double>(bytes[j + 1]) < b) ++j;
  const double x0 = static_cast<double>(bytes[j]), x1 = static_cast<double>(bytes[j + 1]);
  return t[j] + (t[j + 1] - t[j]) * (b - x0) / (x1 - x0);
}

std::string comm_key(int world, int group) {
  return std::to_string(world) + "," + std::to_string(group);
}

const CommCosts* Calibration::comm_costs(int world, int group) const {
  const auto it = comm.find(comm_key(world, group));
  return it == comm.end() ? nullptr : &it->second;
}

double Calibration::linear_forward_s(std::int64_t rows, std::int64_t in, std::int64_t out) const {
  if (auto it = linear_exact.find(linear_key(rows, in, out)); it != linear_exact.end())
    return it->second.first;
  return interp3(grid, linear_fwd_s, static_cast<double>(rows), static_cast<double>(in),
                 static_cast<double>(out));
}
double Calibration::linear_backward_s(std::int64_t rows, std::int64_t in, std::int64_t out) const {
  if (auto it = linear_exact.find(linear_key(rows, in, out)); it != linear_exact.end())
    return it->second.second;
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

namespace {

// Seconds of linear_forward and linear_backward (d_in, d_weight, d_bias) for one shape.
std::pair<double, double> time_linear(const core::ExecContext& ctx, std::int64_t R, std::int64_t I,
                                      std::int64_t O) {
  const std::vector<float> x = normal(R * I, 1.0f, 5), w = normal(O * I, 0.02f, 6),
                           bias = normal(O, 0.02f, 7), dy = normal(R * O, 1e-3f, 8);
  std::vector<float> y = filled(R * O, 0.0f), dx = filled(R * I, 0.0f), dw = filled(O * I, 0.0f),
                     db = filled(O, 0.0f);
  const double f = time_call([&] {
    k::linear(ctx, {.out = prefix(y, {R, O}),
                    .in = prefix(x, {R, I}),
                    .weight = prefix(w, {O, I}),
                    .bias = prefix(bias, {O})});
  });
  const double b = time_call([&] {
    k::linear_backward(ctx, {.d_in = prefix(dx, {R, I}),
                             .d_weight = prefix(dw, {O, I}),
                             .d_bias = prefix(db, {O}),
                             .d_out = prefix(dy, {R, O}),
                             .in = prefix(x, {R, I}),
                             .weight = prefix(w, {O, I})});
  });
  return {f, b};
}

// Seconds of one attention forward and backward call over bh = batch x heads (batch 1).
std::pair<double, double> time_attention(const core::ExecContext& ctx, bool flash, std::int64_t NH,
                                         std::int64_t T, std::int64_t HS) {
  const std::int64_t B = 1, C = NH * HS;
  const core::Shape qkv_shape{B, T, NH, 3 * HS}, out_shape{B, T, C};
  const std::vector<float> qkv = normal(B * T * 3 * C, 1.0f, 9),
                           dout = normal(B * T * C, 1e-3f, 10);
  std::vector<float> out = filled(B * T * C, 0.0f), dqkv = filled(B * T * 3 * C, 0.0f),
                     lse = filled(B * NH * T, 0.0f);
  if (flash) {
    const double f = time_call([&] {
      k::flash_attention(ctx, {.out = prefix(out, out_shape),
                               .lse = prefix(lse, {B, NH, T}),
                               .qkv = prefix(qkv, qkv_shape),
                               .dropout = {}});
    });
    const double b = time_call([&] {
      k::flash_attention_backward(ctx, {.d_qkv = prefix(dqkv, qkv_shape),
                                        .d_out = prefix(dout, out_shape),
                                        .qkv = prefix(qkv, qkv_shape),
                                        .out = prefix(out, out_shape),
                                        .lse = prefix(lse, {B, NH, T}),
                                        .dropout = {}});
    });
    return {f, b};
  }
  std::vector<float> probs = filled(B * NH * T * T, 0.0f), dprobs = probs;
  const double f = time_call([&] {
    k::attention(ctx, {.out = prefix(out, out_shape),
                       .probs = prefix(probs, {B, NH, T, T}),
                       .qkv = prefix(qkv, qkv_shape)});
  });
  const double b = time_call([&] {
    k::attention_backward(ctx, {.d_qkv = prefix(dqkv, qkv_shape),
                                .d_probs = prefix(dprobs, {B, NH, T, T}),
                                .d_out = prefix(dout, out_shape),
                                .qkv = prefix(qkv, qkv_shape),
                                .probs = prefix(probs, {B, NH, T, T})});
  });
  return {f, b};
}

Calibration calibrate_grid(int threads, const core::ExecContext& ctx) {
  Calibration c;
  c.threads = threads;
  c.cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));

  // Linear layers on the grid.
  c.grid = {8, 32, 128, 512, 2048};
  const std::size_t n = c.grid.size();
  c.linear_fwd_s.assign(n * n * n, 0.0);
  c.linear_bwd_s.assign(n * n * n, 0.0);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t o = 0; o < n; ++o) {
        const std::int64_t R = c.grid[r], I = c.grid[i], O = c.grid[o];
        if (static_cast<double>(R) * static_cast<double>(I) * static_cast<double>(O) > kFlopCap)
          continue;
        const auto [f, b] = time_linear(ctx, R, I, O);
        c.linear_fwd_s[idx3(n, r, i, o)] = f;
        c.linear_bwd_s[idx3(n, r, i, o)] = b;
        c.peak_tflops = std::max(c.peak_tflops, 2.0 * static_cast<double>(R * I * O) / f / 1e12);
      }
  // Unmeasured (large) points: the point with its largest dimension stepped down until measured,
  // scaled linearly (the rate is saturated there).
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
      const std::int64_t NH = std::clamp<std::int64_t>((1 << 22) / (T * T * HS), 1, 8);
      const double bh = static_cast<double>(NH);
      const auto [af, ab] = time_attention(ctx, false, NH, T, HS);
      const auto [ff, fb] = time_attention(ctx, true, NH, T, HS);
      c.attn_fwd_s.push_back(af / bh);
      c.attn_bwd_s.push_back(ab / bh);
      c.flash_fwd_s.push_back(ff / bh);
      c.flash_bwd_s.push_back(fb / bh);
    }

  // Element-wise kernels: rows of 256 columns, from 8 rows to 8192 rows.
  const std::int64_t cols = 256, big = 8192 * cols;
  // Inputs never written (gradients go to their own buffers, so repeated calls see the same
  // values).
  const std::vector<float> a = normal(big, 1.0f, 1), b = normal(big, 1e-3f, 2),
                           gw = normal(cols, 0.02f, 3), gb = normal(cols, 0.02f, 4);
  std::vector<float> o2 = filled(big, 0.0f), mean = filled(8192, 0), rstd = filled(8192, 1),
                     dgw = filled(cols, 0), dgb = filled(cols, 0);
  std::vector<std::byte> scratch(
      static_cast<std::size_t>(k::bias_gelu_backward_scratch_bytes(8192, cols)));
  c.layernorm_fwd = fit(
      [&](std::int64_t e) {
        k::layernorm(ctx, {.out = prefix(o2, {e / cols, cols}),
                           .mean = prefix(mean, {e / cols}),
                           .rstd = prefix(rstd, {e / cols}),
                           .in = prefix(a, {e / cols, cols}),
                           .weight = prefix(gw, {cols}),
                           .bias = prefix(gb, {cols})});
      },
      8 * cols, big);
  c.layernorm_bwd = fit(
      [&](std::int64_t e) {
        k::layernorm_backward(ctx, {.d_in = prefix(o2, {e / cols, cols}),
                                    .d_weight = prefix(dgw, {cols}),
                                    .d_bias = prefix(dgb, {cols}),
                                    .d_out = prefix(b, {e / cols, cols}),
                                    .in = prefix(a, {e / cols, cols}),
                                    .weight = prefix(gw, {cols}),
                                    .mean = prefix(mean, {e / cols}),
                                    .rstd = prefix(rstd, {e / cols})});
      },
      8 * cols, big);
  c.bias_gelu_fwd = fit(
      [&](std::int64_t e) {
        k::bias_gelu(ctx, {.out = prefix(o2, {e / cols, cols}),
                           .in = prefix(a, {e / cols, cols}),
                           .bias = prefix(gb, {cols})});
      },
      8 * cols, big);
  c.bias_gelu_bwd = fit(
      [&](std::int64_t e) {
        k::bias_gelu_backward(ctx, {.d_in = prefix(o2, {e / cols, cols}),
                                    .d_bias = prefix(dgb, {cols}),
                                    .d_out = prefix(b, {e / cols, cols}),
                                    .in = prefix(a, {e / cols, cols}),
                                    .bias = prefix(gb, {cols}),
                                    .scratch = scratch});
      },
      8 * cols, big);
  c.add = fit(
      [&](std::int64_t e) {
        k::add(ctx, {.out = prefix(o2, {e}), .a = prefix(a, {e}), .b = prefix(b, {e})});
      },
      8 * cols, big);
  std::vector<std::int32_t> targets(8192, 1);
  c.cross_entropy = fit(
      [&](std::int64_t e) {
        k::cross_entropy_forward_backward(ctx, {.losses = prefix(mean, {e / cols}),
                                                .d_logits = prefix(o2, {e / cols, cols}),
                                                .logits = prefix(a, {e / cols, cols}),
                                                .targets = prefix(targets, {e / cols}),
                                                .vocab = cols});
      },
      8 * cols, big);
  std::vector<float> m = filled(big, 0), v = filled(big, 0);
  c.adamw = fit(
      [&](std::int64_t e) {
        k::adamw_update(ctx, {},
                        {.param = prefix(o2, {e}),
                         .m = prefix(m, {e}),
                         .v = prefix(v, {e}),
                         .grad = prefix(b, {e})});
      },
      8 * cols, big);
  c.embedding = c.add;
  c.dropout = fit(
      [&](std::int64_t e) {
        k::hidden_dropout(ctx, {.out = prefix(o2, {e / cols, cols}),
                                .in = prefix(a, {e / cols, cols}),
                                .first_row = 0,
                                .p = 0.1f,
                                .seed = 1,
                                .stream = 2});
      },
      8 * cols, big);
  // Memory bandwidth: a 64 MiB copy.
  const std::size_t bytes = 64u << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  c.memory_bw = static_cast<double>(bytes) /
                time_call([&] { std::memcpy(dst.data(), src.data(), bytes); }, 0.05);
  return c;
}

}  // namespace

Calibration calibrate(int threads, const KernelShapes& shapes, const Calibration* base) {
  TRIDENT_CHECK(threads >= 1, "--calibrate needs at least one thread per rank, got ", threads);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  g_threads = threads;
  const core::ExecContext ctx{.num_threads = threads};
  Calibration c = base != nullptr ? *base : calibrate_grid(threads, ctx);
  for (const auto& [r, i, o] : shapes.linear) {
    const std::string key = linear_key(r, i, o);
    if (!c.linear_exact.count(key)) c.linear_exact[key] = time_linear(ctx, r, i, o);
  }
  for (const auto& [flash, bh, t, hs] : shapes.attention) {
    const std::string key = attention_key(flash, bh, t, hs);
    if (!c.attention_exact.count(key))
      c.attention_exact[key] = time_attention(ctx, flash, bh, t, hs);
  }
  omp_set_num_threads(saved);
  return c;
}

std::string default_calibration_path() {
  if (const char* p = std::getenv("TRIDENT_PLAN_CACHE"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/trident/plan-cpu.json";
}

namespace {
// Caches written by another version (other kernels, other fields) are not read: recalibrate.
constexpr int kCacheVersion = 2;
nlohmann::json cost_json(const LinearCost& c) { return {c.overhead_s, c.per_element_s}; }
nlohmann::json comm_json(const std::map<std::string, CommCosts>& comm) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, c] : comm) {
    j[key] = {{"bytes", c.bytes},
              {"all_reduce_s", c.all_reduce_s},
              {"reduce_scatter_s", c.reduce_scatter_s},
              {"all_gather_s", c.all_gather_s},
              {"p2p_s", c.p2p_s},
              {"corun_gemm", c.corun_gemm},
              {"sync_wait_s", c.sync_wait_s},
              {"sync_wait_fraction", c.sync_wait_fraction}};
  }
  return j;
}

// The cache reader. save_calibration writes the file, but it lies in a home directory where an
// older trident, a full disk or a hand edit may have changed it: every value is checked before the
// time model uses it (it interpolates in log space, so times must be positive and the grids
// sorted), and every error names the file, the entry, the key and the fix (exit code 2, bad input).
constexpr std::int64_t kMaxAxis = std::int64_t{1} << 31;  // grid sizes, shapes (int64 products)
constexpr std::size_t kMaxAxisPoints = 64;                // points per grid axis (64^3 GEMM points)

class CacheReader {
 public:
  CacheReader(const std::string& path, std::string entry, std::string prefix = "")
      : path_(path), entry_(std::move(entry)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw core::DataError(core::str(
        "the calibration cache ", path_, ": entry \"", entry_, "\", key \"", prefix_, key,
        "\": ", what,
        "; delete the file, or re-run trident plan --gpu cpu --calibrate (it measures a bad "
        "entry afresh)"));
  }

  const nlohmann::json& at(const nlohmann::json& j, const std::string& key) const {
    const auto it = j.find(key);
    if (it == j.end()) fail(key, "missing");
    return *it;
  }

  std::int64_t integer(const nlohmann::json& v, const std::string& key, std::int64_t lo,
                       std::int64_t hi) const {
    bool ok = false;
    std::int64_t x = 0;
    if (v.is_number_unsigned()) {
      const std::uint64_t u = v.get<std::uint64_t>();
      ok = u <= static_cast<std::uint64_t>(hi);
      x = static_cast<std::int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<std::int64_t>();
      ok = true;
    }
    if (!ok || x < lo || x > hi) {
      fail(key, core::str("must be an integer in [", lo, ", ", hi, "], got ", v.dump()));
    }
    return x;
  }

  // A finite number, > 0 (positive) or >= 0.
  double number(const nlohmann::json& v, const std::string& key, bool positive) const {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 ||
        (positive && v.get<double>() == 0)) {
      fail(key,
           core::str("must be a finite number ", positive ? "> 0" : ">= 0", ", got ", v.dump()));
    }
    return v.get<double>();
  }

  // An optional number in [lo, hi]; `fallback` when the key is absent.
  double optional(const nlohmann::json& j, const std::string& key, double fallback, double lo,
                  double hi) const {
    const auto it = j.find(key);
    if (it == j.end()) return fallback;
    const double x = number(*it, key, false);
    if (x < lo || x > hi) fail(key, core::str("must lie in [", lo, ", ", hi, "], got ", x));
    return x;
  }

  // A grid axis: 1 to kMaxAxisPoints integers in [1, kMaxAxis], strictly increasing.
  std::vector<std::int64_t> axis(const nlohmann::json& j, const std::string& key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_array() || v.empty() || v.size() > kMaxAxisPoints) {
      fail(key, core::str("must be a list of 1 to ", kMaxAxisPoints, " sizes"));
    }
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < v.size(); ++i) {
      out.push_back(integer(v[i], core::str(key, "[", i, "]"), 1, kMaxAxis));
      if (i > 0 && out[i] <= out[i - 1]) fail(key, "must be strictly increasing");
    }
    return out;
  }

  // `n` times in seconds, each finite and > 0.
  std::vector<double> times(const nlohmann::json& j, const std::string& key, std::size_t n) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_array() || v.size() != n) {
      fail(key, core::str("must be a list of ", n, " times (one per grid point)"));
    }
    std::vector<double> out;
    for (std::size_t i = 0; i < n; ++i)
      out.push_back(number(v[i], core::str(key, "[", i, "]"), true));
    return out;
  }

  LinearCost cost(const nlohmann::json& j, const std::string& key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_array() || v.size() != 2) {
      fail(key, "must be [overhead seconds, seconds per element]");
    }
    return {number(v[0], key + "[0]", false), number(v[1], key + "[1]", false)};
  }

  // Exact timings: {"a,b,...": [forward s, backward s]}, `parts` integers per key (the first one
  // 0 or 1 when `flag_first`), written back exactly as linear_key / attention_key write them.
  std::map<std::string, std::pair<double, double>> exact(const nlohmann::json& j,
                                                         const std::string& key, int parts,
                                                         bool flag_first) const {
    std::map<std::string, std::pair<double, double>> out;
    const auto it = j.find(key);
    if (it == j.end()) return out;  // caches from before exact shapes were timed
    if (!it->is_object()) fail(key, "must be an object of shape -> [forward s, backward s]");
    for (const auto& [shape, v] : it->items()) {
      const std::string name = core::str(key, ".", shape);
      std::vector<std::int64_t> dims;
      std::size_t at_char = 0;
      bool ok = true;
      for (int p = 0; p < parts && ok; ++p) {
        const std::size_t end = p + 1 < parts ? shape.find(',', at_char) : shape.size();
        ok = end != std::string::npos && end > at_char && end - at_char <= 10;
        std::int64_t x = 0;
        for (std::size_t c = at_char; ok && c < end; ++c) {
          ok = shape[c] >= '0' && shape[c] <= '9';
          x = x * 10 + (shape[c] - '0');
        }
        ok = ok && (p == 0 && flag_first ? x <= 1 : x >= 1 && x <= kMaxAxis);
        dims.push_back(x);
        at_char = end + 1;
      }
      std::string canonical;
      for (std::size_t p = 0; ok && p < dims.size(); ++p) {
        canonical += (p ? "," : "") + std::to_string(dims[p]);
      }
      if (!ok || canonical != shape) {
        fail(name, core::str("is not a shape of ", parts, " comma-separated integers",
                             flag_first ? " (flash 0 or 1, then sizes >= 1)" : " (sizes >= 1)"));
      }
      if (!v.is_array() || v.size() != 2) fail(name, "must be [forward s, backward s]");
      out[shape] = {number(v[0], name + "[0]", true), number(v[1], name + "[1]", true)};
    }
    return out;
  }

  // Collectives: {"world,group": {"bytes": [...], "<op>_s": [...] per op}}, world >= group >= 2
  // and group dividing world, as --calibrate-comm writes them. Absent in caches from before it.
  std::map<std::string, CommCosts> comm(const nlohmann::json& j) const {
    std::map<std::string, CommCosts> out;
    const auto it = j.find("comm");
    if (it == j.end()) return out;
    if (!it->is_object()) fail("comm", "must be an object of \"ranks,group\" -> costs");
    for (const auto& [key, v] : it->items()) {
      const std::string name = "comm." + key;
      const std::size_t comma = key.find(',');
      int world = 0, group = 0;
      const bool parsed = comma != std::string::npos && comma > 0 && comma + 1 < key.size() &&
                          comma <= 5 && key.size() - comma - 1 <= 5 &&
                          key.find_first_not_of("0123456789,") == std::string::npos &&
                          key.find(',', comma + 1) == std::string::npos;
      if (parsed) {
        world = std::stoi(key.substr(0, comma));
        group = std::stoi(key.substr(comma + 1));
      }
      if (!parsed || group < 2 || world < group || world % group != 0 ||
          comm_key(world, group) != key) {
        fail(name, "is not \"ranks,group\" (integers, group >= 2 dividing ranks)");
      }
      if (!v.is_object()) fail(name, "must be an object of sizes and times");
      const CacheReader sub(path_, entry_, name + ".");
      CommCosts c;
      c.bytes = sub.axis(v, "bytes");
      c.all_reduce_s = sub.times(v, "all_reduce_s", c.bytes.size());
      c.reduce_scatter_s = sub.times(v, "reduce_scatter_s", c.bytes.size());
      c.all_gather_s = sub.times(v, "all_gather_s", c.bytes.size());
      c.p2p_s = sub.times(v, "p2p_s", c.bytes.size());
      // The ranks' interference (absent in caches from before it was measured: none).
      c.corun_gemm = sub.optional(v, "corun_gemm", 1.0, 0.5, 16.0);
      c.sync_wait_s = sub.optional(v, "sync_wait_s", 0.0, 0.0, 1.0);
      c.sync_wait_fraction = sub.optional(v, "sync_wait_fraction", 0.0, 0.0, 4.0);
      out[key] = std::move(c);
    }
    return out;
  }

 private:
  const std::string& path_;
  std::string entry_;
  std::string prefix_;  // of every key named in an error (nested objects)
};
}  // namespace

void save_calibration(const std::string& path, const Calibration& c) {
  // The other thread counts' entries are kept; a file that is not a JSON object is replaced.
  nlohmann::json all = nlohmann::json::object();
  if (std::ifstream in(path); in) {
    try {
      in >> all;
    } catch (const std::exception&) {
      all = nlohmann::json::object();
    }
    if (!all.is_object()) all = nlohmann::json::object();
  }
  nlohmann::json j = {{"version", kCacheVersion},
                      {"threads", c.threads},
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
                      {"dropout", cost_json(c.dropout)},
                      {"linear_exact", c.linear_exact},
                      {"attention_exact", c.attention_exact},
                      {"memory_bw", c.memory_bw},
                      {"peak_tflops", c.peak_tflops},
                      {"comm", comm_json(c.comm)}};
  all[std::to_string(c.threads)] = j;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(path);
  TRIDENT_CHECK(static_cast<bool>(out), "cannot write the calibration cache ", path,
                " (set TRIDENT_PLAN_CACHE to a writable file)");
  out << all.dump(1) << "\n";
}

bool load_calibration(const std::string& path, int threads, Calibration& c) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  nlohmann::json all;
  try {
    all = data::parse_json_strict(in);
  } catch (const nlohmann::json::exception& e) {
    throw core::DataError(core::str("the calibration cache ", path, " is not JSON (", e.what(),
                                    "); delete the file, or re-run trident plan --gpu cpu "
                                    "--calibrate (it replaces a file that is not JSON)"));
  }
  if (!all.is_object()) {
    throw core::DataError(core::str("the calibration cache ", path,
                                    " is not a JSON object of thread count -> calibration; delete "
                                    "the file, or re-run trident plan --gpu cpu --calibrate"));
  }
  const std::string key = std::to_string(threads);
  const auto entry = all.find(key);
  if (entry == all.end()) return false;
  const CacheReader r(path, key);
  const nlohmann::json& j = *entry;
  if (!j.is_object()) r.fail(key, "must be an object (one calibration)");
  // A calibration written by another version of the format (other kernels, other fields) is not
  // read: the caller calibrates again.
  if (!j.contains("version") || j["version"] != kCacheVersion) return false;
  Calibration out;
  out.threads = static_cast<int>(r.integer(r.at(j, "threads"), "threads", threads, threads));
  out.cores = static_cast<int>(r.integer(r.at(j, "cores"), "cores", 1, 1 << 20));
  out.grid = r.axis(j, "grid");
  const std::size_t n = out.grid.size();
  out.linear_fwd_s = r.times(j, "linear_fwd_s", n * n * n);
  out.linear_bwd_s = r.times(j, "linear_bwd_s", n * n * n);
  out.attn_seq = r.axis(j, "attn_seq");
  out.attn_head_dim = r.axis(j, "attn_head_dim");
  const std::size_t na = out.attn_seq.size() * out.attn_head_dim.size();
  out.attn_fwd_s = r.times(j, "attn_fwd_s", na);
  out.attn_bwd_s = r.times(j, "attn_bwd_s", na);
  out.flash_fwd_s = r.times(j, "flash_fwd_s", na);
  out.flash_bwd_s = r.times(j, "flash_bwd_s", na);
  out.layernorm_fwd = r.cost(j, "layernorm_fwd");
  out.layernorm_bwd = r.cost(j, "layernorm_bwd");
  out.bias_gelu_fwd = r.cost(j, "bias_gelu_fwd");
  out.bias_gelu_bwd = r.cost(j, "bias_gelu_bwd");
  out.add = r.cost(j, "add");
  out.cross_entropy = r.cost(j, "cross_entropy");
  out.adamw = r.cost(j, "adamw");
  out.embedding = r.cost(j, "embedding");
  out.dropout = r.cost(j, "dropout");
  out.linear_exact = r.exact(j, "linear_exact", 3, false);
  out.attention_exact = r.exact(j, "attention_exact", 4, true);
  out.memory_bw = r.number(r.at(j, "memory_bw"), "memory_bw", true);
  out.peak_tflops = r.number(r.at(j, "peak_tflops"), "peak_tflops", true);
  out.comm = r.comm(j);
  c = std::move(out);
  return true;
}

}  // namespace trident::plan
