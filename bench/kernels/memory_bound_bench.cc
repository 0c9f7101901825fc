// Bandwidth benchmark of the memory-bound kernels (LayerNorm, GeLU, AdamW, Lion, and add as a
// STREAM-like calibration) on arrays far larger than the caches. Reports effective GB/s = the bytes
// a kernel must move at least (each input read once, each output written once, no write-allocate)
// divided by the median time, against the ~29 GB/s STREAM triad of reference/cpu-ceilings.md and
// against the add kernel measured in the same run (an in-situ STREAM-like calibration).
//
// Usage: trident_memory_bound_bench [--reps N] [--threads 2,1]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "trident/core/view.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/lion.h"

namespace trident::bench {
namespace {

constexpr double kStreamTriadGBs = 29.0;  // 2 cores, reference/cpu-ceilings.md section 4

struct Case {
  std::string name;
  double bytes;  // minimum traffic per call
  std::function<void(const core::ExecContext&)> call;
};

double time_median(const core::ExecContext& ctx, const Case& c, int reps) {
  c.call(ctx);  // warm-up (page faults, thread start)
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    core::Timer timer;
    c.call(ctx);
    t.push_back(timer.elapsed_s());
  }
  return median(t);
}

int run(int reps, const std::vector<int>& thread_counts) {
  // LayerNorm over GPT-2 activations: 16384 tokens x 768.
  const std::int64_t rows = 16384, cols = 768, ln_n = rows * cols;
  // GeLU over the MLP activation of 8192 tokens: 8192 x 3072.
  const std::int64_t gelu_n = 8192 * 3072;
  // AdamW over 32M parameters (a quarter of GPT-2 124M), add over 32M elements.
  const std::int64_t adam_n = 32 * 1024 * 1024, add_n = 32 * 1024 * 1024;

  std::vector<float> ln_in(ln_n), ln_out(ln_n), ln_dout(ln_n), ln_din(ln_n), w(cols), b(cols),
      dw(cols), db(cols), mean(rows), rstd(rows);
  fill_uniform(ln_in.data(), ln_n, 1);
  fill_uniform(ln_dout.data(), ln_n, 2);
  fill_uniform(w.data(), cols, 3);
  fill_uniform(b.data(), cols, 4);
  std::vector<float> g_in(gelu_n), g_out(gelu_n), g_dout(gelu_n);
  fill_uniform(g_in.data(), gelu_n, 5);
  fill_uniform(g_dout.data(), gelu_n, 6);
  std::vector<float> p(adam_n), m(adam_n), v(adam_n), grad(adam_n);
  fill_uniform(p.data(), adam_n, 7);
  fill_uniform(grad.data(), adam_n, 8);
  std::vector<float> a1(add_n), a2(add_n), a3(add_n);
  fill_uniform(a1.data(), add_n, 9);
  fill_uniform(a2.data(), add_n, 10);

  const std::int64_t ce_rows = 1024, ce_vocab = 50304, ce_n = ce_rows * ce_vocab;
  std::vector<float> ce_in(static_cast<std::size_t>(ce_n)), ce_logits(ce_in.size()),
      ce_loss(static_cast<std::size_t>(ce_rows));
  fill_uniform(ce_in.data(), ce_n, 11);
  std::vector<std::int32_t> ce_targets(static_cast<std::size_t>(ce_rows));
  for (std::int64_t r = 0; r < ce_rows; ++r) {
    ce_targets[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 7919) % 50257);
  }
  const double f = sizeof(float);
  const std::vector<Case> cases = {
      {"add (STREAM add: 2 reads, 1 write)", 3 * f * add_n,
       [&](const core::ExecContext& ctx) {
         kernels::add(ctx, {.out = core::view(a3.data(), {add_n}),
                            .a = core::view(a1.data(), {add_n}),
                            .b = core::view(a2.data(), {add_n})});
       }},
      {"layernorm_forward 16384x768", 2 * f * ln_n,
       [&](const core::ExecContext& ctx) {
         kernels::layernorm(ctx, {.out = core::view(ln_out.data(), {rows, cols}),
                                  .mean = core::view(mean.data(), {rows}),
                                  .rstd = core::view(rstd.data(), {rows}),
                                  .in = core::view(ln_in.data(), {rows, cols}),
                                  .weight = core::view(w.data(), {cols}),
                                  .bias = core::view(b.data(), {cols})});
       }},
      // d_out, in read; d_in read and written (+=). The weight-gradient pass re-reads d_out and
      // in; that traffic is not counted.
      {"layernorm_backward 16384x768", 4 * f * ln_n,
       [&](const core::ExecContext& ctx) {
         kernels::layernorm_backward(ctx, {.d_in = core::view(ln_din.data(), {rows, cols}),
                                           .d_weight = core::view(dw.data(), {cols}),
                                           .d_bias = core::view(db.data(), {cols}),
                                           .d_out = core::view(ln_dout.data(), {rows, cols}),
                                           .in = core::view(ln_in.data(), {rows, cols}),
                                           .weight = core::view(w.data(), {cols}),
                                           .mean = core::view(mean.data(), {rows}),
                                           .rstd = core::view(rstd.data(), {rows})});
       }},
      {"gelu_forward 8192x3072", 2 * f * gelu_n,
       [&](const core::ExecContext& ctx) {
         kernels::gelu(ctx, {.out = core::view(g_out.data(), {gelu_n}),
                             .in = core::view(g_in.data(), {gelu_n})});
       }},
      {"gelu_backward 8192x3072", 3 * f * gelu_n,
       [&](const core::ExecContext& ctx) {
         kernels::gelu_backward(ctx, {.d_in = core::view(g_out.data(), {gelu_n}),
                                      .d_out = core::view(g_dout.data(), {gelu_n}),
                                      .in = core::view(g_in.data(), {gelu_n})});
       }},
      // logits read, d_logits written (the max, exp and scale passes re-read the row from the
      // caches; that traffic is not counted).
      {"cross_entropy_forward_backward 1024x50304", 2 * f * ce_n,
       [&](const core::ExecContext& ctx) {
         kernels::cross_entropy_forward_backward(
             ctx, {.losses = core::view(ce_loss.data(), {ce_rows}),
                   .d_logits = core::view(ce_logits.data(), {ce_rows, ce_vocab}),
                   .logits = core::view(ce_in.data(), {ce_rows, ce_vocab}),
                   .targets = core::view(ce_targets.data(), {ce_rows}),
                   .d_scale = 1e-3f,
                   .vocab = 50257});
       }},
      // param, m, v read and written; grad read.
      {"adamw_update 32M params", 7 * f * adam_n,
       [&](const core::ExecContext& ctx) {
         kernels::adamw_update(ctx, {.lr = 1e-4f, .weight_decay = 0.1f, .step = 10},
                               {.param = core::view(p.data(), {adam_n}),
                                .m = core::view(m.data(), {adam_n}),
                                .v = core::view(v.data(), {adam_n}),
                                .grad = core::view(grad.data(), {adam_n})});
       }},
      // param and m read and written; grad read: one state array fewer than AdamW.
      {"lion_update 32M params", 5 * f * adam_n,
       [&](const core::ExecContext& ctx) {
         kernels::lion_update(ctx, {.lr = 1e-4f, .weight_decay = 0.1f},
                              {.param = core::view(p.data(), {adam_n}),
                               .m = core::view(m.data(), {adam_n}),
                               .grad = core::view(grad.data(), {adam_n})});
       }},
  };

