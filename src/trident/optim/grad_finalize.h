// Gradient finalisation between the data-parallel reduction and the update:
//   - tied embeddings: the first pipeline stage's word embedding and the last stage's copy sum
//     their gradients over the embedding group (before the dp reduction, while whole);
//   - sequence-parallel LayerNorm sums: each tp rank's LayerNorm gradient covers only its token
//     rows, so the held gradients of those parameters are summed over tp;
//   - replicated-part sums: a parameter partly replicated over a subgroup of tp ranks
//     (ParamSpec::tp_replicas, grouped-query attention's key/value heads with fewer groups than
//     ranks) has each copy's gradient from that rank's heads only: summed over the subgroup;
//   - the global gradient norm, counting each parameter element once in the whole job;
//   - the loss-scale overflow check (FP16) and the clipping coefficient.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>

#include "trident/comm/communicator.h"
#include "trident/core/exec_context.h"
#include "trident/optim/flat_layout.h"
#include "trident/optim/grad_sync.h"
#include "trident/parallel/parallel_context.h"

namespace trident::optim {

// How the gradients were scaled (FP16 loss scaling): they are divided by `loss_scale` before
// clipping and the update; any gradient above `overflow_threshold` in magnitude (FP16's largest
// value under --fp16) or not finite is an overflow, and the step is skipped.
struct GradScaling {
  double loss_scale = 1.0;
  float overflow_threshold = INFINITY;
};

// A part's gradients after the reductions: the squared global norm of its (scaled) gradients,
// summed over the job, and whether any rank found an overflow.
struct GradShare {
  double norm_sq = 0;
  bool overflow = false;
};

struct FinalizedGrads {
  double grad_norm = 0;     // of the unscaled gradient
  bool skipped = false;     // overflow or a non-finite norm: no update on any rank
  float grad_scale = 1.0f;  // unscale and clip in one multiplication, for the update
};

class GradFinalizer {
 public:
  // experts: the layout holds only expert weights (expert parallelism), replicated over the
  // expert-data-parallel group rather than dp.
  GradFinalizer(const FlatLayout& layout, const parallel::ParallelContext& par, double clip_grad,
                bool experts = false);

  // Tied word embedding: sums the first and last stage's gradients (pp > 1). Call after
  // GradSync::finish_layers() and before GradSync::reduce_rest().
  void sum_tied_embeddings(const GradSync& sync);
  // Sums the sequence-parallel LayerNorm gradients over tp within the held range.
  void sum_sequence_parallel_norms(const HeldGrads& held);
  // Sums the replicated parts of partly replicated parameters over their tp subgroups.
  void sum_tp_replicated(const HeldGrads& held);
  // sqrt of the sum of squares over the whole job.
  double global_norm(const core::ExecContext& ctx, const HeldGrads& held);
  // True when any rank holds a gradient above threshold in magnitude or not finite.
  bool any_overflow(const core::ExecContext& ctx, const HeldGrads& held, float threshold);
  // The sums over tp, then the squared norm and the overflow verdict of the held gradients.
  GradShare share(const core::ExecContext& ctx, const HeldGrads& held, const GradScaling& scaling);
  // The norm, the verdict and the update's scale from the parts' shares (summed when several).
  FinalizedGrads finalize(const GradShare& share, const GradScaling& scaling) const;
  // Both at once, for one part.
  FinalizedGrads finalize(const core::ExecContext& ctx, const HeldGrads& held,
                          const GradScaling& scaling) {
    return finalize(share(ctx, held, scaling), scaling);
  }

 private:
  const FlatLayout& layout_;
  const parallel::ParallelContext& par_;
  double clip_grad_;
  // The ranks holding different parts of one replica: those with this rank's dp coordinate (the
  // experts: its expert-data-parallel coordinate).
  std::unique_ptr<comm::Communicator> model_parallel_;
  // tp_replicas -> the subgroup of that many consecutive tp ranks holding this rank's copies.
  std::map<int, std::unique_ptr<comm::Communicator>> replica_groups_;
};

}  // namespace trident::optim
