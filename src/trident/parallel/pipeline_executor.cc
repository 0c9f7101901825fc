#include "trident/parallel/pipeline_executor.h"

#include <algorithm>

#include "trident/core/error.h"
#include "trident/core/timer.h"

namespace trident::parallel {

PipelineExecutor::PipelineExecutor(PipelineStage& stage, comm::Communicator& pp,
                                   PipelineScheduleKind kind, int num_microbatches)
    : stage_(stage),
      pp_(pp),
      kind_(kind),
      pp_size_(pp.size()),
      pp_rank_(pp.rank()),
      num_chunks_(stage.num_chunks()),
      num_microbatches_(num_microbatches) {
  slots_by_chunk_.resize(static_cast<std::size_t>(num_chunks_));
  build(num_microbatches);
}

void PipelineExecutor::set_num_microbatches(int num_microbatches) {
  if (num_microbatches != num_microbatches_) build(num_microbatches);
}

void PipelineExecutor::build(int num_microbatches) {
  num_microbatches_ = num_microbatches;
  StagePlan plan = plan_stage(kind_, {pp_size_, num_microbatches, num_chunks_}, pp_rank_);
  schedule_ = std::move(plan.schedule);
  lockstep_ = std::move(plan.lockstep);
  last_backward_.assign(schedule_.size(), false);
  std::vector<bool> seen(static_cast<std::size_t>(num_chunks_), false);
  for (std::size_t i = schedule_.size(); i-- > 0;) {
    const PipeStep& st = schedule_[i];
    if (st.op == PipeOp::kBackward && !seen[static_cast<std::size_t>(st.chunk)]) {
      seen[static_cast<std::size_t>(st.chunk)] = true;
      last_backward_[i] = true;
    }
  }
  // Activation slots: enough for the most (micro-batch, chunk) pairs alive at once on a chunk.
  const std::vector<int>& peak = plan.slots_per_chunk;
  slots_ = std::max(slots_, *std::max_element(peak.begin(), peak.end()));
  for (int c = 0; c < num_chunks_; ++c) {
    auto& slots = slots_by_chunk_[static_cast<std::size_t>(c)];
    const int want = peak[static_cast<std::size_t>(c)];
    if (static_cast<int>(slots.size()) >= want) continue;
    stage_.add_slots(c, want);
    slots.resize(static_cast<std::size_t>(want));
  }
}

int PipelineExecutor::tag(int micro, int chunk, int direction) const {
  return ((micro * num_chunks_ + chunk) * 2 + direction) % 32000;
}

int PipelineExecutor::acquire(int chunk, int micro) {
  auto& slots = slots_by_chunk_[static_cast<std::size_t>(chunk)];
  for (std::size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    if (s.micro < 0) {
      for (comm::Request& r : s.pending) r.wait();  // its buffers may still be on the wire
      s.pending.clear();
      s.micro = micro;
      return static_cast<int>(i);
    }
  }
  TRIDENT_ASSERT(false, "no free activation slot for chunk ", chunk, " micro-batch ", micro);
  throw;  // unreachable
}

int PipelineExecutor::find(int chunk, int micro) const {
  const auto& slots = slots_by_chunk_[static_cast<std::size_t>(chunk)];
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i].micro == micro) return static_cast<int>(i);
  TRIDENT_ASSERT(false, "micro-batch ", micro, " of chunk ", chunk, " has no activations");
  throw;  // unreachable
}

void PipelineExecutor::forward_step(const StageWork& work, int chunk, int micro, double& busy_ms,
                                    bool exchange) {
  // In lockstep the slot was taken when its input's receive was posted (virtual stage 0 has none).
  const int i = exchange || is_first_virtual(chunk) ? acquire(chunk, micro) : find(chunk, micro);
  Slot& s = slot(chunk, i);
  s.activation_in.wait();
  const PipelineStage::Boundary b = stage_.boundary(chunk, i);
  if (exchange && !is_first_virtual(chunk)) {
    // The previous virtual stage: the previous rank, or the last rank's previous chunk.
    pp_.recv(b.input, b.elements, comm::Datatype::kF32, (pp_rank_ + pp_size_ - 1) % pp_size_,
             tag(micro, pp_rank_ == 0 ? chunk - 1 : chunk, 0));
  }
  core::Timer t;
  work.forward(chunk, i, micro);
  busy_ms += t.elapsed_ms();
  if (exchange && !is_last_virtual(chunk)) {
    s.pending.push_back(pp_.isend(b.output, b.elements, comm::Datatype::kF32,
                                  (pp_rank_ + 1) % pp_size_, tag(micro, chunk, 0)));
  }
}

