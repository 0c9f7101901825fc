#include "trident/train/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "trident/core/error.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/elementwise.h"

namespace trident::train {

namespace {

using parallel::Range;
constexpr std::int64_t kShardAlign = 16;  // 64 bytes of FP32: shards start on a cache line

std::int64_t aligned(std::int64_t n) {
  return (n + model::ParamTable::kAlign - 1) / model::ParamTable::kAlign *
         model::ParamTable::kAlign;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(const RankModel& model, const parallel::ParallelContext& par,
                             const optim::AdamWConfig& adamw, const ZeroConfig& zero)
    : model_(model), par_(par), adamw_(adamw), zero_(zero) {
  TRIDENT_CHECK(zero.stage >= 0 && zero.stage <= 3, "--zero-stage must be 0, 1, 2 or 3, got ",
                zero.stage);
  const int dp = par.dp().size();
  plan_ = parallel::build_shard_plan(model.total_numel(), dp, kShardAlign);
  model_parallel_ = par.world().split(par.coord().dp, par.rank(), "mp");
  build_units();

  const std::int64_t N = model.total_numel(), Np = plan_.numel_padded, S = plan_.shard_size;
  const auto bytes = [](std::int64_t n) { return core::Arena::footprint(core::DType::kF32, {n}); };
  const int st = zero.stage;
  params_arena_ = core::Arena(st < 3 ? bytes(Np) : bytes(S) + bytes(rest_numel_));
  grads_arena_ = core::Arena(st < 2 ? bytes(Np) : bytes(S) + bytes(rest_numel_));
  moments_arena_ = core::Arena(2 * (st == 0 ? bytes(N) : bytes(S)));
  // Stages 2-3: one layer-gradient staging buffer, the received piece of a reduce-scatter (at
  // most a shard), and (stage 3) two layer-parameter staging buffers.
  staging_arena_ =
      core::Arena(st < 2 ? 0 : bytes(max_unit_) + bytes(S) + (st == 3 ? 2 * bytes(max_unit_) : 0));
  auto take = [](core::Arena& a, std::int64_t n) {
    return a.alloc(core::DType::kF32, {n}).as<float>();
  };
  if (st < 3) {
    full_params_ = take(params_arena_, Np);
  } else {
    master_ = take(params_arena_, S);
    rest_params_ = take(params_arena_, rest_numel_);
  }
  if (st < 2) {
    full_grads_ = take(grads_arena_, Np);
  } else {
    grad_shard_ = take(grads_arena_, S);
    rest_grads_ = take(grads_arena_, rest_numel_);
    grad_slot_ = take(staging_arena_, max_unit_);
    rs_tmp_ = take(staging_arena_, S);
    if (st == 3) {
      param_slots_[0] = take(staging_arena_, max_unit_);
      param_slots_[1] = take(staging_arena_, max_unit_);
    }
  }
  if (zero.bf16) {
    // BF16 copies of what the matmuls read: every weight (stages 0-2), or the gathered
    // embedding/head weights and the two staged layers (stage 3).
    const auto b16 = [](std::int64_t n) { return core::Arena::footprint(core::DType::kBF16, {n}); };
    bf16_arena_ = core::Arena(st < 3 ? b16(N) : b16(rest_numel_) + 2 * b16(max_unit_));
    params_bf16_ =
        bf16_arena_.alloc(core::DType::kBF16, {st < 3 ? N : rest_numel_}).as<core::bf16>();
    if (st == 3) {
      bf16_slots_[0] = bf16_arena_.alloc(core::DType::kBF16, {max_unit_}).as<core::bf16>();
      bf16_slots_[1] = bf16_arena_.alloc(core::DType::kBF16, {max_unit_}).as<core::bf16>();
    }
  }
  exp_avg_ = take(moments_arena_, st == 0 ? N : S);
  exp_avg_sq_ = take(moments_arena_, st == 0 ? N : S);
  build_views();
}

void ZeroOptimizer::build_units() {
  std::int64_t compact = 0;
  for (int c = 0; c < static_cast<int>(model_.chunks().size()); ++c) {
    const ModelChunk& ch = model_.chunks()[static_cast<std::size_t>(c)];
    const std::int64_t first_unit = static_cast<std::int64_t>(units_.size());
    for (const model::ParamSpec& p : ch.table.params) {
      const Range r{ch.base + p.offset, ch.base + p.offset + aligned(p.numel)};
      if (p.layer < 0) {
        if (!rest_.empty() && rest_.back().end == r.begin) {
          rest_.back().end = r.end;
        } else {
          rest_.push_back(r);
        }
        continue;
      }
      const std::int64_t local = p.layer - ch.shard.first_layer;
      if (units_.size() == static_cast<std::size_t>(first_unit + local)) {
        units_.push_back({c, local, r});
      } else {
        Unit& u = units_.back();
        TRIDENT_ASSERT(u.layer == local && u.range.end == r.begin, "layer ", p.layer,
                       " parameters are not contiguous");
        u.range.end = r.end;
      }
    }
    // Buckets (stages 0-1): consecutive layers of this chunk, in backward order.
    const std::int64_t last_unit = static_cast<std::int64_t>(units_.size());
    if (last_unit > first_unit) {
      const std::int64_t lo = units_[static_cast<std::size_t>(first_unit)].range.begin;
      const std::int64_t hi = units_.back().range.end;
      std::vector<std::int64_t> cuts;
      for (std::int64_t u = first_unit; u < last_unit; ++u) {
        cuts.push_back(units_[static_cast<std::size_t>(u)].range.end - lo);
      }
      for (const Range& b : parallel::build_buckets(cuts, hi - lo, zero_.bucket_size)) {
        buckets_.push_back({lo + b.begin, lo + b.end});
      }
    }
  }
  for (const Range& r : rest_) compact += r.size();
  rest_numel_ = compact;
  for (const Unit& u : units_) max_unit_ = std::max(max_unit_, u.range.size());
  max_unit_ = std::max<std::int64_t>(max_unit_, 1);
  bucket_done_.assign(buckets_.size(), false);
}

namespace {
// Offset of flat index i inside the concatenation of `rest` ranges, or -1.
std::int64_t compact_index(const std::vector<Range>& rest, std::int64_t i) {
  std::int64_t c = 0;
  for (const Range& r : rest) {
    if (i >= r.begin && i < r.end) return c + (i - r.begin);
    c += r.size();
  }
  return -1;
}
}  // namespace

void ZeroOptimizer::build_views() {
  views_.params.clear();
  views_.grads.clear();
  views_.params_bf16.clear();
  if (params_bf16_) {
    for (const ModelChunk& ch : model_.chunks()) {
      if (zero_.stage < 3) {
        views_.params_bf16.push_back(
            model::gpt_param_views_bf16(model_.config(), ch.table, params_bf16_ + ch.base));
      } else {
        const std::int64_t base = ch.base;
        views_.params_bf16.push_back(model::gpt_param_views_bf16(
            model_.config(), ch.table, [&](std::int64_t offset) -> const core::bf16* {
              const std::int64_t c = compact_index(rest_, base + offset);
              return c >= 0 ? params_bf16_ + c : nullptr;
            }));
      }
    }
  }
  for (const ModelChunk& ch : model_.chunks()) {
    const std::int64_t base = ch.base;
    if (zero_.stage < 3) {
      views_.params.push_back(
          model_.params(static_cast<int>(&ch - model_.chunks().data()), full_params_));
    } else {
      // Embedding and head parameters live (gathered) in the compact rest buffer; layer
      // parameters are pointed at a staging slot by the hooks.
      views_.params.push_back(model::gpt_param_views(
          model_.config(), ch.table, [&](std::int64_t offset) -> const float* {
            const std::int64_t c = compact_index(rest_, base + offset);
            return c >= 0 ? rest_params_ + c : nullptr;
          }));
    }
    if (zero_.stage < 2) {
      views_.grads.push_back(
          model_.grads(static_cast<int>(&ch - model_.chunks().data()), full_grads_));
    } else {
      views_.grads.push_back(
          model::gpt_grad_views(model_.config(), ch.table, [&](std::int64_t offset) -> float* {
            const std::int64_t c = compact_index(rest_, base + offset);
            return c >= 0 ? rest_grads_ + c : nullptr;
          }));
    }
  }
}

int ZeroOptimizer::unit_of(int chunk, std::int64_t layer) const {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].chunk == chunk && units_[u].layer == layer) return static_cast<int>(u);
  }
  return -1;
}

