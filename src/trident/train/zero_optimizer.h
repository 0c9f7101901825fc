// ZeroOptimizer: the data-parallel side of training for any TP x PP x DP layout and ZeRO stage
// 0-3, composed from the parts in optim/ (each chosen once from the stage's ZeroPolicy):
//
//   optim::ParamGradBuffers   the rank's flat parameter and gradient storage, sized by stage
//   optim::GradSync           bucketed all-reduce / reduce-scatter, or per-layer reduce-scatter,
//                             driven from the model's per-layer backward callbacks
//   optim::Zero3ParamGatherer stage 3: per-layer all-gather into two staging slots, prefetched
//   optim::GradFinalizer      tied embeddings, sequence-parallel LayerNorm sums, global norm,
//                             overflow check, clipping coefficient
//   optim::DistributedOptimizer the update rule (AdamW, Lion) on this rank's range, its state
//                             arrays, the all-gather
//
// This class only wires them to the model: it builds the views of the resident weights and
// gradients, and gives each chunk's layers a model::LayerWeightsProvider that hands out each
// layer's weights (gathered at stage 3) and gradient buffer (a staging slot at stages 2-3) just
// before the layer runs, and tells the gradient sync when a layer's backward is done.
// See docs/3d-parallelism.md for what each stage keeps and moves.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "trident/core/exec_context.h"
#include "trident/optim/adamw_optimizer.h"
#include "trident/optim/comm_counters.h"
#include "trident/optim/distributed_optimizer.h"
#include "trident/optim/flat_layout.h"
#include "trident/optim/grad_finalize.h"
#include "trident/optim/grad_sync.h"
#include "trident/optim/model_state.h"
#include "trident/optim/param_buffers.h"
#include "trident/optim/zero3_gather.h"
#include "trident/parallel/parallel_context.h"
#include "trident/train/rank_model.h"

namespace trident::train {

using optim::CommCounters;
using optim::GradScaling;
using optim::MemoryReport;

struct ZeroConfig {
  int stage = 0;
  std::int64_t bucket_size = 40'000'000;  // --ddp-bucket-size, elements
  bool bf16 = false;  // keep BF16 copies of the weights for the matmuls (refreshed every step)
  optim::OffloadConfig offload;  // --offload-optimizer: where the optimizer state lives
  // --offload-params nvme (stage 3): the master shard in a file under offload.path, streamed by
  // the optimizer step and read ahead of each layer's gather (docs/offload.md).
  bool offload_params = false;
  // Where the weights, gradients and optimizer state live and the optimizer's kernels run (the
  // host, or a CUDA device: --device).
  core::ExecContext ctx{};
  // The model's tables hold only the experts (expert parallelism, model::ParamPart::kExperts):
  // data-parallel over the expert-data-parallel group (ParallelContext::edp) instead of dp.
  bool experts = false;
};

struct OptimizerStepResult {
  double grad_norm = 0;  // of the unscaled gradient
  bool skipped = false;  // an overflow: no update on any rank
};

// One transformer layer's weights and gradients from two providers: the dense parameters from
// one, the experts from the other (expert parallelism keeps them in two optimizers).
class MergedLayerWeights final : public model::LayerWeightsProvider {
 public:
  MergedLayerWeights(model::LayerWeightsProvider& dense, model::LayerWeightsProvider& experts)
      : dense_(dense), experts_(experts) {}
  void begin_backward(bool last_of_iteration) override;
  model::LayerWeights forward(std::int64_t layer) override;
  model::LayerBackwardWeights backward(std::int64_t layer) override;
  void backward_done(std::int64_t layer) override;

 private:
  model::LayerWeightsProvider& dense_;
  model::LayerWeightsProvider& experts_;
  model::layers::BlockParams forward_{}, backward_{};
  model::layers::BlockGrads grads_{};
};

// The rank's flat layout from its model chunks.
optim::FlatLayout flat_layout_of(const RankModel& model);

class ZeroOptimizer {
 public:
  ZeroOptimizer(const RankModel& model, const parallel::ParallelContext& par,
                const optim::OptimizerConfig& optimizer, const ZeroConfig& zero);
  ~ZeroOptimizer();

  const model::ModelViews& views() const { return views_; }
  // Gives the chunks' runtimes their layer-weight providers (and BF16 views).
  void install_hooks(std::vector<model::ModelRuntime>& runtimes);
  // Expert parallelism: this optimizer holds the experts of the layers whose dense parameters the
  // runtimes' providers (another optimizer's) hand out; each chunk gets a merged provider, kept in
  // `merged`.
  void merge_hooks(std::vector<model::ModelRuntime>& runtimes,
                   std::vector<std::unique_ptr<MergedLayerWeights>>& merged);
  // Layout-independent initial weights (seed) into this rank's buffers; at stage 3 only the
  // elements of its shard are computed and written.
  void init_params(std::uint64_t seed);
  // --bf16: re-derives the BF16 weight copies from the FP32 weights (after init, load, step).
  void refresh_bf16(const core::ExecContext& ctx);

