#include "trident/train/distributed_optimizer.h"

#include <cmath>
#include <cstring>

#include "trident/core/error.h"

namespace trident::train {

DistributedOptimizer::DistributedOptimizer(const RankModel& model,
                                           const parallel::ParallelContext& par,
                                           const optim::AdamWConfig& adamw, FlatBuffers buffers)
    : model_(model), par_(par), adamw_(adamw), buf_(buffers) {
  // The model-parallel group (every tp and pp rank of one data-parallel replica) sums the
  // gradient-norm shares: each parameter element lives on exactly one of its ranks.
  model_parallel_ = par.world().split(par.coord().dp, par.rank(), "mp");
}

void DistributedOptimizer::zero_grads() {
  std::memset(buf_.grads, 0, static_cast<std::size_t>(model_.total_numel()) * sizeof(float));
}

void DistributedOptimizer::reduce_gradients() {
  // Each replica's gradient is already scaled by 1 / (tokens of the global batch), so the sum
  // over data-parallel ranks is the gradient of the global-batch mean loss.
  comm::Communicator& dp = par_.dp();
  if (dp.size() > 1) {
    dp.all_reduce(buf_.grads, model_.total_numel(), comm::Datatype::kF32, comm::ReduceOp::kSum);
  }
}

void DistributedOptimizer::sync_tied_embedding() {
  // The first stage's word embedding and the last stage's tied copy sum their gradients, so
  // both copies take the same update and stay equal (the bug BLOOM's chronicles record).
  if (par_.layout().pp_size == 1 || !par_.in_embedding_group()) return;
  for (const ModelChunk& ch : model_.chunks()) {
    if (!(ch.shard.has_embedding || ch.shard.has_head)) continue;
    const model::ParamSpec& p = ch.table.find("embedding.word_embeddings.weight");
    par_.embedding().all_reduce(buf_.grads + ch.base + p.offset, p.numel, comm::Datatype::kF32,
                                comm::ReduceOp::kSum);
  }
}

void DistributedOptimizer::sync_sequence_parallel_norms() {
  // Under sequence parallelism each tp rank's LayerNorm gradients cover only its rows.
  if (par_.tp().size() == 1) return;
  for (const ModelChunk& ch : model_.chunks()) {
    for (const model::ParamSpec& p : ch.table.params) {
      if (!p.sequence_parallel) continue;
      par_.tp().all_reduce(buf_.grads + ch.base + p.offset, p.numel, comm::Datatype::kF32,
                           comm::ReduceOp::kSum);
    }
  }
}

double DistributedOptimizer::global_grad_norm(const core::ExecContext& ctx) {
  double share = 0;
  for (const ModelChunk& ch : model_.chunks()) {
    share += optim::grad_norm_squared_share(ctx, ch.table, {0, ch.table.total_numel},
                                            buf_.grads + ch.base, model_.tp_rank());
  }
  if (model_parallel_->size() > 1) {
    model_parallel_->all_reduce(&share, 1, comm::Datatype::kF64, comm::ReduceOp::kSum);
  }
  return std::sqrt(share);
}

OptimizerStepResult DistributedOptimizer::step(const core::ExecContext& ctx, double lr,
                                               std::int64_t step) {
  reduce_gradients();
  sync_tied_embedding();
  sync_sequence_parallel_norms();
  OptimizerStepResult r;
  r.grad_norm = global_grad_norm(ctx);
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;  // every rank sees the same norm, so every rank skips
    return r;
  }
  const float coeff = optim::clip_coefficient(r.grad_norm, adamw_.clip_grad);
  for (const ModelChunk& ch : model_.chunks()) {
    optim::adamw_step(ctx, ch.table, adamw_, lr, step, coeff,
                      {.range = {0, ch.table.total_numel},
                       .params = buf_.params + ch.base,
                       .grads = buf_.grads + ch.base,
                       .m = buf_.exp_avg + ch.base,
                       .v = buf_.exp_avg_sq + ch.base});
  }
  return r;
}

std::int64_t DistributedOptimizer::param_bytes() const { return model_.total_numel() * 4; }
std::int64_t DistributedOptimizer::grad_bytes() const { return model_.total_numel() * 4; }
std::int64_t DistributedOptimizer::optimizer_bytes() const { return model_.total_numel() * 8; }

}  // namespace trident::train