void ZeroOptimizer::point_layer_params(int chunk, std::int64_t layer, float* base) {
  const ModelChunk& ch = model_.chunks()[static_cast<std::size_t>(chunk)];
  const Unit& u = units_[static_cast<std::size_t>(unit_of(chunk, layer))];
  // The layer's tensors at their offsets relative to the unit's start.
  const model::GptParams v =
      model::gpt_param_views(model_.config(), ch.table, [&](std::int64_t offset) -> const float* {
        const std::int64_t i = ch.base + offset;
        return i >= u.range.begin && i < u.range.end ? base + (i - u.range.begin) : nullptr;
      });
  views_.params[static_cast<std::size_t>(chunk)].layers[static_cast<std::size_t>(layer)] =
      v.layers[static_cast<std::size_t>(layer)];
}

void ZeroOptimizer::point_layer_grads(int chunk, std::int64_t layer, float* base) {
  const ModelChunk& ch = model_.chunks()[static_cast<std::size_t>(chunk)];
  const Unit& u = units_[static_cast<std::size_t>(unit_of(chunk, layer))];
  const model::GptGrads v =
      model::gpt_grad_views(model_.config(), ch.table, [&](std::int64_t offset) -> float* {
        const std::int64_t i = ch.base + offset;
        return i >= u.range.begin && i < u.range.end ? base + (i - u.range.begin) : nullptr;
      });
  views_.grads[static_cast<std::size_t>(chunk)].layers[static_cast<std::size_t>(layer)] =
      v.layers[static_cast<std::size_t>(layer)];
}

