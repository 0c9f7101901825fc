#include "trident/train/pipeline.h"

#include "trident/core/error.h"
#include "trident/kernels/memory.h"

namespace trident::train {

GptPipeline::GptPipeline(const RankModel& model, const parallel::ParallelContext& par,
                         parallel::PipelineScheduleKind kind, int num_microbatches,
                         std::int64_t micro_batch_size, std::vector<model::ModelRuntime> runtimes,
                         const core::ExecContext& ctx)
    : ctx_(ctx),
      model_(model),
      runtimes_(std::move(runtimes)),
      micro_batch_size_(micro_batch_size) {
  TRIDENT_ASSERT(runtimes_.size() == model.chunks().size(), "one runtime per chunk");
  TRIDENT_ASSERT(par.pp().size() == par.layout().pp_size && par.pp().rank() == par.coord().pp,
                 "the pipeline group's ranks are the stages");
  slots_by_chunk_.resize(runtimes_.size());
  loss_arena_ = core::Arena(256, kernels::memory_for(ctx_));
  loss_on_device_ = static_cast<kernels::TokenLossSum*>(
      loss_arena_.alloc(core::DType::kI64, {2}).data);  // {double sum, int64 count}
  loss_host_ = kernels::HostBuffer(ctx_, sizeof(kernels::TokenLossSum));
  executor_.emplace(*this, par.pp(), kind, num_microbatches);
}

void GptPipeline::add_slots(int chunk, int count) {
  const model::ModelConfig& cfg = model_.config();
  auto& slots = slots_by_chunk_[static_cast<std::size_t>(chunk)];
  const std::size_t had = slots.size();
  slots.resize(static_cast<std::size_t>(count));
  for (std::size_t i = had; i < slots.size(); ++i) {
    Slot& s = slots[i];
    // Under context parallelism a rank holds seq_length / cp tokens of each sample.
    const model::ModelShard& shard = model_.chunks()[static_cast<std::size_t>(chunk)].shard;
    const std::int64_t seq_len = cfg.seq_length / shard.cp_size;
    model::make_activations(cfg, shard, micro_batch_size_, seq_len,
                            runtimes_[static_cast<std::size_t>(chunk)].bf16, s.acts, ctx_);
    s.tokens.resize(static_cast<std::size_t>(micro_batch_size_ * seq_len));
    s.labels.resize(s.tokens.size());
  }
}

parallel::PipelineStage::Boundary GptPipeline::boundary(int chunk, int index) {
  model::GptActivations& a = slot(chunk, index).acts;
  // B*T rows of the residual stream, or this tp rank's rows with sequence parallelism.
  return {.input = a.encoded,
          .output = a.output(),
          .gradient = a.d_x,
          .elements = a.stage_rows * model_.config().hidden_size};
}

std::int64_t GptPipeline::activation_bytes_per_slot(int chunk) const {
  return slots_by_chunk_[static_cast<std::size_t>(chunk)].front().acts.arena.capacity();
}

void GptPipeline::forward(const core::ExecContext& ctx, const model::ModelViews& views, int chunk,
                          int index, int micro, const MicroBatches& batches, model::LossGrad grad,
                          float d_scale, model::LossSum& loss) {
  const model::ModelConfig& cfg = model_.config();
  const auto c = static_cast<std::size_t>(chunk);
  Slot& s = slot(chunk, index);
  const model::ModelShard& shard = model_.chunks()[c].shard;
  if (model::stage_reads_tokens(cfg, shard)) {
    // Filled on the host, then staged to the activations' device (the copy of pageable memory is
    // staged before the call returns, so the vectors may be refilled at once).
    batches.fill(micro, s.tokens.data(), s.labels.data());
    const auto bytes = static_cast<std::int64_t>(s.tokens.size() * sizeof(std::int32_t));
    kernels::copy_to_device(ctx, s.acts.tokens, s.tokens.data(), bytes);
    kernels::copy_to_device(ctx, s.acts.labels, s.labels.data(), bytes);
  }
  const model::ModelRuntime& rt = runtimes_[c];
  model::gpt_forward(ctx, cfg, rt, views.params[c],
                     {.tokens = s.acts.tokens,
                      .first_sample = batches.first_sample(micro),
                      .iteration = batches.iteration,
                      .training = grad == model::LossGrad::kCompute},
                     s.acts);
  if (grad == model::LossGrad::kCompute) {
    for (std::size_t i = 0; i < s.acts.moe_stats.size(); ++i) {
      moe_.add(s.acts.moe_stats[i], shard.first_layer + static_cast<std::int64_t>(i));
    }
  }
  if (shard.has_head) {
    // A chunked head (--loss-chunk-rows) runs its output layer here, and with gradients its
    // backward too: the output weight's gradient accumulates now.
    const model::GptGrads none;
    const model::LossSum l = model::gpt_loss(
        ctx, cfg, rt, views.params[c],
        grad == model::LossGrad::kCompute && c < views.grads.size() ? views.grads[c] : none,
        s.acts.labels, d_scale, grad, s.acts);
    loss.sum += l.sum;
    loss.count += l.count;
  }
}

void GptPipeline::backward(const core::ExecContext& ctx, const model::ModelViews& views, int chunk,
                           int index, bool last_of_iteration) {
  const auto c = static_cast<std::size_t>(chunk);
  const model::ModelRuntime& rt = runtimes_[c];
  // The chunk's weights provider (the optimizer's hooks) hears of each backward first.
  if (rt.layer_weights != nullptr) rt.layer_weights->begin_backward(last_of_iteration);
  Slot& s = slot(chunk, index);
  model::gpt_backward(ctx, model_.config(), rt, views.params[c], views.grads[c], s.acts.tokens,
                      s.acts);
}

PipelineStats GptPipeline::train(const core::ExecContext& ctx, const model::ModelViews& views,
                                 float d_scale, const MicroBatches& batches) {
  kernels::zero_on_device(ctx, loss_on_device_, sizeof(kernels::TokenLossSum));
  moe_ = {};
  // The runtimes add their losses on the device during this call only, also when it throws.
  struct LossTarget {
    std::vector<model::ModelRuntime>& rts;
    LossTarget(std::vector<model::ModelRuntime>& r, kernels::TokenLossSum* sum) : rts(r) {
      for (model::ModelRuntime& rt : rts) rt.loss_sum_on_device = sum;
    }
    ~LossTarget() {
      for (model::ModelRuntime& rt : rts) rt.loss_sum_on_device = nullptr;
    }
    LossTarget(const LossTarget&) = delete;
    LossTarget& operator=(const LossTarget&) = delete;
  } target(runtimes_, loss_on_device_);
  model::LossSum on_host;  // stays zero: the losses add up on the device
  const parallel::PassStats pass =
      executor_->train({.forward =
                            [&](int chunk, int index, int micro) {
                              forward(ctx, views, chunk, index, micro, batches,
                                      model::LossGrad::kCompute, d_scale, on_host);
                            },
                        .backward = [&](int chunk, int index, int /*micro*/,
                                        bool last) { backward(ctx, views, chunk, index, last); }});
  loss_ticket_ =
      kernels::read_later(ctx, loss_host_.data(), loss_on_device_, sizeof(kernels::TokenLossSum));
  return {.loss = {},
          .busy_ms = pass.busy_ms,
          .total_ms = pass.total_ms,
          .max_live_activations = pass.max_live_activations,
          .activation_bytes =
              static_cast<std::int64_t>(pass.max_live_activations) * activation_bytes_per_slot(0),
          .moe = moe_};
}

void GptPipeline::read_loss(const core::ExecContext& ctx, PipelineStats& stats) {
  kernels::complete_read(ctx, loss_ticket_);
  const auto* sum = loss_host_.as<kernels::TokenLossSum>();
  stats.loss = {.sum = sum->sum, .count = sum->count};
}

model::LossSum GptPipeline::evaluate(const core::ExecContext& ctx, const model::ModelViews& views,
                                     int num_microbatches, const MicroBatches& batches) {
  model::LossSum loss;
  for (model::ModelRuntime& rt : runtimes_) rt.loss_sum_on_device = nullptr;  // read per call
  parallel::StageWork work;
  work.forward = [&](int chunk, int index, int micro) {
    forward(ctx, views, chunk, index, micro, batches, model::LossGrad::kNone, 0.0f, loss);
  };
  executor_->forward_only(num_microbatches, work);
  return loss;
}

}  // namespace trident::train
