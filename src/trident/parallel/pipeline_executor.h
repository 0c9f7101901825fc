// PipelineExecutor: runs a pipeline schedule (pipeline_schedule.h) on this rank: forward and
// backward of each (micro-batch, chunk) step in the schedule's order, receiving activations and
// gradients from the neighbouring stages and sending its own with point-to-point calls over the
// pp group. With one stage it is the plain gradient-accumulation loop. It knows nothing of the
// model: the stage (PipelineStage) owns the activation slots and says which of their buffers
// cross stage boundaries, and each pass is given its compute (StageWork). The executor decides
// which micro-batch holds which slot, when a slot's buffers may be reused (their sends are done)
// and, with virtual stages, runs the lockstep plan (parallel::build_lockstep_plan) that NCCL's
// by-order matching needs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/parallel/pipeline_schedule.h"

namespace trident::parallel {

// This rank's model chunks as the executor sees them.
class PipelineStage {
 public:
  // One slot's F32 tensors that cross stage boundaries (each `elements` long).
  struct Boundary {
    float* input = nullptr;         // receives the previous virtual stage's output (forward)
    const float* output = nullptr;  // sent to the next virtual stage after the forward
    // Receives the gradient of the output from the next virtual stage before the backward; holds
    // the gradient of the input after it, sent to the previous virtual stage.
    float* gradient = nullptr;
    std::int64_t elements = 0;
  };
  virtual ~PipelineStage() = default;
  virtual int num_chunks() const = 0;
  // Grows `chunk`'s activation slots to `count` (never called with fewer than it has).
  virtual void add_slots(int chunk, int count) = 0;
  virtual Boundary boundary(int chunk, int slot) = 0;
};

// One pass's compute, given per call by the model side (which holds the call's weights and data).
struct StageWork {
  // The forward of (chunk, micro) into activation slot `slot`; its input has arrived.
  std::function<void(int chunk, int slot, int micro)> forward;
  // The backward of (chunk, micro) from slot `slot`; the gradient of its output has arrived.
  // `last_of_iteration`: the chunk's last backward of the pass. Unused by forward_only.
  std::function<void(int chunk, int slot, int micro, bool last_of_iteration)> backward;
};

struct PassStats {
  double busy_ms = 0;   // in the stage's forward and backward
  double total_ms = 0;  // the whole pass, waits included
  int max_live_activations = 0;
};

class PipelineExecutor {
 public:
  // `pp`: the pipeline group (rank = stage). Adds the schedule's activation slots to `stage`.
  PipelineExecutor(PipelineStage& stage, comm::Communicator& pp, PipelineScheduleKind kind,
                   int num_microbatches);

  // Rebuilds the schedule for another micro-batch count (--rampup-batch-size), adding
  // activation slots when the new schedule keeps more alive.
  void set_num_microbatches(int num_microbatches);

  // Every step of the schedule (one training iteration).
  PassStats train(const StageWork& work);
  // Forwards only, micro-batch by micro-batch through every chunk (evaluation).
  PassStats forward_only(int num_microbatches, const StageWork& work);

  int slots_per_chunk() const { return slots_; }
  // Activation slots of `chunk` (what trident plan predicts).
  int slots_of(int chunk) const {
    return static_cast<int>(slots_by_chunk_[static_cast<std::size_t>(chunk)].size());
  }
  const std::vector<PipeStep>& schedule() const { return schedule_; }

 private:
  // Which micro-batch holds a slot, and the messages on its buffers.
  struct Slot {
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
  int acquire(int chunk, int micro);  // a free slot's index, its sends complete
  int find(int chunk, int micro) const;
  Slot& slot(int chunk, int index) {
    return slots_by_chunk_[static_cast<std::size_t>(chunk)][static_cast<std::size_t>(index)];
  }
  // exchange: receive the step's input and send its output here (false: the lockstep plan's
  // rounds move them, and a backward's slot is freed after its round).
  void forward_step(const StageWork& work, int chunk, int micro, double& busy_ms, bool exchange);
  void backward_step(const StageWork& work, int chunk, int micro, bool last, double& busy_ms,
                     bool exchange);
  // One lockstep round's messages: every send and receive posted in the plan's order, as one
  // batch (one NCCL group) put on the wire at once; the receives are waited for by the steps
  // that read them.
  void exchange(const PipeRound& round);
  void drain();
  void build(int num_microbatches);

  PipelineStage& stage_;
  comm::Communicator& pp_;
  PipelineScheduleKind kind_;
  int pp_size_ = 1, pp_rank_ = 0, num_chunks_ = 1, num_microbatches_ = 1, slots_ = 1;
  std::vector<PipeStep> schedule_;
  std::vector<bool> last_backward_;  // per schedule step: the chunk's last backward
  std::vector<std::vector<Slot>> slots_by_chunk_;
  // With virtual stages (the interleaved schedule) the steps run in lockstep rounds, whose
  // exchanges post a pair's messages in the same order on both ranks (NCCL matches by order).
  std::optional<LockstepPlan> lockstep_;
};

}  // namespace trident::parallel
