// Gradient synchronisation over the data-parallel group, overlapped with backward. One strategy
// per ZeRO policy (make_grad_sync), behind one interface the composition drives from the model's
// per-layer events:
//
//   BucketAllReduce      (stage 0)    layer buckets all-reduced, each launched (non-blocking) as
//                                     soon as the last micro-batch's backward has finished it
//   BucketReduceScatter  (stage 1)    the same buckets reduce-scattered in place: each rank's
//                                     piece of a bucket lands in its block of the full gradient
//   LayerReduceScatter   (stages 2-3) every micro-batch's layer gradient (written into one
//                                     staging slot) reduce-scattered at once, this rank's piece
//                                     accumulated into its gradient shard
//
// Order within a step: finish_layers(), then anything that needs the whole non-layer gradients
// (the tied-embedding sum, optim/grad_finalize.h) through rest_grad_at(), then reduce_rest().
// After that held() is the reduced gradient this rank holds.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/exec_context.h"
#include "trident/optim/comm_counters.h"
#include "trident/optim/param_buffers.h"

namespace trident::optim {

// The reduced gradient a rank holds: its shard (stages 1-3; disjoint across dp ranks) or all of
// it (stage 0; the same on every dp rank).
struct HeldGrads {
  FlatSpan<float> grads;
  bool disjoint_over_dp = false;
};

class GradSync {
 public:
  GradSync(ParamGradBuffers& buffers, comm::Communicator& dp, CommCounters& counters)
      : buf_(buffers), dp_(dp), counters_(counters) {}
  virtual ~GradSync() = default;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Start of an iteration: zero the accumulated gradients.
  virtual void begin_iteration(const core::ExecContext& ctx) = 0;
  // Before each backward step: whether it is the iteration's last on this chunk's rank (the
  // point at which stages 0-1 may start reducing).
  void begin_backward(bool last_of_iteration) { last_backward_ = last_of_iteration; }
  // Where this backward accumulates the gradient of layer unit `u` (called just before the
  // layer's backward): its range of the full gradient, or the zeroed staging slot.
  virtual float* layer_grads(const core::ExecContext& ctx, int u) = 0;
  // Layer unit `u`'s gradient of this backward is complete.
  virtual void layer_done(const core::ExecContext& ctx, int u) = 0;
  // Every layer gradient reduced: launches what was never launched and waits for the rest.
  virtual void finish_layers() = 0;
  // Whole (not yet reduced) gradient of a non-layer element, valid until reduce_rest().
  float* rest_grad_at(std::int64_t flat) const { return buf_.rest_grad_at(flat); }
  // Reduces the embedding and head gradients over dp.
  virtual void reduce_rest(const core::ExecContext& ctx) = 0;
  virtual HeldGrads held() const = 0;
  // True when layer gradients are staged per micro-batch (layer_grads() returns the slot).
  virtual bool stages_layer_grads() const = 0;

 protected:
  void account(comm::OpKind kind, std::int64_t elements) {
    counters_.account(kind, elements, dp_.size());
  }

  ParamGradBuffers& buf_;
  comm::Communicator& dp_;
  CommCounters& counters_;
  bool last_backward_ = true;
};

std::unique_ptr<GradSync> make_grad_sync(ParamGradBuffers& buffers, comm::Communicator& dp,
                                         CommCounters& counters, std::int64_t bucket_size);

}  // namespace trident::optim
