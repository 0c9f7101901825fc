// Metrics: Megatron-style log lines on rank 0 and one JSON object per logged iteration or
// evaluation in --metrics-jsonl; TrainingLog, the trainer's record of each iteration (interval
// statistics, the log line, TensorBoard scalars, the --profile window).
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "trident/comm/communicator.h"
#include "trident/core/exec_context.h"
#include "trident/data/data_loader.h"
#include "trident/model/gpt.h"
#include "trident/optim/model_state.h"
#include "trident/parallel/parallel_context.h"
#include "trident/parallel/pipeline_schedule.h"
#include "trident/train/offload_report.h"
#include "trident/train/pipeline.h"
#include "trident/train/tensorboard_writer.h"
#include "trident/train/train_config.h"
#include "trident/train/zero_optimizer.h"

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
  // Mixture of experts over the interval (MoE layer calls > 0): Megatron-Core's
  // load_balancing_loss and z_loss (per layer and micro-batch, coefficients included), the
  // share of the routing choices a capacity dropped, the busiest expert's tokens over the mean.
  std::optional<MoeRouting> moe;
};
// Megatron-LM: " [date time] iteration N/M | consumed samples: ... | elapsed time per iteration
// (ms): ... | learning rate: ... | global batch size: ... | lm loss: ... | loss scale: ... |
// grad norm: ... | number of skipped iterations: ... | number of nan iterations: ... |".
// Megatron-DeepSpeed (BLOOM): consumed tokens, elapsed time per iteration (s), learning rate
// %.3E, ..., samples per second, TFLOPs.
std::string iteration_log_line(const IterationLog& l);
// The MoE part of the log line: " load_balancing_loss: ... | z_loss: ... | dropped tokens: ...% |
// expert load max/mean: ... |".
std::string moe_log(const MoeRouting& m);

// Measured FP32 GEMM rate of this process's threads, in TFLOP/s (a 1024^3 product, best of 3).
double measure_peak_tflops();

// CPU time (user + system, every thread) this process has used, in milliseconds.
double process_cpu_ms();
// Each rank's peak resident memory (getrusage), logged by rank 0 for comparison with the memory
// report and `trident plan`. Collective.
void log_peak_rss(comm::Communicator& world);
// On a device: each rank's peak device memory, the arenas and buffers (parameters, gradients,
// optimizer state, activation slots, staging) and the kernels' stream pool, logged by rank 0.
// Collective.
void log_peak_device_memory(comm::Communicator& world, const core::ExecContext& ctx);

// The counters a checkpoint carries besides the model and optimizer state.
struct Progress {
  std::int64_t iteration = 0, consumed = 0, consumed_valid = 0;
  std::int64_t skipped_iters = 0, nan_iters = 0;
};

// What one training iteration did.
struct IterationResult {
  PipelineStats pipeline;
  OptimizerStepResult step;
  data::StepBatch batch;
  double lr = 0;          // the rate the iteration used
  double used_scale = 1;  // the loss scale it used
  double lm_loss = 0;     // the mean over the global batch
  double ms = 0;
  std::int64_t tokens = 0;
  bool advanced() const { return !step.skipped && std::isfinite(lm_loss); }
  bool non_finite() const { return !std::isfinite(lm_loss) || !std::isfinite(step.grad_norm); }
};

// Sums over the iterations since the last log line.
struct IntervalStats {
  double loss = 0;      // over the iterations that advanced (Megatron's average)
  double loss_all = 0;  // over every iteration (--metrics-jsonl)
  double ms = 0, busy_ms = 0, pipe_ms = 0, flops = 0, tokens = 0;
  double cpu0 = process_cpu_ms();  // CPU time per iteration: timing on a shared machine
  std::int64_t iters = 0, skipped = 0, nan = 0, advanced = 0;
  MoeRouting moe;

  void add(const IterationResult& r, double flops_of_iteration) {
    const MoeRouting& m = r.pipeline.moe;
    moe.aux_loss += m.aux_loss;
    moe.z_loss += m.z_loss;
    moe.calls += m.calls;
    moe.dropped += m.dropped;
    moe.choices += m.choices;
    if (moe.tokens_per_expert.size() < m.tokens_per_expert.size()) {
      moe.tokens_per_expert.resize(m.tokens_per_expert.size(), 0.0);
    }
    for (std::size_t e = 0; e < m.tokens_per_expert.size(); ++e) {
      moe.tokens_per_expert[e] += m.tokens_per_expert[e];
    }
    loss_all += r.lm_loss;
    if (r.advanced()) {
      loss += r.lm_loss;
      ++advanced;
    } else {
      ++skipped;
      if (r.non_finite()) ++nan;
    }
    flops += flops_of_iteration;
    tokens += static_cast<double>(r.tokens);
    ms += r.ms;
    busy_ms += r.pipeline.busy_ms;
    pipe_ms += r.pipeline.total_ms;
    ++iters;
  }
};

// The trainer's record of training: per iteration the interval statistics, TensorBoard scalars
// every --tensorboard-log-interval, Megatron's log line, the --metrics-jsonl record and the
// pipeline's idle fractions every --log-interval, and rank 0's --profile window. Every rank calls
// it (the idle fractions are gathered); rank 0 writes the files.
class TrainingLog {
 public:
  // What it reads, owned by the trainer (they outlive the log).
  struct Sources {
    const TrainConfig& cfg;
    comm::Communicator& world;
    const parallel::ParallelContext& par;
    const core::ExecContext& ctx;
    ZeroOptimizer& optimizer;
    OffloadReporter& offload;
    model::TpTraffic& tp_traffic;
    const Progress& progress;
    const MemoryReport& mem;
    const std::int64_t& micro_batches;  // changes with --rampup-batch-size
    // Expert parallelism: the experts' optimizer (its traffic over the expert-dp group), or null.
    ZeroOptimizer* expert_optimizer = nullptr;
  };
  // peak_tflops: the MFU denominator, per rank.
  TrainingLog(const Sources& s, double peak_tflops, parallel::PipelineScheduleKind schedule);

  MetricsWriter& metrics() { return *metrics_; }
  TensorBoardWriter& tensorboard() { return *tb_; }

  // Around each training iteration (the profile window opens before its first iteration).
  void before_iteration();
  void after_iteration(const IterationResult& r);
  // Whether the profile window is open (evaluation pauses it).
  bool profiling() const { return profiling_; }
  // Closes the profile window early (a stop, the end of training): the table and its record.
  void finish_profile();

 private:
  void log_tensorboard(const IterationResult& r);
  void log_interval(const IterationResult& r);

  const Sources src_;
  const std::int64_t T_;
  const double peak_tflops_;
  const parallel::PipelineScheduleKind schedule_kind_;
  std::optional<MetricsWriter> metrics_;
  std::optional<TensorBoardWriter> tb_;
  IntervalStats interval_;
  // --profile: the window's iterations and their time so far.
  bool profiling_ = false;
  std::int64_t profile_iters_ = 0;
  double profile_ms_ = 0;
};

}  // namespace trident::train
