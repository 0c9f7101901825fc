#include "trident/optim/grad_finalize.h"

#include <algorithm>
#include <set>
#include <vector>

#include "trident/core/view.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/overflow.h"
#include "trident/optim/adamw_optimizer.h"

namespace trident::optim {

GradFinalizer::GradFinalizer(const FlatLayout& layout, const parallel::ParallelContext& par,
                             double clip_grad, bool experts)
    : layout_(layout), par_(par), clip_grad_(clip_grad) {
  const int replica = experts ? par.layout().edp_rank(par.coord()) : par.coord().dp;
  model_parallel_ = par.world().split(replica, par.rank(), experts ? "mp-experts" : "mp");
  // Every rank of a tp group has the same tables, so all of them split (collectively) alike.
  std::set<int> replicas;
  for (const LayoutChunk& ch : layout.chunks())
    for (const model::ParamSpec& p : ch.table->params)
      if (p.tp_replicas > 1) replicas.insert(p.tp_replicas);
  const int tp_rank = par.tp().rank();
  for (const int r : replicas)
    replica_groups_[r] = par.tp().split(tp_rank / r, tp_rank, core::str("tp_replicas", r));
}

void GradFinalizer::sum_tied_embeddings(const GradSync& sync) {
  if (par_.layout().pp_size == 1 || !par_.in_embedding_group()) return;
  for (int c = 0; c < static_cast<int>(layout_.chunks().size()); ++c) {
    const model::ParamTable& t = *layout_.chunks()[static_cast<std::size_t>(c)].table;
    // The word embedding and the last stage's copy of it (none with an untied output layer).
    for (const model::ParamSpec& p : t.params) {
      if (!p.tied_embedding) continue;
      const std::int64_t begin = layout_.chunks()[static_cast<std::size_t>(c)].base + p.offset;
      par_.embedding().all_reduce(sync.rest_grad_at(begin), p.numel, comm::Datatype::kF32,
                                  comm::ReduceOp::kSum);
    }
  }
}

void GradFinalizer::sum_sequence_parallel_norms(const HeldGrads& held) {
  // The tp ranks hold the same flat layout, so the held ranges line up across the tp group.
  if (par_.tp().size() == 1) return;
  for (const ParamPiece& p : layout_.pieces(held.grads.range)) {
    if (!p.spec->sequence_parallel) continue;
    par_.tp().all_reduce(held.grads.data + (p.flat_begin - held.grads.range.begin), p.end - p.begin,
                         comm::Datatype::kF32, comm::ReduceOp::kSum);
  }
}

void GradFinalizer::sum_tp_replicated(const HeldGrads& held) {
  // Like the LayerNorm sums: the subgroup's ranks hold the same flat layout and held range.
  if (replica_groups_.empty()) return;
  for (const ParamPiece& p : layout_.pieces(held.grads.range)) {
    if (p.spec->tp_replicas <= 1) continue;
    const std::int64_t lo = std::max(p.begin, p.spec->replicated_begin());
    if (lo >= p.end) continue;
    replica_groups_.at(p.spec->tp_replicas)
        ->all_reduce(held.grads.data + (p.flat_begin + (lo - p.begin) - held.grads.range.begin),
                     p.end - lo, comm::Datatype::kF32, comm::ReduceOp::kSum);
  }
}

double GradFinalizer::global_norm(const core::ExecContext& ctx, const HeldGrads& held) {
  const Range r = {held.grads.range.begin, std::min(held.grads.range.end, layout_.numel())};
  // Every chunk's ranges in one sum (in the order the per-chunk sums added them): one host read.
  std::vector<kernels::SumSquaresViews> ranges;
  for (const LayoutChunk& ch : layout_.chunks()) {
    const std::int64_t lo = std::max(r.begin, ch.base);
    const std::int64_t hi = std::min(r.end, ch.base + ch.table->total_numel);
    if (lo >= hi) continue;
    append_grad_norm_ranges(ctx, *ch.table, {lo - ch.base, hi - ch.base},
                            held.grads.data + (lo - held.grads.range.begin), layout_.tp_rank(),
                            ranges);
  }
  double share = kernels::sum_squares(ctx, ranges);
  // Disjoint shards: the whole world's shares; whole replicas: the model-parallel group's.
  comm::Communicator& group = held.disjoint_over_dp ? par_.world() : *model_parallel_;
  if (group.size() > 1) group.all_reduce(&share, 1, comm::Datatype::kF64, comm::ReduceOp::kSum);
  return std::sqrt(share);
}

bool GradFinalizer::any_overflow(const core::ExecContext& ctx, const HeldGrads& held,
                                 float threshold) {
  std::int64_t bad = kernels::overflow_count(
      ctx, {.x = core::view(held.grads.data, {held.grads.range.size()}, ctx.device),
            .threshold = threshold});
  par_.world().all_reduce(&bad, 1, comm::Datatype::kI64, comm::ReduceOp::kSum);
  return bad > 0;
}

GradShare GradFinalizer::share(const core::ExecContext& ctx, const HeldGrads& held,
                               const GradScaling& scaling) {
  sum_sequence_parallel_norms(held);
  sum_tp_replicated(held);
  GradShare s;
  const double norm = global_norm(ctx, held);
  s.norm_sq = norm * norm;
  s.overflow = std::isfinite(scaling.overflow_threshold)
                   ? any_overflow(ctx, held, scaling.overflow_threshold)
                   : !std::isfinite(norm);
  return s;
}

FinalizedGrads GradFinalizer::finalize(const GradShare& share, const GradScaling& scaling) const {
  FinalizedGrads f;
  f.grad_norm = std::sqrt(share.norm_sq) / scaling.loss_scale;
  if (share.overflow || !std::isfinite(f.grad_norm)) {
    f.skipped = true;  // every rank sees the same verdict, so every rank skips
    return f;
  }
  f.grad_scale = static_cast<float>(clip_coefficient(f.grad_norm, clip_grad_) / scaling.loss_scale);
  return f;
}

}  // namespace trident::optim