void ZeroOptimizer::account(comm::OpKind kind, std::int64_t elements) {
  const int dp = plan_.dp;
  if (dp == 1) return;
  const double share = static_cast<double>(dp - 1) / dp * static_cast<double>(elements) * 4.0;
  comm_.dp_bytes += kind == comm::OpKind::kAllReduce ? 2.0 * share : share;
}

void ZeroOptimizer::gather_unit_into(const Unit& u, float* dst, bool async) {
  // Stage 3: every rank contributes its piece of the layer from its master shard.
  const Range mine = plan_.owned(u.range, par_.dp().rank());
  const auto counts = plan_.split(u.range);
  const float* in = master_ + (mine.begin - plan_.shard(par_.dp().rank()).begin);
  account(comm::OpKind::kAllGather, u.range.size());
  const int slot = dst == param_slots_[0] ? 0 : 1;
  if (async) {
    slot_request_[slot] = par_.dp().iall_gather_v(in, dst, counts, comm::Datatype::kF32);
  } else {
    par_.dp().all_gather_v(in, dst, counts, comm::Datatype::kF32);
  }
}

void ZeroOptimizer::on_before_pass(int chunk, std::int64_t layer, bool forward) {
  const int u = unit_of(chunk, layer);
  if (u < 0) return;  // embedding or head
  const int slot = static_cast<int>(layer % 2);
  if (slot_unit_[slot] == u) {
    slot_request_[slot].wait();  // prefetched
  } else {
    slot_request_[slot].wait();
    gather_unit_into(units_[static_cast<std::size_t>(u)], param_slots_[slot], false);
    slot_unit_[slot] = u;
  }
  point_layer_params(chunk, layer, param_slots_[slot]);
  if (params_bf16_) {
    // The staged layer's BF16 copy for the matmuls.
    const Unit& unit = units_[static_cast<std::size_t>(u)];
    kernels::convert_f32_to_bf16(core::ExecContext{}, bf16_slots_[slot], param_slots_[slot],
                                 unit.range.size());
    const ModelChunk& ch = model_.chunks()[static_cast<std::size_t>(chunk)];
    const core::bf16* b = bf16_slots_[slot];
    const model::GptParamsBf16 v = model::gpt_param_views_bf16(
        model_.config(), ch.table, [&](std::int64_t offset) -> const core::bf16* {
          const std::int64_t i = ch.base + offset;
          return i >= unit.range.begin && i < unit.range.end ? b + (i - unit.range.begin) : nullptr;
        });
    views_.params_bf16[static_cast<std::size_t>(chunk)].layers[static_cast<std::size_t>(layer)] =
        v.layers[static_cast<std::size_t>(layer)];
  }
  // Prefetch the layer the pass visits next into the other slot.
  const std::int64_t next = forward ? layer + 1 : layer - 1;
  const int nu = unit_of(chunk, next);
  const int other = 1 - slot;
  if (nu >= 0 && slot_unit_[other] != nu) {
    slot_request_[other].wait();
    gather_unit_into(units_[static_cast<std::size_t>(nu)], param_slots_[other], true);
    slot_unit_[other] = nu;
  }
}