void PipelineExecutor::backward_step(const StageWork& work, int chunk, int micro, bool last,
                                     double& busy_ms, bool exchange) {
  const int i = find(chunk, micro);
  Slot& s = slot(chunk, i);
  s.gradient_in.wait();
  const PipelineStage::Boundary b = stage_.boundary(chunk, i);
  if (exchange && !is_last_virtual(chunk)) {
    // The next virtual stage: the next rank, or the first rank's next chunk.
    pp_.recv(b.gradient, b.elements, comm::Datatype::kF32, (pp_rank_ + 1) % pp_size_,
             tag(micro, pp_rank_ == pp_size_ - 1 ? chunk + 1 : chunk, 1));
  }
  core::Timer t;
  work.backward(chunk, i, micro, last);
  busy_ms += t.elapsed_ms();
  if (!exchange) return;
  if (!is_first_virtual(chunk)) {
    s.pending.push_back(pp_.isend(b.gradient, b.elements, comm::Datatype::kF32,
                                  (pp_rank_ + pp_size_ - 1) % pp_size_, tag(micro, chunk, 1)));
  }
  s.micro = -1;  // free once its sends complete (acquire waits for them)
}

void PipelineExecutor::exchange(const PipeRound& round) {
  // Tags for MPI (the producer's chunk, as the non-lockstep path); NCCL goes by the order.
  const auto tag_of = [&](const PipeMessage& m) {
    return tag(m.microbatch, m.from_virtual / pp_size_, m.gradient ? 1 : 0);
  };
  for (const PipeMessage& m : round.sends) {
    const int i = find(m.chunk, m.microbatch);
    const PipelineStage::Boundary b = stage_.boundary(m.chunk, i);
    slot(m.chunk, i)
        .pending.push_back(pp_.isend(m.gradient ? b.gradient : b.output, b.elements,
                                     comm::Datatype::kF32, m.peer, tag_of(m)));
  }
  comm::Request* any = nullptr;
  for (const PipeMessage& m : round.recvs) {
    const int i = m.gradient ? find(m.chunk, m.microbatch) : acquire(m.chunk, m.microbatch);
    const PipelineStage::Boundary b = stage_.boundary(m.chunk, i);
    Slot& s = slot(m.chunk, i);
    comm::Request& r = m.gradient ? s.gradient_in : s.activation_in;
    r = pp_.irecv(m.gradient ? b.gradient : b.input, b.elements, comm::Datatype::kF32, m.peer,
                  tag_of(m));
    any = &r;
  }
  // Testing a request puts its batch on the wire (NCCL: one group per round, in round order on
  // every rank, so every group is matched whatever waits on what); MPI just progresses.
  if (any == nullptr && !round.sends.empty()) {
    const PipeMessage& last = round.sends.back();
    any = &slot(last.chunk, find(last.chunk, last.microbatch)).pending.back();
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

PassStats PipelineExecutor::train(const StageWork& work) {
  PassStats stats;
  core::Timer total;
  int live = 0;
  // One step of the schedule; `exchange`: its sends and receives are its own (else the round's).
  auto run_step = [&](std::size_t i, bool exchange) {
    const PipeStep& st = schedule_[i];
    if (st.op == PipeOp::kForward) {
      forward_step(work, st.chunk, st.microbatch, stats.busy_ms, exchange);
      stats.max_live_activations = std::max(stats.max_live_activations, ++live);
    } else {
      backward_step(work, st.chunk, st.microbatch, last_backward_[i], stats.busy_ms, exchange);
      --live;
    }
  };
  if (lockstep_) {
    for (const PipeRound& round : lockstep_->rounds) {
      Slot* freed = nullptr;
      if (round.step >= 0) {
        const auto i = static_cast<std::size_t>(round.step);
        run_step(i, /*exchange=*/false);
        const PipeStep& st = schedule_[i];
        if (st.op == PipeOp::kBackward) freed = &slot(st.chunk, find(st.chunk, st.microbatch));
      }
      exchange(round);
      if (freed != nullptr) freed->micro = -1;  // its gradient's send is pending on it
    }
  } else {
    for (std::size_t i = 0; i < schedule_.size(); ++i) run_step(i, /*exchange=*/true);
  }
  drain();
  stats.total_ms = total.elapsed_ms();
  return stats;
}

PassStats PipelineExecutor::forward_only(int num_microbatches, const StageWork& work) {
  PassStats stats;
  core::Timer total;
  for (int micro = 0; micro < num_microbatches; ++micro) {
    for (int c = 0; c < num_chunks_; ++c) {
      forward_step(work, c, micro, stats.busy_ms, /*exchange=*/true);
      slot(c, find(c, micro)).micro = -1;
    }
  }
  drain();
  stats.max_live_activations = 1;
  stats.total_ms = total.elapsed_ms();
  return stats;
}

}  // namespace trident::parallel
