// ZeroOptimizer: the data-parallel side of training for any TP x PP x DP layout, with ZeRO
// stages 0-3 (Rajbhandari et al.; DeepSpeed; Megatron's --use-distributed-optimizer = stage 1).
// It owns the rank's parameter, gradient and Adam buffers, sized by stage, and the views the
// model reads them through; it hooks into the model's per-layer callbacks to reduce gradients
// as backward produces them and (stage 3) to gather each layer's parameters just in time.
//
//   stage 0: every rank holds all parameters, gradients and Adam moments; gradient buckets are
//            all-reduced, started as soon as the last micro-batch's backward fills them.
//   stage 1: Adam moments (and, for FP32 runs, the master weights they update) sharded over dp;
//            buckets reduce-scattered on the last micro-batch; each rank updates its shard; the
//            updated parameters are all-gathered.
//   stage 2: also the gradients: each layer's gradient is reduce-scattered right after its
//            backward in every micro-batch and only this rank's shard is accumulated; the layer
//            gradient itself lives in one reusable staging buffer.
//   stage 3: also the parameters: each rank keeps its shard of the FP32 weights; a layer's weights
//            are all-gathered into one of two staging buffers just before its forward and its
//            backward, with the next layer's gather prefetched. Embedding and head parameters
//            (not layers) are gathered once per iteration.
//
// Shards are ranges of the rank's flat buffer (parallel/shard_plan.h). The gradient norm counts
// each parameter element once in the whole job; clipping and the update use it on every rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/arena.h"
#include "trident/core/exec_context.h"
#include "trident/optim/adamw_optimizer.h"
#include "trident/parallel/parallel_context.h"
#include "trident/parallel/shard_plan.h"
#include "trident/train/rank_model.h"

namespace trident::train {

// What the model reads parameters and gradients through, per chunk. The optimizer re-points
// layer entries (stages 2-3) from its hooks, so the executor passes these objects by reference.
struct ModelViews {
  std::vector<model::GptParams> params;
  std::vector<model::GptGrads> grads;
  std::vector<model::GptParamsBf16> params_bf16;  // --bf16: the matmuls' weight copies
};

struct ZeroConfig {
  int stage = 0;
  std::int64_t bucket_size = 40'000'000;  // --ddp-bucket-size, elements
  bool bf16 = false;  // keep BF16 copies of the weights for the matmuls (refreshed every step)
};

struct OptimizerStepResult {
  double grad_norm = 0;  // of the unscaled gradient
  bool skipped = false;  // an overflow: no update on any rank
};

// How the gradients were scaled (FP16 loss scaling): they are divided by `loss_scale` before
// clipping and the update; any gradient above `overflow_threshold` in magnitude (FP16's largest
// value under --fp16) or not finite is an overflow, and the step is skipped.
struct GradScaling {
  double loss_scale = 1.0;
  float overflow_threshold = INFINITY;
};

struct MemoryReport {
  // Model states kept across iterations (what the ZeRO formulas count).
  std::int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  // Staging: stages 2-3 keep the non-layer (embedding and head) gradients, and in stage 3 their
  // parameters, whole for an iteration, plus one layer-gradient buffer, the received
  // reduce-scatter piece and two layer-parameter buffers.
  std::int64_t staging_bytes = 0;
  // The ZeRO paper's formulas for this rank's psi parameters (FP32 training: 4 bytes of weights,
  // 4 of gradients, 8 of Adam moments per parameter): stage 0 16 psi, 1 8 psi + 8 psi/dp,
  // 2 4 psi + 12 psi/dp, 3 16 psi/dp.
  std::int64_t predicted_param_bytes = 0, predicted_grad_bytes = 0, predicted_optimizer_bytes = 0;
};

// Bytes each rank sends per iteration for the data-parallel reduction, counted as the ring
// algorithm moves them: all-reduce 2 (dp-1)/dp x, reduce-scatter and all-gather (dp-1)/dp x.
struct CommCounters {
  double dp_bytes = 0;
};

class ZeroOptimizer {
 public:
  ZeroOptimizer(const RankModel& model, const parallel::ParallelContext& par,
                const optim::AdamWConfig& adamw, const ZeroConfig& zero);

  ModelViews& views() { return views_; }
  // Installs the per-layer hooks into the chunks' runtimes.
  void install_hooks(std::vector<model::ModelRuntime>& runtimes);
  // Layout-independent initial weights (seed) into this rank's buffers.
  void init_params(std::uint64_t seed);
  // --bf16: re-derives the BF16 weight copies from the FP32 weights (after init, load, step).
  void refresh_bf16(const core::ExecContext& ctx);