void ZeroOptimizer::on_after_backward(int chunk, std::int64_t layer) {
  const int u = unit_of(chunk, layer);
  if (u < 0) return;
  const Unit& unit = units_[static_cast<std::size_t>(u)];
  comm::Communicator& dp = par_.dp();
  if (zero_.stage >= 2) {
    // This micro-batch's gradient of the layer: reduce-scatter it and keep only this rank's
    // piece, accumulated across micro-batches.
    const Range mine = plan_.owned(unit.range, dp.rank());
    const auto counts = plan_.split(unit.range);
    account(comm::OpKind::kReduceScatter, unit.range.size());
    if (dp.size() > 1) {
      dp.reduce_scatter_v(grad_slot_, rs_tmp_, counts, comm::Datatype::kF32, comm::ReduceOp::kSum);
    } else {
      std::memcpy(rs_tmp_, grad_slot_, static_cast<std::size_t>(unit.range.size()) * sizeof(float));
    }
    float* acc = grad_shard_ + (mine.begin - plan_.shard(dp.rank()).begin);
    for (std::int64_t i = 0; i < mine.size(); ++i) acc[i] += rs_tmp_[i];
    return;
  }
  if (!last_backward_) return;
  // Stages 0-1: launch every bucket whose layers are now all final.
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Range& r = buckets_[b];
    if (bucket_done_[b] || unit.range.begin != r.begin) continue;
    bucket_done_[b] = true;
    float* g = full_grads_ + r.begin;
    if (dp.size() == 1) continue;
    if (zero_.stage == 0) {
      account(comm::OpKind::kAllReduce, r.size());
      pending_.push_back(dp.iall_reduce(g, r.size(), comm::Datatype::kF32, comm::ReduceOp::kSum));
    } else {
      // In place: this rank's piece of the bucket is its block of the bucket.
      const Range mine = plan_.owned(r, dp.rank());
      account(comm::OpKind::kReduceScatter, r.size());
      pending_.push_back(dp.ireduce_scatter_v(g, full_grads_ + mine.begin, plan_.split(r),
                                              comm::Datatype::kF32, comm::ReduceOp::kSum));
    }
  }
  for (comm::Request& r : pending_) r.test();  // let MPI progress while backward goes on
}

void ZeroOptimizer::install_hooks(std::vector<model::ModelRuntime>& runtimes) {
  for (int c = 0; c < static_cast<int>(runtimes.size()); ++c) {
    model::ModelRuntime& rt = runtimes[static_cast<std::size_t>(c)];
    if (zero_.stage == 3) {
      rt.before_forward = [this, c](std::int64_t l) { on_before_pass(c, l, true); };
    }
    rt.before_backward = [this, c](std::int64_t l) {
      if (zero_.stage == 3) on_before_pass(c, l, false);
      if (zero_.stage >= 2 && unit_of(c, l) >= 0) {
        std::memset(grad_slot_, 0, static_cast<std::size_t>(max_unit_) * sizeof(float));
        point_layer_grads(c, l, grad_slot_);
      }
    };
    rt.after_backward = [this, c](std::int64_t l) { on_after_backward(c, l); };
    if (params_bf16_) rt.params_bf16 = &views_.params_bf16[static_cast<std::size_t>(c)];
  }
}

void ZeroOptimizer::init_params(std::uint64_t seed) {
  if (zero_.stage < 3) {
    model_.init(seed, full_params_);
    return;
  }
  std::vector<float> full(static_cast<std::size_t>(plan_.numel_padded), 0.0f);
  model_.init(seed, full.data());
  const Range s = plan_.shard(par_.dp().rank());
  std::copy(full.begin() + s.begin, full.begin() + s.end, master_);
}

void ZeroOptimizer::refresh_bf16(const core::ExecContext& ctx) {
  // Stage 3 converts when it gathers (begin_iteration, on_before_pass).
  if (params_bf16_ && zero_.stage < 3) {
    kernels::convert_f32_to_bf16(ctx, params_bf16_, full_params_, model_.total_numel());
  }
}

