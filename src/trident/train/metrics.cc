#include "trident/train/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
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
