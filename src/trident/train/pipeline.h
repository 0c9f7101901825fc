// GptPipeline: the GPT's side of pipeline execution on this rank. Per model chunk it holds the
// model runtime and the activation slots (model::GptActivations with the micro-batch's tokens and
// labels), runs one step's forward (with the loss on the last virtual stage) and backward, and
// sums the iteration's loss on the device. The schedule, the slots' ownership and every
// point-to-point message are parallel::PipelineExecutor's, which it drives.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "trident/core/arena.h"
#include "trident/kernels/memory.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"
#include "trident/model/gpt.h"
#include "trident/parallel/parallel_context.h"
#include "trident/parallel/pipeline_executor.h"
#include "trident/parallel/pipeline_schedule.h"
#include "trident/train/rank_model.h"

namespace trident::train {

// The micro-batches of one iteration for this data-parallel rank.
struct MicroBatches {
  // Writes micro-batch `micro`'s inputs (B*T) and labels (B*T).
  std::function<void(int micro, std::int32_t* tokens, std::int32_t* labels)> fill;
  // Global sample id of micro-batch `micro`'s first row (keys the dropout masks).
  std::function<std::int64_t(int micro)> first_sample;
  std::int64_t iteration = 0;  // keys the dropout masks
};

// The mixture-of-experts layers' routing, summed over MoE layer forwards (layers x
// micro-batches; model/layers/moe.h's MoeStats): the auxiliary losses with their coefficients,
// the choices dropped by a capacity, the tokens each expert kept.
struct MoeRouting {
  double aux_loss = 0, z_loss = 0;
  std::int64_t calls = 0, dropped = 0, choices = 0;
  std::vector<double> tokens_per_expert;
  // Per global layer (this rank's MoE layers; empty elsewhere): the expert bias's update reads it.
  std::vector<std::vector<double>> layer_tokens;

  void add(const model::layers::MoeStats& s, std::int64_t layer = -1) {
    if (s.tokens_per_expert.empty()) return;  // a dense layer
    tokens_per_expert.resize(s.tokens_per_expert.size(), 0.0);
    if (layer >= 0) {
      if (layer_tokens.size() <= static_cast<std::size_t>(layer)) {
        layer_tokens.resize(static_cast<std::size_t>(layer) + 1);
      }
      std::vector<double>& t = layer_tokens[static_cast<std::size_t>(layer)];
      t.resize(s.tokens_per_expert.size(), 0.0);
      for (std::size_t e = 0; e < t.size(); ++e) t[e] += s.tokens_per_expert[e];
    }
    for (std::size_t e = 0; e < s.tokens_per_expert.size(); ++e) {
      tokens_per_expert[e] += s.tokens_per_expert[e];
      choices += s.tokens_per_expert[e];
    }
    aux_loss += s.aux_loss;
    z_loss += s.z_loss;
    dropped += s.dropped;
    choices += s.dropped;
    ++calls;
  }
};

struct PipelineStats {
  // This rank's loss share (last stage only; zero elsewhere), once read by
  // GptPipeline::read_loss (on a device it stays there until then).
  model::LossSum loss;
  double busy_ms = 0;   // forward and backward compute
  double total_ms = 0;  // the whole schedule, waits included
  int max_live_activations = 0;
  std::int64_t activation_bytes = 0;  // peak bytes of activation slots held at once
  MoeRouting moe;                     // this rank's MoE layers, over the iteration's forwards
};

class GptPipeline final : public parallel::PipelineStage {
 public:
  // runtimes[c]: the model runtime of chunk c (tp group, hooks). The activation slots live on
  // ctx's device.
  GptPipeline(const RankModel& model, const parallel::ParallelContext& par,
              parallel::PipelineScheduleKind kind, int num_microbatches,
              std::int64_t micro_batch_size, std::vector<model::ModelRuntime> runtimes,
              const core::ExecContext& ctx = {});

  // Rebuilds the schedule for another micro-batch count (--rampup-batch-size), adding
  // activation slots when the new schedule keeps more alive.
  // The gradient scale of each micro-batch's mixture-of-experts auxiliary losses
  // (model::ModelRuntime::moe_aux_loss_scale), for the coming iterations.
  void set_moe_aux_loss_scale(double scale) {
    for (model::ModelRuntime& rt : runtimes_) rt.moe_aux_loss_scale = scale;
  }
  void set_num_microbatches(int num_microbatches) {
    executor_->set_num_microbatches(num_microbatches);
  }

  // One training iteration: every step of the schedule; gradients accumulate (+=) into the
  // views' gradients (or the gradient buffers the runtimes' layer-weight providers hand out,
  // which hear of each backward through LayerWeightsProvider::begin_backward).
  PipelineStats train(const core::ExecContext& ctx, const model::ModelViews& views, float d_scale,
                      const MicroBatches& batches);
  // The loss share of the last train() into stats.loss. The micro-batches' losses add up on the
  // device; their read rides on the next host sync of the stream (the gradient norm's), so the
  // iteration costs no host sync for its loss (kernels/memory.h read_later).
  void read_loss(const core::ExecContext& ctx, PipelineStats& stats);
  // Forward only (no dropout) over `num_microbatches` micro-batches (evaluation); returns the
  // loss share.
  model::LossSum evaluate(const core::ExecContext& ctx, const model::ModelViews& views,
                          int num_microbatches, const MicroBatches& batches);

  std::int64_t activation_bytes_per_slot(int chunk) const;
  int slots_per_chunk() const { return executor_->slots_per_chunk(); }
  // Activation slots allocated for `chunk` (what trident plan predicts).
  int slots_of(int chunk) const { return executor_->slots_of(chunk); }
  const std::vector<parallel::PipeStep>& schedule() const { return executor_->schedule(); }

  // parallel::PipelineStage
  int num_chunks() const override { return static_cast<int>(runtimes_.size()); }
  void add_slots(int chunk, int count) override;
  Boundary boundary(int chunk, int slot) override;

 private:
  struct Slot {
    model::GptActivations acts;
    std::vector<std::int32_t> tokens, labels;
  };
  Slot& slot(int chunk, int index) {
    return slots_by_chunk_[static_cast<std::size_t>(chunk)][static_cast<std::size_t>(index)];
  }
  void forward(const core::ExecContext& ctx, const model::ModelViews& views, int chunk, int slot,
               int micro, const MicroBatches& batches, model::LossGrad grad, float d_scale,
               model::LossSum& loss);
  void backward(const core::ExecContext& ctx, const model::ModelViews& views, int chunk, int slot,
                bool last_of_iteration);

  core::ExecContext ctx_;  // where the activation slots live
  const RankModel& model_;
  std::vector<model::ModelRuntime> runtimes_;
  MoeRouting moe_;  // the training pass's, reset by train()
  std::int64_t micro_batch_size_ = 1;
  std::vector<std::vector<Slot>> slots_by_chunk_;
  // The iteration's loss sum on ctx_'s device, and where its deferred read lands.
  core::Arena loss_arena_;
  kernels::TokenLossSum* loss_on_device_ = nullptr;
  kernels::HostBuffer loss_host_;
  std::uint64_t loss_ticket_ = 0;
  std::optional<parallel::PipelineExecutor> executor_;  // last: it adds this stage's slots
};

}  // namespace trident::train
