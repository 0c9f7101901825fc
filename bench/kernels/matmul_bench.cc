// FP32 GEMM benchmark: oneDNN dnnl_sgemm (through trident::kernels::gemm) against OpenBLAS
// cblas_sgemm at the GPT-2 124M training shapes: for each linear layer the forward product and the
// two backward products (data gradient, weight gradient), for 256 and 1024 rows, on 2 and 1
// threads. Every product is first checked against a double-precision reference on sampled
// entries.
//
// Timing: the libraries alternate in blocks of back-to-back calls (one untimed, then at least
// --calls timed ones and more until the block lasts --min-block-ms), --rounds blocks each, the
// order swapped every round; each result is the median over all timed calls. Between blocks the
// program sleeps long enough for the previous library's idle worker threads to stop spinning
// (libgomp spins ~10 ms after a parallel region, OpenBLAS's pthreads ~0.1 s): on 2 cores a
// spinning pool of the other library would otherwise halve the measured speed. The machine is
// shared, so each product is timed under a foreign-load meter and repeated (after waiting for
// idle) when other processes used more than --max-foreign cores meanwhile; the whole run waits at
// most --max-wait-s in total, and the tables print the foreign load seen. With --passes N the
// whole sweep runs N times and each library keeps its best median over the quiet passes.
//
// Usage: trident_matmul_bench [--passes N] [--rounds N] [--calls N] [--min-block-ms MS]
//            [--threads 2,1] [--rows 256,1024] [--settle-dnnl-ms MS] [--settle-openblas-ms MS]
//            [--max-foreign CORES] [--max-wait-s S]
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "trident/kernels/matmul.h"

namespace trident::bench {
namespace {

struct Options {
  int passes = 1;         // whole sweeps; per product the best quiet median is kept
  int rounds = 2;         // blocks per library
  int calls = 2;          // timed calls per block at least (after one untimed call)
  int min_block_ms = 60;  // more timed calls until a block lasts this long
  std::vector<int> threads = {2, 1};
  std::vector<std::int64_t> rows = {256, 1024};
  int settle_dnnl_ms = 30;       // pause after a dnnl block (libgomp threads stop spinning)
  int settle_openblas_ms = 200;  // pause after an OpenBLAS block (its pthreads stop spinning)
  double max_foreign = 0.2;      // cores; a measurement taken under more foreign load is repeated
  int max_retries = 3;
  double max_wait_s = 120.0;  // total time the whole run may spend waiting for an idle machine
};

std::vector<std::int64_t> parse_list(const char* s) {
  std::vector<std::int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return out;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--passes") {
      o.passes = std::atoi(argv[i + 1]);
    } else if (flag == "--rounds") {
      o.rounds = std::atoi(argv[i + 1]);
    } else if (flag == "--calls") {
      o.calls = std::atoi(argv[i + 1]);
    } else if (flag == "--threads") {
      o.threads.clear();
      for (std::int64_t t : parse_list(argv[i + 1])) o.threads.push_back(static_cast<int>(t));
    } else if (flag == "--rows") {
      o.rows = parse_list(argv[i + 1]);
    } else if (flag == "--min-block-ms") {
      o.min_block_ms = std::atoi(argv[i + 1]);
    } else if (flag == "--settle-dnnl-ms") {
      o.settle_dnnl_ms = std::atoi(argv[i + 1]);
    } else if (flag == "--settle-openblas-ms") {
      o.settle_openblas_ms = std::atoi(argv[i + 1]);
    } else if (flag == "--max-foreign") {
      o.max_foreign = std::atof(argv[i + 1]);
    } else if (flag == "--max-wait-s") {
      o.max_wait_s = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  return o;
}

// One row-major product C(m,n) = op(A) op(B) + beta C.
struct Product {
  const char* pass;
  bool trans_a, trans_b;
  std::int64_t m, n, k;
  const float* a;
  std::int64_t lda;
  const float* b;
  std::int64_t ldb;
  float beta;
  float* c;
  std::int64_t ldc;
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }
};

void run_dnnl(const core::ExecContext& ctx, const Product& p, float beta) {
  kernels::gemm(ctx, {.trans_a = p.trans_a ? kernels::Trans::kYes : kernels::Trans::kNo,
                      .trans_b = p.trans_b ? kernels::Trans::kYes : kernels::Trans::kNo,
                      .m = p.m,
                      .n = p.n,
                      .k = p.k,
                      .alpha = 1.0f,
                      .a = p.a,
                      .lda = p.lda,
                      .b = p.b,
                      .ldb = p.ldb,
                      .beta = beta,
                      .c = p.c,
                      .ldc = p.ldc});
}

void run_openblas(const Product& p, float beta) {
  cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans,
              p.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(p.m),
              static_cast<blasint>(p.n), static_cast<blasint>(p.k), 1.0f, p.a,
              static_cast<blasint>(p.lda), p.b, static_cast<blasint>(p.ldb), beta, p.c,
              static_cast<blasint>(p.ldc));
}

