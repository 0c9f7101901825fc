// Metrics: Megatron-style log lines on rank 0 and one JSON object per logged iteration or
// evaluation in --metrics-jsonl.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
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

// One logged interval, as Megatron-LM's training_log prints it.
struct IterationLog {
  bool megatron_deepspeed = false;  // Megatron-DeepSpeed's variant (--megatron-deepspeed-log)
  bool log_throughput = false;      // --log-throughput
  std::int64_t iteration = 0, train_iters = 0, consumed_samples = 0, consumed_tokens = 0;
  double iter_ms = 0, tflops_per_rank = 0, lr = 0;
  std::int64_t global_batch_size = 0;
  double lm_loss = 0, loss_scale = 1;
  std::optional<double> grad_norm;    // printed when clipping is on, as Megatron
  std::int64_t skipped = 0, nan = 0;  // in this interval
  double samples_per_s = 0;
  std::int64_t seq_length = 0;
};
// Megatron-LM: " [date time] iteration N/M | consumed samples: ... | elapsed time per iteration
// (ms): ... | learning rate: ... | global batch size: ... | lm loss: ... | loss scale: ... |
// grad norm: ... | number of skipped iterations: ... | number of nan iterations: ... |".
// Megatron-DeepSpeed (BLOOM): consumed tokens, elapsed time per iteration (s), learning rate
// %.3E, ..., samples per second, TFLOPs.
std::string iteration_log_line(const IterationLog& l);

// Measured FP32 GEMM rate of this process's threads, in TFLOP/s (a 1024^3 product, best of 3).
double measure_peak_tflops();

}  // namespace trident::train
