#include "trident/optim/distributed_adamw.h"

#include <algorithm>

#include "trident/core/error.h"

namespace trident::optim {

DistributedAdamW::DistributedAdamW(ParamGradBuffers& buffers, comm::Communicator& dp,
                                   CommCounters& counters, const AdamWConfig& cfg,
                                   OffloadStore* store, int param_array, int moment_array)
    : buf_(buffers),
      dp_(dp),
      counters_(counters),
      cfg_(cfg),
      store_(store),
      param_array_(param_array),
      moment_array_(moment_array) {
  range_ =
      buffers.policy().shards_optimizer() ? buffers.shard() : Range{0, buffers.layout().numel()};
  const std::int64_t n = buffers.sizes().moment;
  TRIDENT_ASSERT(n == range_.size(), "moment size ", n, " for a range of ", range_.size());
  TRIDENT_ASSERT(store_ == nullptr || store_->size() == n, "offload store of ",
                 store_ ? store_->size() : 0, " elements for a range of ", n);
  TRIDENT_ASSERT(param_array_ < 0 || buffers.master() == nullptr,
                 "offloaded weights must not be in memory too");
  if (moment_array_ >= 0) {
    // Zeros, like the Arena's moments; read and written by the streamed update.
    m_ = store_->mapped(moment_array_);
    v_ = store_->mapped(moment_array_ + 1);
    return;
  }
  moments_ =
      core::Arena(2 * core::Arena::footprint(core::DType::kF32, {n}), buffers.memory_resource());
  if (n > 0) {
    m_ = moments_.alloc(core::DType::kF32, {n}).as<float>();
    v_ = moments_.alloc(core::DType::kF32, {n}).as<float>();
  }
}

Range DistributedAdamW::stored() const {
  return {range_.begin, std::min(range_.end, buf_.layout().numel())};
}

void DistributedAdamW::update(const core::ExecContext& ctx, double lr, std::int64_t step,
                              float grad_scale, const float* grads, std::int64_t first,
                              std::int64_t last, float* p, float* m, float* v) {
  const Range part{range_.begin + first, range_.begin + last};
  for (const LayoutChunk& ch : buf_.layout().chunks()) {
    const std::int64_t lo = std::max(part.begin, ch.base);
    const std::int64_t hi = std::min(part.end, ch.base + ch.table->total_numel);
    if (lo >= hi) continue;
    const std::int64_t at = lo - range_.begin;
    adamw_step(ctx, *ch.table, cfg_, lr, step, grad_scale,
               {.range = {lo - ch.base, hi - ch.base},
                .params = p + (lo - part.begin),
                .grads = grads + at,
                .m = m + (lo - part.begin),
                .v = v + (lo - part.begin)});
  }
}

void DistributedAdamW::step(const core::ExecContext& ctx, double lr, std::int64_t step,
                            float grad_scale, const float* grads) {
  if (store_ != nullptr) {
    store_->stream([&](std::int64_t lo, std::int64_t hi, float* const* d) {
      float* p = param_array_ >= 0 ? d[param_array_] : buf_.master_weights(range_).data + lo;
      float* m = moment_array_ >= 0 ? d[moment_array_] : m_ + lo;
      float* v = moment_array_ >= 0 ? d[moment_array_ + 1] : v_ + lo;
      update(ctx, lr, step, grad_scale, grads, lo, hi, p, m, v);
    });
  } else {
    update(ctx, lr, step, grad_scale, grads, 0, range_.size(), buf_.master_weights(range_).data, m_,
           v_);
  }
  if (buf_.policy().gathers_updated_parameters() && dp_.size() > 1) {
    // Every rank updated its shard: gather the whole updated weights.
    const parallel::ShardPlan& plan = buf_.plan();
    counters_.account(comm::OpKind::kAllGather, plan.numel_padded, dp_.size());
    dp_.all_gather(buf_.full_params() + range_.begin, buf_.full_params(), plan.shard_size,
                   comm::Datatype::kF32);
  }
}

}  // namespace trident::optim
