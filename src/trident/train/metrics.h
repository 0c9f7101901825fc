// Metrics: Megatron-style log lines on rank 0 and one JSON object per logged iteration or
// evaluation in --metrics-jsonl.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace trident::train {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Appends to `path` (empty: no file). Throws core::Error when it cannot be opened.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// Measured FP32 GEMM rate of this process's threads, in TFLOP/s (a 1024^3 product, best of 3).
double measure_peak_tflops();

}  // namespace trident::train
