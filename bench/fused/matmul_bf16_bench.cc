// BF16 GEMM benchmark: oneDNN's bf16 matmul (trident::kernels::gemm_bf16: bf16 operands, FP32
// accumulation and output) against FP32 dnnl_sgemm (trident::kernels::gemm) at the GPT-2 124M
// training shapes: for each linear layer the forward product and the two backward products (data
// gradient, weight gradient), for 256 and 1024 rows. Every bf16 product is first checked against
// the FP32 GEMM of the same (bf16-representable) operands.
//
// Timing: the two alternate call by call (bf16, fp32, bf16, ...) after one untimed call each, and
// each result is the median of --calls timed calls. The machine is shared: each product waits for
// an idle machine first, is timed under a foreign-load meter, and is repeated (up to 3 times) when
// other processes used more than --max-foreign cores meanwhile; the table prints the load seen.
//
// Usage: trident_matmul_bf16_bench [--calls N] [--threads 2,1] [--rows 256,1024]
//            [--max-foreign CORES]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../kernels/bench_util.h"
#include "trident/core/view.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"

namespace trident::bench {
namespace {

struct Options {
  int calls = 9;
  std::vector<std::int64_t> threads = {2};
  std::vector<std::int64_t> rows = {256, 1024};
  double max_foreign = 0.2;
};

std::vector<std::int64_t> parse_list(const char* s) {
  std::vector<std::int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

struct Layer {
  const char* name;
  std::int64_t in, out;
};
// GPT-2 124M: attention qkv and projection, MLP up and down, tied LM head (vocab padded to 50304).
const Layer kLayers[] = {{"qkv", 768, 2304},
                         {"attn proj", 768, 768},
                         {"mlp up", 768, 3072},
                         {"mlp down", 3072, 768},
                         {"lm head", 768, 50304}};

// One product in both precisions over the same operands (the FP32 copies hold the bf16 values).
struct Product {
  const char* pass;
  kernels::GemmArgs f32;
  kernels::GemmBf16Args bf16;
};

struct Result {
  double bf16_s = 0, f32_s = 0, foreign = 0, max_rel_diff = 0;
  std::string impl;
};

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0, scale = 0.0;
  for (float v : b) scale = std::max(scale, static_cast<double>(std::abs(v)));
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

Result measure(const core::ExecContext& ctx, Product& p, std::vector<float>& c32,
               std::vector<float>& c16, const Options& opt) {
  Result r;
  r.impl = kernels::gemm_bf16_implementation(ctx, p.bf16);
  // Check: the bf16 path against sgemm on the same values (differences are FP32 summation order).
  std::fill(c32.begin(), c32.end(), 0.0f);
  std::fill(c16.begin(), c16.end(), 0.0f);
  p.f32.c = c32.data();
  p.bf16.c = c16.data();
  kernels::gemm(ctx, p.f32);
  kernels::gemm_bf16(ctx, p.bf16);
  r.max_rel_diff = max_rel_diff(c16, c32);
  for (int attempt = 0; attempt < 3; ++attempt) {
    wait_for_idle(0.1, 0.25, 20.0);
    ForeignLoad load;
    load.start();
    std::vector<double> t16, t32;
    for (int i = 0; i <= opt.calls; ++i) {  // call 0 of each is an untimed warm-up
      core::Timer timer;
      kernels::gemm_bf16(ctx, p.bf16);
      const double s16 = timer.elapsed_s();
      timer.reset();
      kernels::gemm(ctx, p.f32);
      const double s32 = timer.elapsed_s();
      if (i > 0) {
        t16.push_back(s16);
        t32.push_back(s32);
      }
    }
    r.bf16_s = median(t16);
    r.f32_s = median(t32);
    r.foreign = load.stop();
    if (r.foreign <= opt.max_foreign) break;
  }
  return r;
}

int run(const Options& opt) {
  std::printf(
      "# trident_matmul_bf16_bench: oneDNN bf16 matmul (bf16 x bf16 -> f32) vs FP32 dnnl_sgemm\n"
      "# median of %d alternating calls; GFLOP/s = 2 M N K / time; speed-up = fp32 time / bf16 "
      "time\n\n",
      opt.calls);
  for (std::int64_t threads : opt.threads) {
    core::ExecContext ctx = core::ExecContext::cpu();
    ctx.num_threads = static_cast<int>(threads);
    std::printf("## %lld thread%s\n\n", static_cast<long long>(threads), threads > 1 ? "s" : "");
    std::printf(
        "| rows | layer (in x out) | product | M x N x K | bf16 GFLOP/s | fp32 GFLOP/s | speed-up "
        "| max rel diff | foreign load | oneDNN impl |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n");
    double log_speedup = 0.0;
    int count = 0;
    for (std::int64_t rows : opt.rows) {
      for (const Layer& layer : kLayers) {
        const std::int64_t in = layer.in, out = layer.out;
        // Operands in [-1, 1), rounded to bf16; the FP32 copies hold the same values.
        std::vector<float> x(rows * in), w(out * in), dy(rows * out);
        fill_uniform(x.data(), rows * in, 1);
        fill_uniform(w.data(), out * in, 2);
        fill_uniform(dy.data(), rows * out, 3);
        std::vector<core::bf16> x16(x.size()), w16(w.size()), dy16(dy.size());
        // Each operand to bf16 and back: the FP32 copy then holds exactly the bf16 values.
        const auto round_to_bf16 = [&](std::vector<float>& f, std::vector<core::bf16>& h) {
          const core::Shape s{static_cast<std::int64_t>(f.size())};
          kernels::convert(ctx, {.out = core::view(h.data(), s), .in = core::view(f.data(), s)});
          kernels::convert(ctx, {.out = core::view(f.data(), s), .in = core::view(h.data(), s)});
        };
        round_to_bf16(x, x16);
        round_to_bf16(w, w16);
        round_to_bf16(dy, dy16);
        std::vector<std::byte> scratch(
            static_cast<std::size_t>(kernels::linear_bf16_scratch_bytes(ctx, rows, in, out)));
        using kernels::Trans;
        Product products[] = {
            // out(rows,out) = x(rows,in) @ w(out,in)^T
            {"forward",
             {.trans_b = Trans::kYes,
              .m = rows,
              .n = out,
              .k = in,
              .a = x.data(),
              .lda = in,
              .b = w.data(),
              .ldb = in,
              .ldc = out},
             {.trans_b = Trans::kYes,
              .m = rows,
              .n = out,
              .k = in,
              .a = x16.data(),
              .lda = in,
              .b = w16.data(),
              .ldb = in,
              .ldc = out,
              .scratch = scratch}},
            // d_in(rows,in) = dy(rows,out) @ w(out,in)
            {"d_in",
             {.m = rows,
              .n = in,
              .k = out,
              .a = dy.data(),
              .lda = out,
              .b = w.data(),
              .ldb = in,
              .ldc = in},
             {.m = rows,
              .n = in,
              .k = out,
              .a = dy16.data(),
              .lda = out,
              .b = w16.data(),
              .ldb = in,
              .ldc = in,
              .scratch = scratch}},
            // d_weight(out,in) += dy(rows,out)^T @ x(rows,in)
            {"d_weight",
             {.trans_a = Trans::kYes,
              .m = out,
              .n = in,
              .k = rows,
              .a = dy.data(),
              .lda = out,
              .b = x.data(),
              .ldb = in,
              .beta = 1.0f,
              .ldc = in},
             {.trans_a = Trans::kYes,
              .m = out,
              .n = in,
              .k = rows,
              .a = dy16.data(),
              .lda = out,
              .b = x16.data(),
              .ldb = in,
              .beta = 1.0f,
              .ldc = in,
              .scratch = scratch}},
        };
        for (Product& p : products) {
          std::vector<float> c32(p.f32.m * p.f32.n), c16(c32.size());
          const Result r = measure(ctx, p, c32, c16, opt);
          const double flops = 2.0 * p.f32.m * p.f32.n * p.f32.k;
          std::printf(
              "| %lld | %s (%lld x %lld) | %s | %lld x %lld x %lld | %.0f | %.0f | %.2fx | %.1e | "
              "%.2f | %s |\n",
              static_cast<long long>(rows), layer.name, static_cast<long long>(in),
              static_cast<long long>(out), p.pass, static_cast<long long>(p.f32.m),
              static_cast<long long>(p.f32.n), static_cast<long long>(p.f32.k),
              flops / r.bf16_s * 1e-9, flops / r.f32_s * 1e-9, r.f32_s / r.bf16_s, r.max_rel_diff,
              r.foreign, r.impl.c_str());
          std::fflush(stdout);
          log_speedup += std::log(r.f32_s / r.bf16_s);
          ++count;
        }
      }
    }
    std::printf("\ngeomean speed-up over %d products: %.2fx\n\n", count,
                std::exp(log_speedup / count));
  }
  return 0;
}

}  // namespace
}  // namespace trident::bench

int main(int argc, char** argv) {
  trident::bench::Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--calls") {
      opt.calls = std::atoi(argv[i + 1]);
    } else if (flag == "--threads") {
      opt.threads = trident::bench::parse_list(argv[i + 1]);
    } else if (flag == "--rows") {
      opt.rows = trident::bench::parse_list(argv[i + 1]);
    } else if (flag == "--max-foreign") {
      opt.max_foreign = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    return trident::bench::run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident_matmul_bf16_bench: %s\n", e.what());
    return 1;
  }
}