// Max |C - ref| / max |ref| over 64 sampled entries, the reference computed in double. C must hold
// the plain product (beta = 0).
double sampled_error(const Product& p) {
  double max_err = 0.0, max_ref = 0.0;
  std::uint64_t s = 12345;
  for (int i = 0; i < 64; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const std::int64_t r = static_cast<std::int64_t>((s >> 33) % static_cast<std::uint64_t>(p.m));
    const std::int64_t c = static_cast<std::int64_t>((s >> 13) % static_cast<std::uint64_t>(p.n));
    double ref = 0.0;
    for (std::int64_t k = 0; k < p.k; ++k) {
      const double a = p.trans_a ? p.a[k * p.lda + r] : p.a[r * p.lda + k];
      const double b = p.trans_b ? p.b[c * p.ldb + k] : p.b[k * p.ldb + c];
      ref += a * b;
    }
    max_err = std::max(max_err, std::abs(p.c[r * p.ldc + c] - ref));
    max_ref = std::max(max_ref, std::abs(ref));
  }
  return max_ref > 0 ? max_err / max_ref : max_err;
}

struct Result {
  std::int64_t rows, in, out;
  const char* pass;
  std::int64_t m, n, k;
  double dnnl_gflops, openblas_gflops, dnnl_err, openblas_err;
  double foreign;  // cores used by other processes while this product was timed
};