void ZeroOptimizer::begin_iteration() {
  if (zero_.stage < 2) {
    std::memset(full_grads_, 0, static_cast<std::size_t>(plan_.numel_padded) * sizeof(float));
  } else {
    std::memset(grad_shard_, 0, static_cast<std::size_t>(plan_.shard_size) * sizeof(float));
    std::memset(rest_grads_, 0, static_cast<std::size_t>(rest_numel_) * sizeof(float));
  }
  std::fill(bucket_done_.begin(), bucket_done_.end(), false);
  if (zero_.stage == 3) {
    // Embedding and head parameters: gathered once for the whole iteration.
    std::int64_t c = 0;
    const Range shard = plan_.shard(par_.dp().rank());
    for (const Range& r : rest_) {
      const Range mine = plan_.owned(r, par_.dp().rank());
      account(comm::OpKind::kAllGather, r.size());
      par_.dp().all_gather_v(master_ + (mine.begin - shard.begin), rest_params_ + c, plan_.split(r),
                             comm::Datatype::kF32);
      c += r.size();
    }
    if (params_bf16_) {
      kernels::convert_f32_to_bf16(core::ExecContext{}, params_bf16_, rest_params_, rest_numel_);
    }
    slot_unit_[0] = slot_unit_[1] = -1;
  }
}

void ZeroOptimizer::begin_backward(int /*chunk*/, bool last_of_iteration) {
  last_backward_ = last_of_iteration;
}

void ZeroOptimizer::reduce_rest_and_sync() {
  comm::Communicator& dp = par_.dp();
  const Range shard = plan_.shard(dp.rank());
  // Layers never reported (stages 0-1): reduce them now.
  if (zero_.stage < 2) {
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (bucket_done_[b] || dp.size() == 1) continue;
      const Range& r = buckets_[b];
      if (zero_.stage == 0) {
        account(comm::OpKind::kAllReduce, r.size());
        dp.all_reduce(full_grads_ + r.begin, r.size(), comm::Datatype::kF32, comm::ReduceOp::kSum);
      } else {
        account(comm::OpKind::kReduceScatter, r.size());
        dp.reduce_scatter_v(full_grads_ + r.begin, full_grads_ + plan_.owned(r, dp.rank()).begin,
                            plan_.split(r), comm::Datatype::kF32, comm::ReduceOp::kSum);
      }
    }
  }
  for (comm::Request& r : pending_) r.wait();
  pending_.clear();

  // The tied word embedding: the first stage's copy and the last stage's sum their gradients
  // (before the data-parallel reduction, while the rest gradients are still whole).
  auto rest_ptr = [&](std::int64_t flat) {
    return zero_.stage < 2 ? full_grads_ + flat : rest_grads_ + compact_index(rest_, flat);
  };
  if (par_.layout().pp_size > 1 && par_.in_embedding_group()) {
    for (const ModelChunk& ch : model_.chunks()) {
      if (!(ch.shard.has_embedding || ch.shard.has_head)) continue;
      const model::ParamSpec& p = ch.table.find("embedding.word_embeddings.weight");
      par_.embedding().all_reduce(rest_ptr(ch.base + p.offset), p.numel, comm::Datatype::kF32,
                                  comm::ReduceOp::kSum);
    }
  }
  // Embedding and head gradients across data-parallel replicas.
  if (dp.size() > 1 || zero_.stage >= 2) {
    for (const Range& r : rest_) {
      const Range mine = plan_.owned(r, dp.rank());
      switch (zero_.stage) {
        case 0:
          account(comm::OpKind::kAllReduce, r.size());
          dp.all_reduce(full_grads_ + r.begin, r.size(), comm::Datatype::kF32,
                        comm::ReduceOp::kSum);
          break;
        case 1:
          account(comm::OpKind::kReduceScatter, r.size());
          dp.reduce_scatter_v(full_grads_ + r.begin, full_grads_ + mine.begin, plan_.split(r),
                              comm::Datatype::kF32, comm::ReduceOp::kSum);
          break;
        default: {
          account(comm::OpKind::kReduceScatter, r.size());
          float* in = rest_ptr(r.begin);
          if (dp.size() > 1) {
            dp.reduce_scatter_v(in, rs_tmp_, plan_.split(r), comm::Datatype::kF32,
                                comm::ReduceOp::kSum);
          } else {
            std::memcpy(rs_tmp_, in, static_cast<std::size_t>(r.size()) * sizeof(float));
          }
          float* acc = grad_shard_ + (mine.begin - shard.begin);
          const float* got = rs_tmp_;
          for (std::int64_t i = 0; i < mine.size(); ++i) acc[i] += got[i];
        }
      }
    }
  }
}