  // Call before the first forward of an iteration: zeroes gradients; stage 3 gathers the
  // embedding and head parameters.
  void begin_iteration();
  // Before each backward step of `chunk` (the pipeline executor calls it through the chunk's
  // model::LayerWeightsProvider::begin_backward).
  void begin_backward(int chunk, bool last_of_iteration);
  // Finishes the reductions, clips by the global norm and updates (unless the norm is not
  // finite). `step` is the 1-based iteration (Adam's bias correction).
  OptimizerStepResult step(const core::ExecContext& ctx, double lr, std::int64_t step,
                           const GradScaling& scaling = {});
  // The same for the dense parameters and the experts of an expert-parallel run, each in its own
  // optimizer: one global norm over both (squares summed), one clipping coefficient, one verdict.
  static OptimizerStepResult step_together(const core::ExecContext& ctx, double lr,
                                           std::int64_t step, const GradScaling& scaling,
                                           ZeroOptimizer& dense, ZeroOptimizer& experts);

  MemoryReport memory() const;
  const CommCounters& comm() const { return comm_; }
  void reset_comm() { comm_ = {}; }
  const parallel::ShardPlan& plan() const { return buffers_->plan(); }
  int stage() const { return policy_.stage; }
  const optim::FlatLayout& layout() const { return layout_; }

  // Checkpoint views: the elements this rank stores of each state, as ranges of its flat buffer
  // (FlatLayout::pieces() maps a range to parameters and their global element indices).
  struct TensorSlice {
    float* data = nullptr;
    parallel::Range range;
  };
  TensorSlice params_slice();
  // The optimizer's state arrays, by the update rule's names (AdamW: exp_avg, exp_avg_sq; Lion:
  // exp_avg).
  struct NamedSlice {
    std::string name;
    TensorSlice slice;
  };
  std::vector<NamedSlice> state_slices();
  // After a checkpoint save (written = false) or load (true) went through the slices: offloaded
  // state is synced to its files and its mapped pages dropped from memory.
  void checkpoint_io_done(bool written) {
    if (store_) store_->release_pages(written);
  }
  // The offload files (the optimizer state and/or the master shard), or null.
  const optim::OffloadStore* offload() const { return store_.get(); }
  bool params_offloaded() const { return param_array_ >= 0; }
  bool state_offloaded() const { return state_array_ >= 0; }
  // The optimizer state is in host memory while the weights are on a GPU (--offload-optimizer on
  // a GPU).
  bool state_on_host() const;
  // The read-ahead buffers of --offload-params nvme (0 otherwise).
  std::int64_t param_fetch_bytes() const { return gatherer_ ? gatherer_->fetch_bytes() : 0; }
  // Adds delta[i] to element i of every copy of parameter `name` this rank stores (its whole
  // weights at ZeRO 0-2, the part in its shard at 3; nothing when no chunk has it): a weight the
  // trainer moves itself (the expert bias). Call after step(), on every rank of the dp group alike.
  void add_to_param(const std::string& name, const std::vector<float>& delta);
  // Before an evaluation pass after a step: the stage-3 gathered weights are re-gathered from the
  // updated shard (what begin_iteration does, without touching the gradients).
  void begin_evaluation();
  // The range of a rank's flat buffer (numel elements) that data-parallel rank dp_rank of dp
  // stores in checkpoints at `stage`: of the parameters (state = false) or of the optimizer state.
  // The same as the slices above, without an optimizer (`trident convert` writes other layouts).
  static parallel::Range stored_range(int stage, bool state, std::int64_t numel, int dp,
                                      int dp_rank);

 private:
  class ChunkWeights;  // the LayerWeightsProvider of one chunk
  // step() in parts: the reductions and the squared norm / overflow verdict (already summed over
  // the job), then the update with the common scale.
  optim::GradShare reduce_grads(const core::ExecContext& ctx, const GradScaling& scaling);
  void update(const core::ExecContext& ctx, double lr, std::int64_t step, float grad_scale);
  void build_chunk_views();
  void build_slot_views();
  model::LayerWeights layer_weights(int chunk, std::int64_t layer, bool forward);
  model::LayerBackwardWeights layer_backward(int chunk, std::int64_t layer);
  void layer_backward_done(int chunk, std::int64_t layer);

  const RankModel& model_;
  const parallel::ParallelContext& par_;
  optim::ZeroPolicy policy_;
  optim::FlatLayout layout_;
  CommCounters comm_;
  std::unique_ptr<optim::ParamGradBuffers> buffers_;
  std::unique_ptr<optim::OffloadStore> store_;  // before its users (destroyed after them)
  int param_array_ = -1, state_array_ = -1;     // their (first) arrays in store_, -1: in memory
  std::unique_ptr<optim::GradSync> sync_;
  std::unique_ptr<optim::Zero3ParamGatherer> gatherer_;  // stage 3 only
  std::unique_ptr<optim::GradFinalizer> finalizer_;
  std::unique_ptr<optim::DistributedOptimizer> opt_;
  optim::HeldGrads held_{};     // between reduce_grads() and update()
  core::ExecContext hook_ctx_;  // kernels run from the hooks

  model::ModelViews views_;
  std::vector<std::unique_ptr<ChunkWeights>> providers_;
  // Views of each layer unit inside the staging slots, built once: gradient slot (stages 2-3),
  // weight slots 0/1 and their BF16 copies (stage 3).
  std::vector<model::layers::BlockGrads> slot_grad_views_;
  std::vector<model::layers::BlockParams> slot_param_views_[2];  // with the BF16 slot's copies
};

}  // namespace trident::train
