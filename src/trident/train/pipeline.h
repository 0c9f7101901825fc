// PipelineExecutor: runs a pipeline schedule (parallel/pipeline_schedule.h) on this rank:
// forward and backward of each (micro-batch, chunk) step, receiving activations / gradients from
// the neighbouring stages and sending its own with non-blocking point-to-point calls over the pp
// group. With one stage it is the plain gradient-accumulation loop. It has no scheduling logic of
// its own: the order is the schedule's, and with virtual stages its lockstep plan's
// (parallel::build_lockstep_plan).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/arena.h"
#include "trident/kernels/memory.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"
#include "trident/model/gpt.h"
#include "trident/parallel/parallel_context.h"
#include "trident/parallel/pipeline_schedule.h"
#include "trident/train/rank_model.h"
#include "trident/train/zero_optimizer.h"

namespace trident::train {

// The micro-batches of one iteration for this data-parallel rank.
struct MicroBatches {
  // Writes micro-batch `micro`'s inputs (B*T) and labels (B*T).
  std::function<void(int micro, std::int32_t* tokens, std::int32_t* labels)> fill;
  // Global sample id of micro-batch `micro`'s first row (keys the dropout masks).
  std::function<std::int64_t(int micro)> first_sample;
  std::int64_t iteration = 0;  // keys the dropout masks
};

struct PipelineStats {
  // This rank's loss share (last stage only; zero elsewhere), once read by
  // PipelineExecutor::read_loss (on a device it stays there until then).
  model::LossSum loss;
  double busy_ms = 0;   // forward and backward compute
  double total_ms = 0;  // the whole schedule, waits included
  int max_live_activations = 0;
  std::int64_t activation_bytes = 0;  // peak bytes of activation slots held at once
};

class PipelineExecutor {
 public:
  // runtimes[c]: the model runtime of chunk c (tp group, hooks). The activation slots live on
  // ctx's device.
  PipelineExecutor(const RankModel& model, const parallel::ParallelContext& par,
                   parallel::PipelineScheduleKind kind, int num_microbatches,
                   std::int64_t micro_batch_size, std::vector<model::ModelRuntime> runtimes,
                   const core::ExecContext& ctx = {});

  // Rebuilds the schedule for another micro-batch count (--rampup-batch-size), adding
  // activation slots when the new schedule keeps more alive.
  void set_num_microbatches(int num_microbatches);

  // One training iteration: every step of the schedule; gradients accumulate (+=) into the
  // views' gradients (or the gradient buffers the runtimes' layer-weight providers hand out).
  PipelineStats train(const core::ExecContext& ctx, const ModelViews& views, float d_scale,
                      const MicroBatches& batches);
  // The loss share of the last train() into stats.loss. The micro-batches' losses add up on the
  // device; their read rides on the next host sync of the stream (the gradient norm's), so the
  // iteration costs no host sync for its loss (kernels/memory.h read_later).
  void read_loss(const core::ExecContext& ctx, PipelineStats& stats);
  // Forward only (no dropout) over `num_microbatches` micro-batches (evaluation); returns the
  // loss share.
  model::LossSum evaluate(const core::ExecContext& ctx, const ModelViews& views,
                          int num_microbatches, const MicroBatches& batches);

  std::int64_t activation_bytes_per_slot(int chunk) const;
  int slots_per_chunk() const { return slots_; }
  // Activation slots allocated for `chunk` (what trident plan predicts).
  int slots_of(int chunk) const {
    return static_cast<int>(slots_by_chunk_[static_cast<std::size_t>(chunk)].size());
  }
  const std::vector<parallel::PipeStep>& schedule() const { return schedule_; }

 private:
  struct Slot {
    model::GptActivations acts;
    std::vector<std::int32_t> tokens, labels;
    int micro = -1;                      // -1: free
    std::vector<comm::Request> pending;  // sends reading this slot's buffers
    // Lockstep: the receives of the input activation and of the output's gradient, waited for
    // just before the step that reads them.
    comm::Request activation_in, gradient_in;
  };
  int virtual_stage(int chunk) const { return chunk * pp_size_ + pp_rank_; }
  bool is_first_virtual(int chunk) const { return virtual_stage(chunk) == 0; }
  bool is_last_virtual(int chunk) const {
    return virtual_stage(chunk) == pp_size_ * num_chunks_ - 1;
  }
  int tag(int micro, int chunk, int direction) const;
  Slot& acquire(int chunk, int micro);
  Slot& find(int chunk, int micro);
  // exchange: receive the step's input and send its output here (false: the lockstep plan's
  // rounds move them, and a backward's slot is freed after its round).
  void forward_step(const core::ExecContext& ctx, const ModelViews& views, int chunk, int micro,
                    const MicroBatches& batches, model::LossGrad grad, float d_scale,
                    model::LossSum& loss, double& busy_ms, bool exchange = true);
  void backward_step(const core::ExecContext& ctx, const ModelViews& views, int chunk, int micro,
                     double& busy_ms, bool exchange = true);
  // One lockstep round's messages: every send and receive posted in the plan's order, as one
  // batch (one NCCL group) put on the wire at once; the receives are waited for by the steps
  // that read them.
  void exchange(const parallel::PipeRound& round);
  void drain();
  void build(int num_microbatches);

  core::ExecContext ctx_;  // where the activation slots live
  const RankModel& model_;
  const parallel::ParallelContext& par_;
  std::vector<model::ModelRuntime> runtimes_;
  std::vector<parallel::PipeStep> schedule_;
  std::vector<bool> last_backward_;  // per schedule step: the chunk's last backward
  parallel::PipelineScheduleKind kind_;
  int pp_size_ = 1, pp_rank_ = 0, num_chunks_ = 1, num_microbatches_ = 1, slots_ = 1;
  std::int64_t micro_batch_size_ = 1;
  std::vector<std::vector<Slot>> slots_by_chunk_;
  // With virtual stages (the interleaved schedule) the steps run in lockstep rounds, whose
  // exchanges post a pair's messages in the same order on both ranks (NCCL matches by order).
  std::optional<parallel::LockstepPlan> lockstep_;
  // The iteration's loss sum on ctx_'s device, and where its deferred read lands.
  core::Arena loss_arena_;
  kernels::TokenLossSum* loss_on_device_ = nullptr;
  kernels::HostBuffer loss_host_;
  std::uint64_t loss_ticket_ = 0;
};

}  // namespace trident::train