void ZeroOptimizer::sync_sequence_parallel_norms(float* grads, Range held) {
  // Under sequence parallelism each tp rank's LayerNorm gradients cover only its token rows; the
  // tp ranks hold the same flat layout, so the held ranges line up across the tp group.
  if (par_.tp().size() == 1) return;
  for (const ModelChunk& ch : model_.chunks()) {
    for (const model::ParamSpec& p : ch.table.params) {
      if (!p.sequence_parallel) continue;
      const std::int64_t lo = std::max(held.begin, ch.base + p.offset);
      const std::int64_t hi = std::min(held.end, ch.base + p.offset + p.numel);
      if (lo < hi) {
        par_.tp().all_reduce(grads + (lo - held.begin), hi - lo, comm::Datatype::kF32,
                             comm::ReduceOp::kSum);
      }
    }
  }
}

double ZeroOptimizer::global_grad_norm(const core::ExecContext& ctx) {
  // Stage 0: every dp replica holds the whole gradient, so the shares of the model-parallel
  // group are summed; stages 1-3: each rank holds a disjoint shard, so the whole world's.
  const Range held =
      zero_.stage == 0 ? Range{0, model_.total_numel()} : plan_.shard(par_.dp().rank());
  const float* g = zero_.stage == 0   ? full_grads_
                   : zero_.stage == 1 ? full_grads_ + held.begin
                                      : grad_shard_;
  double share = 0;
  for (const ModelChunk& ch : model_.chunks()) {
    const std::int64_t lo = std::max(held.begin, ch.base);
    const std::int64_t hi = std::min(held.end, ch.base + ch.table.total_numel);
    if (lo >= hi) continue;
    share += optim::grad_norm_squared_share(ctx, ch.table, {lo - ch.base, hi - ch.base},
                                            g + (lo - held.begin), model_.tp_rank());
  }
  comm::Communicator& group = zero_.stage == 0 ? *model_parallel_ : par_.world();
  if (group.size() > 1) group.all_reduce(&share, 1, comm::Datatype::kF64, comm::ReduceOp::kSum);
  return std::sqrt(share);
}

bool ZeroOptimizer::any_overflow(float threshold) {
  // Over the gradients this rank holds after the reduction, then over the whole job.
  const Range held =
      zero_.stage == 0 ? Range{0, model_.total_numel()} : plan_.shard(par_.dp().rank());
  const float* g = zero_.stage == 0   ? full_grads_
                   : zero_.stage == 1 ? full_grads_ + held.begin
                                      : grad_shard_;
  std::int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (std::int64_t i = 0; i < held.size(); ++i) {
    const float x = g[i];
    if (!(std::abs(x) <= threshold)) ++bad;  // NaN compares false
  }
  par_.world().all_reduce(&bad, 1, comm::Datatype::kI64, comm::ReduceOp::kSum);
  return bad > 0;
}

