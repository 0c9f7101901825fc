#include "trident/train/metrics.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/core/timer.h"
#include "trident/kernels/matmul.h"

namespace trident::train {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) {
    throw core::Error(core::str("--metrics-jsonl: cannot open ", path, ": ", std::strerror(errno)));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!file_) return;
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw core::Error(
        core::str("--metrics-jsonl: writing ", path_, " failed: ", std::strerror(errno)));
  }
}

namespace {

template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), f, a...);
  return buf;
}

}  // namespace

std::string iteration_log_line(const IterationLog& l) {
  std::string s;
  const auto ll = [](std::int64_t x) { return static_cast<long long>(x); };
  if (l.megatron_deepspeed) {
    s += fmt(" iteration %8lld/%8lld |", ll(l.iteration), ll(l.train_iters));
    s += fmt(" consumed samples: %12lld |", ll(l.consumed_samples));
    s += fmt(" consumed tokens: %12lld |", ll(l.consumed_tokens));
    s += fmt(" elapsed time per iteration (s): %.2f |", l.iter_ms / 1e3);
    s += fmt(" learning rate: %.3E |", l.lr);
    s += fmt(" global batch size: %5lld |", ll(l.global_batch_size));
    if (l.lm_loss > 0) s += fmt(" lm loss: %.6E |", l.lm_loss);
    s += fmt(" loss scale: %.1f |", l.loss_scale);
    if (l.grad_norm) s += fmt(" grad norm: %.3f |", *l.grad_norm);
    s += fmt(" number of skipped iterations: %3lld |", ll(l.skipped));
    s += fmt(" number of nan iterations: %3lld |", ll(l.nan));
    s += fmt(" samples per second: %.3f |", l.samples_per_s);
    s += fmt(" TFLOPs: %.2f |", l.tflops_per_rank);
    return s;
  }
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &tm);
  s += fmt(" [%s.%06lld]", date, static_cast<long long>(us));
  s += fmt(" iteration %8lld/%8lld |", ll(l.iteration), ll(l.train_iters));
  s += fmt(" consumed samples: %12lld |", ll(l.consumed_samples));
  s += fmt(" elapsed time per iteration (ms): %.1f |", l.iter_ms);
  if (l.log_throughput) s += fmt(" throughput per GPU (TFLOP/s/GPU): %.1f |", l.tflops_per_rank);
  s += fmt(" learning rate: %.6E |", l.lr);
  s += fmt(" global batch size: %5lld |", ll(l.global_batch_size));
  if (l.lm_loss >= 0) s += fmt(" lm loss: %.6E |", l.lm_loss);
  s += fmt(" loss scale: %.1f |", l.loss_scale);
  if (l.grad_norm) s += fmt(" grad norm: %.3f |", *l.grad_norm);
  s += fmt(" number of skipped iterations: %3lld |", ll(l.skipped));
  s += fmt(" number of nan iterations: %3lld |", ll(l.nan));
  return s;
}

double measure_peak_tflops() {
  const std::int64_t n = 1024;
  std::vector<float> a(static_cast<std::size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
  const core::ExecContext ctx;
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    core::Timer t;
    kernels::gemm(ctx, {.m = n,
                        .n = n,
                        .k = n,
                        .a = a.data(),
                        .lda = n,
                        .b = b.data(),
                        .ldb = n,
                        .c = c.data(),
                        .ldc = n});
    if (rep > 0) best = std::min(best, t.elapsed_s());
  }
  return 2.0 * static_cast<double>(n * n * n) / best / 1e12;
}

}  // namespace trident::train