  // Call before the first forward of an iteration: zeroes gradients; stage 3 gathers the
  // embedding and head parameters.
  void begin_iteration();
  // Called by the pipeline executor before each backward step.
  void begin_backward(int chunk, bool last_of_iteration);
  // Finishes the reductions, clips by the global norm and updates (unless the norm is not
  // finite). `step` is the 1-based iteration (Adam's bias correction).
  OptimizerStepResult step(const core::ExecContext& ctx, double lr, std::int64_t step,
                           const GradScaling& scaling = {});

  MemoryReport memory() const;
  const CommCounters& comm() const { return comm_; }
  void reset_comm() { comm_ = {}; }
  const parallel::ShardPlan& plan() const { return plan_; }
  int stage() const { return zero_.stage; }

  // Checkpoint views: the elements this rank stores of each tensor, as ranges of its flat buffer.
  struct TensorSlice {
    float* data = nullptr;
    parallel::Range range;
  };
  TensorSlice params_slice();
  TensorSlice exp_avg_slice();
  TensorSlice exp_avg_sq_slice();

 private:
  struct Unit {  // one transformer layer of one chunk: a contiguous range of the flat buffer
    int chunk = 0;
    std::int64_t layer = 0;  // local layer index in the chunk
    parallel::Range range;
  };
  void build_units();
  void build_views();
  void point_layer_params(int chunk, std::int64_t layer, float* base);
  void point_layer_grads(int chunk, std::int64_t layer, float* base);
  void on_after_backward(int chunk, std::int64_t layer);
  void on_before_pass(int chunk, std::int64_t layer, bool forward);
  void gather_unit_into(const Unit& u, float* dst, bool async);
  void reduce_rest_and_sync();
  void sync_sequence_parallel_norms(float* grads, parallel::Range held);
  double global_grad_norm(const core::ExecContext& ctx);
  bool any_overflow(float threshold);
  void account(comm::OpKind kind, std::int64_t elements);
  int unit_of(int chunk, std::int64_t layer) const;

  const RankModel& model_;
  const parallel::ParallelContext& par_;
  optim::AdamWConfig adamw_;
  ZeroConfig zero_;
  parallel::ShardPlan plan_;
  std::unique_ptr<comm::Communicator> model_parallel_;  // ranks with this rank's dp coordinate

  std::vector<Unit> units_;
  std::vector<parallel::Range> rest_;     // flat ranges of non-layer parameters (embedding, head)
  std::vector<parallel::Range> buckets_;  // stages 0-1: layer buckets, in backward order
  std::int64_t rest_numel_ = 0;
  std::int64_t max_unit_ = 0;

  // Storage. full_params: stages 0-2 (padded to the plan); master shard: stage 3.
  core::Arena params_arena_, grads_arena_, moments_arena_, staging_arena_;
  float* full_params_ = nullptr;  // (numel_padded) stages 0-2
  float* full_grads_ = nullptr;   // (numel_padded) stages 0-1
  float* master_ = nullptr;       // (shard) stage 3
  float* grad_shard_ = nullptr;   // (shard) stages 2-3
  float* rest_params_ = nullptr;  // (rest) stage 3: gathered embedding/head parameters
  float* rest_grads_ = nullptr;   // (rest) stages 2-3
  float* grad_slot_ = nullptr;    // (max unit) stages 2-3
  float* rs_tmp_ = nullptr;       // (shard) stages 2-3: this rank's piece of a reduce-scatter
  float* param_slots_[2] = {nullptr, nullptr};  // (max unit) stage 3
  core::Arena bf16_arena_;
  core::bf16* params_bf16_ = nullptr;               // --bf16: (numel) stages 0-2; (rest) stage 3
  core::bf16* bf16_slots_[2] = {nullptr, nullptr};  // --bf16, stage 3: the staged layers
  float* exp_avg_ = nullptr;                        // (numel) stage 0, (shard) stages 1-3
  float* exp_avg_sq_ = nullptr;

  ModelViews views_;
  bool last_backward_ = true;
  std::vector<bool> bucket_done_;
  std::vector<comm::Request> pending_;
  int slot_unit_[2] = {-1, -1};
  comm::Request slot_request_[2];
  CommCounters comm_;
};

}  // namespace trident::train