OptimizerStepResult ZeroOptimizer::step(const core::ExecContext& ctx, double lr, std::int64_t step,
                                        const GradScaling& scaling) {
  reduce_rest_and_sync();
  const Range shard = plan_.shard(par_.dp().rank());
  if (zero_.stage == 0) {
    sync_sequence_parallel_norms(full_grads_, {0, model_.total_numel()});
  } else {
    sync_sequence_parallel_norms(zero_.stage == 1 ? full_grads_ + shard.begin : grad_shard_, shard);
  }
  OptimizerStepResult r;
  r.grad_norm = global_grad_norm(ctx) / scaling.loss_scale;
  const bool overflow = std::isfinite(scaling.overflow_threshold)
                            ? any_overflow(scaling.overflow_threshold)
                            : !std::isfinite(r.grad_norm);
  if (overflow || !std::isfinite(r.grad_norm)) {
    r.skipped = true;  // every rank sees the same verdict, so every rank skips
    return r;
  }
  // Unscale and clip in one multiplication.
  const float coeff = static_cast<float>(optim::clip_coefficient(r.grad_norm, adamw_.clip_grad) /
                                         scaling.loss_scale);
  const Range held = zero_.stage == 0 ? Range{0, model_.total_numel()} : shard;
  for (const ModelChunk& ch : model_.chunks()) {
    const std::int64_t lo = std::max(held.begin, ch.base);
    const std::int64_t hi = std::min(held.end, ch.base + ch.table.total_numel);
    if (lo >= hi) continue;
    const std::int64_t at = lo - held.begin;  // index into shard-sized buffers
    float* params = zero_.stage < 3 ? full_params_ + lo : master_ + at;
    const float* grads = zero_.stage < 2 ? full_grads_ + lo : grad_shard_ + at;
    optim::adamw_step(ctx, ch.table, adamw_, lr, step, coeff,
                      {.range = {lo - ch.base, hi - ch.base},
                       .params = params,
                       .grads = grads,
                       .m = exp_avg_ + at,
                       .v = exp_avg_sq_ + at});
  }
  if ((zero_.stage == 1 || zero_.stage == 2) && plan_.dp > 1) {
    // Every rank updated its shard: gather the whole updated parameters.
    account(comm::OpKind::kAllGather, plan_.numel_padded);
    par_.dp().all_gather(full_params_ + shard.begin, full_params_, plan_.shard_size,
                         comm::Datatype::kF32);
  }
  refresh_bf16(ctx);
  return r;
}

MemoryReport ZeroOptimizer::memory() const {
  MemoryReport m;
  const std::int64_t rest_bytes = core::Arena::footprint(core::DType::kF32, {rest_numel_});
  m.param_bytes =
      params_arena_.capacity() - (zero_.stage == 3 ? rest_bytes : 0) + bf16_arena_.capacity();
  m.grad_bytes = grads_arena_.capacity() - (zero_.stage >= 2 ? rest_bytes : 0);
  m.optimizer_bytes = moments_arena_.capacity();
  m.staging_bytes = staging_arena_.capacity() + (zero_.stage >= 2 ? rest_bytes : 0) +
                    (zero_.stage == 3 ? rest_bytes : 0);
  const double psi = static_cast<double>(model_.total_numel()), dp = plan_.dp;
  switch (zero_.stage) {
    case 0:
      m.predicted_param_bytes = static_cast<std::int64_t>(4 * psi);
      m.predicted_grad_bytes = static_cast<std::int64_t>(4 * psi);
      m.predicted_optimizer_bytes = static_cast<std::int64_t>(8 * psi);
      break;
    case 1:
      m.predicted_param_bytes = static_cast<std::int64_t>(4 * psi);
      m.predicted_grad_bytes = static_cast<std::int64_t>(4 * psi);
      m.predicted_optimizer_bytes = static_cast<std::int64_t>(8 * psi / dp);
      break;
    case 2:
      m.predicted_param_bytes = static_cast<std::int64_t>(4 * psi);
      m.predicted_grad_bytes = static_cast<std::int64_t>(4 * psi / dp);
      m.predicted_optimizer_bytes = static_cast<std::int64_t>(8 * psi / dp);
      break;
    default:
      m.predicted_param_bytes = static_cast<std::int64_t>(4 * psi / dp);
      m.predicted_grad_bytes = static_cast<std::int64_t>(4 * psi / dp);
      m.predicted_optimizer_bytes = static_cast<std::int64_t>(8 * psi / dp);
  }
  return m;
}

ZeroOptimizer::TensorSlice ZeroOptimizer::params_slice() {
  if (zero_.stage < 3) return {full_params_, {0, model_.total_numel()}};
  const Range s = plan_.shard(par_.dp().rank());
  return {master_, {s.begin, std::min(s.end, model_.total_numel())}};
}

ZeroOptimizer::TensorSlice ZeroOptimizer::exp_avg_slice() {
  if (zero_.stage == 0) return {exp_avg_, {0, model_.total_numel()}};
  const Range s = plan_.shard(par_.dp().rank());
  return {exp_avg_, {s.begin, std::min(s.end, model_.total_numel())}};
}

ZeroOptimizer::TensorSlice ZeroOptimizer::exp_avg_sq_slice() {
  TensorSlice t = exp_avg_slice();
  t.data = exp_avg_sq_;
  return t;
}

}  // namespace trident::train
