#include "trident/train/pipeline.h"

#include <algorithm>

#include "trident/core/error.h"
#include "trident/core/timer.h"
#include "trident/kernels/memory.h"

namespace trident::train {

PipelineExecutor::PipelineExecutor(const RankModel& model, const parallel::ParallelContext& par,
                                   parallel::PipelineScheduleKind kind, int num_microbatches,
                                   std::int64_t micro_batch_size,
                                   std::vector<model::ModelRuntime> runtimes,
                                   const core::ExecContext& ctx)
    : ctx_(ctx),
      model_(model),
      par_(par),
      runtimes_(std::move(runtimes)),
      kind_(kind),
      pp_size_(par.layout().pp_size),
      pp_rank_(par.coord().pp),
      num_chunks_(static_cast<int>(model.chunks().size())),
      num_microbatches_(num_microbatches),
      micro_batch_size_(micro_batch_size) {
  TRIDENT_ASSERT(static_cast<int>(runtimes_.size()) == num_chunks_, "one runtime per chunk");
  slots_by_chunk_.resize(static_cast<std::size_t>(num_chunks_));
  build(num_microbatches);
  loss_arena_ = core::Arena(256, kernels::memory_for(ctx_));
  loss_on_device_ = static_cast<kernels::TokenLossSum*>(
      loss_arena_.alloc(core::DType::kI64, {2}).data);  // {double sum, int64 count}
  loss_host_ = kernels::HostBuffer(ctx_, sizeof(kernels::TokenLossSum));
}

void PipelineExecutor::set_num_microbatches(int num_microbatches) {
  if (num_microbatches != num_microbatches_) build(num_microbatches);
}

void PipelineExecutor::build(int num_microbatches) {
  num_microbatches_ = num_microbatches;
  parallel::StagePlan plan =
      parallel::plan_stage(kind_, {pp_size_, num_microbatches, num_chunks_}, pp_rank_);
  schedule_ = std::move(plan.schedule);
  lockstep_ = std::move(plan.lockstep);
  // Activation slots: enough for the most (micro-batch, chunk) pairs alive at once on a chunk.
  const std::vector<int>& peak = plan.slots_per_chunk;
  last_backward_.assign(schedule_.size(), false);
  std::vector<bool> seen(static_cast<std::size_t>(num_chunks_), false);
  for (std::size_t i = schedule_.size(); i-- > 0;) {
    const parallel::PipeStep& st = schedule_[i];
    if (st.op == parallel::PipeOp::kBackward && !seen[static_cast<std::size_t>(st.chunk)]) {
      seen[static_cast<std::size_t>(st.chunk)] = true;
      last_backward_[i] = true;
    }
  }
  slots_ = std::max(slots_, *std::max_element(peak.begin(), peak.end()));
  const model::ModelConfig& cfg = model_.config();
  for (int c = 0; c < num_chunks_; ++c) {
    auto& slots = slots_by_chunk_[static_cast<std::size_t>(c)];
    const std::size_t had = slots.size();
    if (static_cast<int>(had) >= peak[static_cast<std::size_t>(c)]) continue;
    slots.resize(static_cast<std::size_t>(peak[static_cast<std::size_t>(c)]));
    for (std::size_t i = had; i < slots.size(); ++i) {
      Slot& s = slots[i];
      model::make_activations(cfg, model_.chunks()[static_cast<std::size_t>(c)].shard,
                              micro_batch_size_, cfg.seq_length,
                              runtimes_[static_cast<std::size_t>(c)].params_bf16 != nullptr, s.acts,
                              ctx_);
      s.tokens.resize(static_cast<std::size_t>(micro_batch_size_ * cfg.seq_length));
      s.labels.resize(s.tokens.size());
    }
  }
}

std::int64_t PipelineExecutor::activation_bytes_per_slot(int chunk) const {
  return slots_by_chunk_[static_cast<std::size_t>(chunk)].front().acts.arena.capacity();
}

int PipelineExecutor::tag(int micro, int chunk, int direction) const {
  return ((micro * num_chunks_ + chunk) * 2 + direction) % 32000;
}

PipelineExecutor::Slot& PipelineExecutor::acquire(int chunk, int micro) {
  for (Slot& s : slots_by_chunk_[static_cast<std::size_t>(chunk)]) {
    if (s.micro < 0) {
      for (comm::Request& r : s.pending) r.wait();  // its buffers may still be on the wire
      s.pending.clear();
      s.micro = micro;
      return s;
    }
  }
  TRIDENT_ASSERT(false, "no free activation slot for chunk ", chunk, " micro-batch ", micro);
  throw;  // unreachable
}

PipelineExecutor::Slot& PipelineExecutor::find(int chunk, int micro) {
  for (Slot& s : slots_by_chunk_[static_cast<std::size_t>(chunk)])
    if (s.micro == micro) return s;
  TRIDENT_ASSERT(false, "micro-batch ", micro, " of chunk ", chunk, " has no activations");
  throw;  // unreachable
}

void PipelineExecutor::forward_step(const core::ExecContext& ctx, const ModelViews& views,
                                    int chunk, int micro, const MicroBatches& batches,
                                    model::LossGrad grad, float d_scale, model::LossSum& loss,
                                    double& busy_ms, bool exchange) {
  const model::ModelConfig& cfg = model_.config();
  const std::int64_t C = cfg.hidden_size;
  // In lockstep the slot was taken when its input's receive was posted (virtual stage 0 has none).
  Slot& s = exchange || is_first_virtual(chunk) ? acquire(chunk, micro) : find(chunk, micro);
  s.activation_in.wait();
  const std::int64_t rows = s.acts.stage_rows;  // B*T, or this tp rank's rows with SP
  const model::ModelShard& shard = model_.chunks()[static_cast<std::size_t>(chunk)].shard;
  if (model::stage_reads_tokens(cfg, shard)) {
    // Filled on the host, then staged to the activations' device (the copy of pageable memory is
    // staged before the call returns, so the vectors may be refilled at once).
    batches.fill(micro, s.tokens.data(), s.labels.data());
    const auto bytes = static_cast<std::int64_t>(s.tokens.size() * sizeof(std::int32_t));
    kernels::copy_to_device(ctx, s.acts.tokens, s.tokens.data(), bytes);
    kernels::copy_to_device(ctx, s.acts.labels, s.labels.data(), bytes);
  }
  comm::Communicator& pp = par_.pp();
  if (exchange && !is_first_virtual(chunk)) {
    // The previous virtual stage: the previous rank, or the last rank's previous chunk.
    pp.recv(s.acts.encoded, rows * C, comm::Datatype::kF32, (pp_rank_ + pp_size_ - 1) % pp_size_,
            tag(micro, pp_rank_ == 0 ? chunk - 1 : chunk, 0));
  }
  core::Timer t;
  model::ModelRuntime& rt = runtimes_[static_cast<std::size_t>(chunk)];
  model::gpt_forward(ctx, cfg, rt, views.params[static_cast<std::size_t>(chunk)],
                     {.tokens = s.acts.tokens,
                      .first_sample = batches.first_sample(micro),
                      .iteration = batches.iteration,
                      .training = grad == model::LossGrad::kCompute},
                     s.acts);
  if (shard.has_head) {
    // A chunked head (--loss-chunk-rows) runs its output layer here, and with gradients its
    // backward too: the output weight's gradient accumulates now.
    const auto c = static_cast<std::size_t>(chunk);
    const model::GptGrads none;
    const model::LossSum l = model::gpt_loss(
        ctx, cfg, rt, views.params[c],
        grad == model::LossGrad::kCompute && c < views.grads.size() ? views.grads[c] : none,
        s.acts.labels, d_scale, grad, s.acts);
    loss.sum += l.sum;
    loss.count += l.count;
  }
  busy_ms += t.elapsed_ms();
  if (exchange && !is_last_virtual(chunk)) {
    s.pending.push_back(pp.isend(s.acts.output(), rows * C, comm::Datatype::kF32,
                                 (pp_rank_ + 1) % pp_size_, tag(micro, chunk, 0)));
  }
}

void PipelineExecutor::backward_step(const core::ExecContext& ctx, const ModelViews& views,
                                     int chunk, int micro, double& busy_ms, bool exchange) {
  const model::ModelConfig& cfg = model_.config();
  const std::int64_t C = cfg.hidden_size;
  Slot& s = find(chunk, micro);
  s.gradient_in.wait();
  const std::int64_t rows = s.acts.stage_rows;
  comm::Communicator& pp = par_.pp();
  if (exchange && !is_last_virtual(chunk)) {
    // The next virtual stage: the next rank, or the first rank's next chunk.
    pp.recv(s.acts.d_x, rows * C, comm::Datatype::kF32, (pp_rank_ + 1) % pp_size_,
            tag(micro, pp_rank_ == pp_size_ - 1 ? chunk + 1 : chunk, 1));
  }
  core::Timer t;
  model::gpt_backward(ctx, cfg, runtimes_[static_cast<std::size_t>(chunk)],
                      views.params[static_cast<std::size_t>(chunk)],
                      views.grads[static_cast<std::size_t>(chunk)], s.acts.tokens, s.acts);
  busy_ms += t.elapsed_ms();
  if (!exchange) return;
  if (!is_first_virtual(chunk)) {
    s.pending.push_back(pp.isend(s.acts.d_x, rows * C, comm::Datatype::kF32,
                                 (pp_rank_ + pp_size_ - 1) % pp_size_, tag(micro, chunk, 1)));
  }
  s.micro = -1;  // free once its sends complete (acquire waits for them)
}

void PipelineExecutor::exchange(const parallel::PipeRound& round) {
  const std::int64_t C = model_.config().hidden_size;
  comm::Communicator& pp = par_.pp();
  // Tags for MPI (the producer's chunk, as the non-lockstep path); NCCL goes by the order.
  const auto tag_of = [&](const parallel::PipeMessage& m) {
    return tag(m.microbatch, m.from_virtual / pp_size_, m.gradient ? 1 : 0);
  };
  for (const parallel::PipeMessage& m : round.sends) {
    Slot& s = find(m.chunk, m.microbatch);
    s.pending.push_back(pp.isend(m.gradient ? s.acts.d_x : s.acts.output(), s.acts.stage_rows * C,
                                 comm::Datatype::kF32, m.peer, tag_of(m)));
  }
  comm::Request* any = nullptr;
  for (const parallel::PipeMessage& m : round.recvs) {
    Slot& s = m.gradient ? find(m.chunk, m.microbatch) : acquire(m.chunk, m.microbatch);
    comm::Request& r = m.gradient ? s.gradient_in : s.activation_in;
    r = pp.irecv(m.gradient ? s.acts.d_x : s.acts.encoded, s.acts.stage_rows * C,
                 comm::Datatype::kF32, m.peer, tag_of(m));
    any = &r;
  }
  // Testing a request puts its batch on the wire (NCCL: one group per round, in round order on
  // every rank, so every group is matched whatever waits on what); MPI just progresses.
  if (any == nullptr && !round.sends.empty()) {
    any = &find(round.sends.back().chunk, round.sends.back().microbatch).pending.back();
  }
  if (any != nullptr) (void)any->test();
}

void PipelineExecutor::drain() {
  for (auto& slots : slots_by_chunk_) {
    for (Slot& s : slots) {
      for (comm::Request& r : s.pending) r.wait();
      s.pending.clear();
      s.micro = -1;
    }
  }
}

PipelineStats PipelineExecutor::train(const core::ExecContext& ctx, const ModelViews& views,
                                      float d_scale, const MicroBatches& batches) {
  PipelineStats stats;
  core::Timer total;
  int live = 0;
  kernels::zero_on_device(ctx, loss_on_device_, sizeof(kernels::TokenLossSum));
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
  // One step of the schedule; `exchange`: its sends and receives are its own (else the round's).
  auto run_step = [&](std::size_t i, bool exchange) {
    const parallel::PipeStep& st = schedule_[i];
    if (st.op == parallel::PipeOp::kForward) {
      forward_step(ctx, views, st.chunk, st.microbatch, batches, model::LossGrad::kCompute, d_scale,
                   stats.loss, stats.busy_ms, exchange);
      stats.max_live_activations = std::max(stats.max_live_activations, ++live);
    } else {
      // The chunk's weights provider (the optimizer's hooks) hears of each backward first.
      if (model::LayerWeightsProvider* w =
              runtimes_[static_cast<std::size_t>(st.chunk)].layer_weights)
        w->begin_backward(last_backward_[i]);
      backward_step(ctx, views, st.chunk, st.microbatch, stats.busy_ms, exchange);
      --live;
    }
  };
  if (lockstep_) {
    for (const parallel::PipeRound& round : lockstep_->rounds) {
      Slot* freed = nullptr;
      if (round.step >= 0) {
        const auto i = static_cast<std::size_t>(round.step);
        run_step(i, /*exchange=*/false);
        const parallel::PipeStep& st = schedule_[i];
        if (st.op == parallel::PipeOp::kBackward) freed = &find(st.chunk, st.microbatch);
      }
      exchange(round);
      if (freed != nullptr) freed->micro = -1;  // its gradient's send is pending on it
    }
  } else {
    for (std::size_t i = 0; i < schedule_.size(); ++i) run_step(i, /*exchange=*/true);
  }
  drain();
  loss_ticket_ =
      kernels::read_later(ctx, loss_host_.data(), loss_on_device_, sizeof(kernels::TokenLossSum));
  stats.total_ms = total.elapsed_ms();
  stats.activation_bytes =
      static_cast<std::int64_t>(stats.max_live_activations) * activation_bytes_per_slot(0);
  return stats;
}

void PipelineExecutor::read_loss(const core::ExecContext& ctx, PipelineStats& stats) {
  kernels::complete_read(ctx, loss_ticket_);
  const auto* sum = loss_host_.as<kernels::TokenLossSum>();
  stats.loss = {.sum = sum->sum, .count = sum->count};
}

model::LossSum PipelineExecutor::evaluate(const core::ExecContext& ctx, const ModelViews& views,
                                          int num_microbatches, const MicroBatches& batches) {
  model::LossSum loss;
  double busy = 0;
  for (model::ModelRuntime& rt : runtimes_) rt.loss_sum_on_device = nullptr;  // read per call
  for (int micro = 0; micro < num_microbatches; ++micro) {
    for (int c = 0; c < num_chunks_; ++c) {
      forward_step(ctx, views, c, micro, batches, model::LossGrad::kNone, 0.0f, loss, busy);
      Slot& s = find(c, micro);
      s.micro = -1;
    }
  }
  drain();
  return loss;
}

}  // namespace trident::train