  std::printf(
      "# trident_memory_bound_bench (median of %d calls; effective GB/s = minimum bytes "
      "moved / time; STREAM triad on 2 cores = %.0f GB/s)\n\n",
      reps, kStreamTriadGBs);
  for (int threads : thread_counts) {
    core::ExecContext ctx = core::ExecContext::cpu();
    ctx.num_threads = threads;
    std::vector<std::string> lines;
    double add_gbs = 0.0;  // the first case: in-situ bandwidth calibration
    for (const Case& c : cases) {
      wait_for_idle(0.1, 0.25, 20.0);  // the machine is shared; the load is printed either way
      ForeignLoad load;
      load.start();
      const double s = time_median(ctx, c, reps);
      const double gbs = c.bytes / s * 1e-9;
      if (add_gbs == 0.0) add_gbs = gbs;
      char line[256];
      std::snprintf(line, sizeof line, "| %s | %.1f | %.2f | %.1f | %.0f%% | %.0f%% | %.2f |",
                    c.name.c_str(), c.bytes * 1e-6, s * 1e3, gbs, 100.0 * gbs / kStreamTriadGBs,
                    100.0 * gbs / add_gbs, load.stop());
      lines.push_back(line);
    }
    std::printf("## %d thread%s\n\n", threads, threads > 1 ? "s" : "");
    std::printf(
        "| kernel | MB moved | ms | GB/s | of 29 GB/s | of add | foreign load (cores) |\n"
        "|---|---|---|---|---|---|---|\n");
    for (const std::string& l : lines) std::printf("%s\n", l.c_str());
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace trident::bench

int main(int argc, char** argv) {
  int reps = 7;
  std::vector<int> threads = {2, 1};
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
    std::fprintf(stderr, "trident_memory_bound_bench: %s\n", e.what());
    return 1;
  }
}