void settle(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

Result measure(const core::ExecContext& ctx, const Options& o, double& wait_left_s,
               std::int64_t rows, std::int64_t in, std::int64_t out, const Product& p) {
  Result res{rows, in, out, p.pass, p.m, p.n, p.k, 0, 0, 0, 0, 0};
  // Check both libraries against the double reference (plain product), which also warms up.
  run_dnnl(ctx, p, 0.0f);
  res.dnnl_err = sampled_error(p);
  settle(o.settle_dnnl_ms);
  run_openblas(p, 0.0f);
  res.openblas_err = sampled_error(p);
  settle(o.settle_openblas_ms);
  std::vector<double> t_dnnl, t_blas;
  for (int attempt = 0; attempt <= o.max_retries; ++attempt) {
    t_dnnl.clear();
    t_blas.clear();
    if (wait_left_s > 0.0) {
      const core::Timer waited;
      wait_for_idle(o.max_foreign / 2, 0.25, std::min(wait_left_s, 20.0));
      wait_left_s -= waited.elapsed_s();
    }
    ForeignLoad load;
    load.start();
    for (int round = 0; round < o.rounds; ++round) {
      for (int turn = 0; turn < 2; ++turn) {  // dnnl first on even rounds, OpenBLAS on odd ones
        const bool dnnl_turn = (round % 2 == 0) == (turn == 0);
        // One untimed call first: after the pause the library's threads are asleep and its
        // buffers cold, which a training step (a warm OpenMP pool) does not see. Then at least
        // o.calls timed calls, and more (up to 64) until the block lasts o.min_block_ms, so that
        // small products get enough samples for a stable median.
        const core::Timer block;
        for (int call = -1;
             call < o.calls || (block.elapsed_s() * 1e3 < o.min_block_ms && call < 64); ++call) {
          core::Timer timer;
          if (dnnl_turn) {
            run_dnnl(ctx, p, p.beta);
            if (call >= 0) t_dnnl.push_back(timer.elapsed_s());
          } else {
            run_openblas(p, p.beta);
            if (call >= 0) t_blas.push_back(timer.elapsed_s());
          }
        }
        settle(dnnl_turn ? o.settle_dnnl_ms : o.settle_openblas_ms);
      }
    }
    res.foreign = load.stop();
    if (res.foreign <= o.max_foreign || wait_left_s <= 0.0) break;
  }
  res.dnnl_gflops = p.flops() / median(t_dnnl) * 1e-9;
  res.openblas_gflops = p.flops() / median(t_blas) * 1e-9;
  return res;
}

// Keeps, per library, the higher of two medians when both passes were quiet (foreign load <=
// max_foreign), as reference/cpu-ceilings.md does; otherwise the quieter pass wins outright.
void merge_passes(Result& kept, const Result& next, double max_foreign) {
  const bool kept_quiet = kept.foreign <= max_foreign, next_quiet = next.foreign <= max_foreign;
  if (kept_quiet && next_quiet) {
    kept.dnnl_gflops = std::max(kept.dnnl_gflops, next.dnnl_gflops);
    kept.openblas_gflops = std::max(kept.openblas_gflops, next.openblas_gflops);
    kept.foreign = std::max(kept.foreign, next.foreign);
  } else if (next_quiet || (!kept_quiet && next.foreign < kept.foreign)) {
    const double err_d = kept.dnnl_err, err_b = kept.openblas_err;
    kept = next;
    kept.dnnl_err = std::max(err_d, next.dnnl_err);
    kept.openblas_err = std::max(err_b, next.openblas_err);
    return;
  }
  kept.dnnl_err = std::max(kept.dnnl_err, next.dnnl_err);
  kept.openblas_err = std::max(kept.openblas_err, next.openblas_err);
}

const char* library_of(const void* symbol) {
  Dl_info info{};
  return dladdr(symbol, &info) && info.dli_fname ? info.dli_fname : "?";
}

int run(const Options& o) {
  const dnnl_version_t* v = dnnl_version();
  std::printf("# trident_matmul_bench\n");
  std::printf("oneDNN %d.%d.%d (dnnl_sgemm from %s)\n", v->major, v->minor, v->patch,
              library_of(reinterpret_cast<const void*>(&dnnl_sgemm)));
  std::printf("OpenBLAS: %s (cblas_sgemm from %s)\n", openblas_get_config(),
              library_of(reinterpret_cast<const void*>(&cblas_sgemm)));
  std::printf(
      "median over %d rounds per library and product, each 1 untimed + >= %d timed "
      "back-to-back calls (more until the block lasts %d ms); libraries alternate by "
      "block; pause %d ms after dnnl, %d ms after OpenBLAS\n\n",
      o.rounds, o.calls, o.min_block_ms, o.settle_dnnl_ms, o.settle_openblas_ms);

  // GPT-2 124M linear layers (in -> out): QKV, attention projection, MLP up, MLP down, LM head.
  const std::int64_t layers[][2] = {
      {768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50304}};
  std::int64_t max_rows = 0;
  for (std::int64_t r : o.rows) max_rows = std::max(max_rows, r);
  const std::int64_t max_in = 3072, max_out = 50304, max_w = 768 * 50304;
  std::vector<float> x(max_rows * max_in), w(max_w), y(max_rows * max_out), dy(max_rows * max_out),
      dx(max_rows * max_in), dw(max_w);
  fill_uniform(x.data(), static_cast<std::int64_t>(x.size()), 1);
  fill_uniform(w.data(), static_cast<std::int64_t>(w.size()), 2);
  fill_uniform(dy.data(), static_cast<std::int64_t>(dy.size()), 3);
  std::fill(dw.begin(), dw.end(), 0.0f);

  double wait_left_s = o.max_wait_s;
  const core::Timer total;
  for (int threads : o.threads) {
    openblas_set_num_threads(threads);
    core::ExecContext ctx = core::ExecContext::cpu();
    ctx.num_threads = threads;
    // results[i]: product i, merged over the passes (see merge_passes).
    std::vector<Result> results;
    for (int pass = 0; pass < o.passes; ++pass) {
      std::size_t i = 0;
      for (std::int64_t rows : o.rows) {
        for (const auto& layer : layers) {
          const std::int64_t in = layer[0], out = layer[1];
          const Product products[] = {
              // forward: y(rows,out) = x(rows,in) @ W(out,in)^T
              {"fwd  y = x W^T", false, true, rows, out, in, x.data(), in, w.data(), in, 0.0f,
               y.data(), out},
              // data gradient: dx(rows,in) = dy(rows,out) @ W(out,in)
              {"bwd dx = dy W", false, false, rows, in, out, dy.data(), out, w.data(), in, 0.0f,
               dx.data(), in},
              // weight gradient: dW(out,in) += dy(rows,out)^T @ x(rows,in)
              {"bwd dW += dy^T x", true, false, out, in, rows, dy.data(), out, x.data(), in, 1.0f,
               dw.data(), in},
          };
          for (const Product& p : products) {
            const Result r = measure(ctx, o, wait_left_s, rows, in, out, p);
            std::fprintf(stderr,
                         "  [%d thr, pass %d] rows %4ld %4ldx%-5ld %-17s %7.1f vs %7.1f GFLOP/s "
                         "(foreign %.2f)\n",
                         threads, pass + 1, static_cast<long>(rows), static_cast<long>(in),
                         static_cast<long>(out), r.pass, r.dnnl_gflops, r.openblas_gflops,
                         r.foreign);
            if (pass == 0) {
              results.push_back(r);
            } else {
              merge_passes(results[i], r, o.max_foreign);
            }
            ++i;
          }
        }
      }
    }
    double foreign = 0.0;
    for (const Result& r : results) foreign = std::max(foreign, r.foreign);
    std::printf(
        "## %d thread%s (%d pass%s; max foreign load while timing a product: %.2f "
        "cores)\n\n",
        threads, threads > 1 ? "s" : "", o.passes, o.passes > 1 ? "es" : "", foreign);
    std::printf(
        "| rows | layer in x out | pass | M x N x K | dnnl_sgemm GFLOP/s | OpenBLAS "
        "GFLOP/s | dnnl / OpenBLAS | foreign load |\n|---|---|---|---|---|---|---|---|\n");
    double log_sum_d = 0, log_sum_b = 0, max_err_d = 0, max_err_b = 0;
    for (const Result& r : results) {
      std::printf("| %ld | %ld x %ld | %s | %ld x %ld x %ld | %.0f | %.0f | %.2f | %.2f |\n",
                  static_cast<long>(r.rows), static_cast<long>(r.in), static_cast<long>(r.out),
                  r.pass, static_cast<long>(r.m), static_cast<long>(r.n), static_cast<long>(r.k),
                  r.dnnl_gflops, r.openblas_gflops, r.dnnl_gflops / r.openblas_gflops, r.foreign);
      log_sum_d += std::log(r.dnnl_gflops);
      log_sum_b += std::log(r.openblas_gflops);
      max_err_d = std::max(max_err_d, r.dnnl_err);
      max_err_b = std::max(max_err_b, r.openblas_err);
    }
    const double n = static_cast<double>(results.size());
    std::printf("| | | **geomean** | | **%.0f** | **%.0f** | **%.2f** | |\n\n",
                std::exp(log_sum_d / n), std::exp(log_sum_b / n),
                std::exp((log_sum_d - log_sum_b) / n));
    std::printf(
        "Accuracy (max error / max |ref| on 64 sampled entries per product, ref in "
        "double): dnnl_sgemm %.1e, OpenBLAS %.1e\n\n",
        max_err_d, max_err_b);
    if (max_err_d > 1e-5 || max_err_b > 1e-5) {
      std::printf("ERROR: a library disagrees with the double reference\n");
      return 1;
    }
  }
  const double waited_s = o.max_wait_s - std::max(0.0, wait_left_s);
  std::printf("Run time %.0f s, of which about %.0f s spent waiting for an idle machine.\n",
              total.elapsed_s(), waited_s);
  return 0;
}

}  // namespace
}  // namespace trident::bench

int main(int argc, char** argv) {
  try {
    return trident::bench::run(trident::bench::parse_options(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident_matmul_bench: %s\n", e.what());
    return 1;
  }
}
