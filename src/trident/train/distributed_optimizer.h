// DistributedOptimizer: everything between the last backward and the next forward, for any
// TP x PP x DP layout: gradient reduction across data-parallel replicas, the tied-embedding
// gradient sum across the first and last pipeline stage, the global gradient norm (each
// parameter element counted once in the whole job), clipping, and AdamW on this rank's buffers.
#pragma once

#include <cstdint>
#include <memory>

#include "trident/comm/communicator.h"
#include "trident/core/exec_context.h"
#include "trident/optim/adamw_optimizer.h"
#include "trident/parallel/parallel_context.h"
#include "trident/train/rank_model.h"

namespace trident::train {

struct FlatBuffers {
  float* params = nullptr;  // FP32 master weights (also the compute weights in FP32 runs)
  float* grads = nullptr;   // FP32 gradient accumulators
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

struct OptimizerStepResult {
  double grad_norm = 0;
  bool skipped = false;  // the norm was not finite: no update
};

class DistributedOptimizer {
 public:
  DistributedOptimizer(const RankModel& model, const parallel::ParallelContext& par,
                       const optim::AdamWConfig& adamw, FlatBuffers buffers);

  void zero_grads();
  // Reduces gradients, clips by the global norm and updates (unless the norm is not finite).
  // `step` is the 1-based iteration (Adam's bias correction).
  OptimizerStepResult step(const core::ExecContext& ctx, double lr, std::int64_t step);

  // Bytes this rank holds for parameters, gradients and optimizer state.
  std::int64_t param_bytes() const;
  std::int64_t grad_bytes() const;
  std::int64_t optimizer_bytes() const;

 private:
  void reduce_gradients();
  void sync_tied_embedding();
  void sync_sequence_parallel_norms();
  double global_grad_norm(const core::ExecContext& ctx);

  const RankModel& model_;
  const parallel::ParallelContext& par_;
  optim::AdamWConfig adamw_;
  FlatBuffers buf_;
  std::unique_ptr<comm::Communicator> model_parallel_;  // ranks with this rank's dp coordinate
};

}  // namespace trident::train
