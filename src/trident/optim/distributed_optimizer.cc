#include "trident/optim/distributed_optimizer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "trident/core/error.h"

namespace trident::optim {

DistributedOptimizer::DistributedOptimizer(ParamGradBuffers& buffers, comm::Communicator& dp,
                                           CommCounters& counters, const OptimizerConfig& cfg,
                                           OffloadStore* store, int param_array, int state_array,
                                           const core::ExecContext& ctx, OffloadDevice offload,
                                           std::int64_t window_bytes)
    : buf_(buffers),
      dp_(dp),
      counters_(counters),
      rule_(make_update_rule(cfg)),
      store_(store),
      param_array_(param_array),
      state_array_(state_array) {
  range_ =
      buffers.policy().shards_optimizer() ? buffers.shard() : Range{0, buffers.layout().numel()};
  const std::int64_t n = buffers.sizes().state;
  const auto arrays = static_cast<std::int64_t>(rule_->state_arrays().size());
  TRIDENT_ASSERT(n == range_.size(), "state size ", n, " for a range of ", range_.size());
  TRIDENT_ASSERT(store_ == nullptr || store_->size() == n, "offload store of ",
                 store_ ? store_->size() : 0, " elements for a range of ", n);
  TRIDENT_ASSERT(param_array_ < 0 || buffers.master() == nullptr,
                 "offloaded weights must not be in memory too");
  on_host_ = ctx.device.kind == core::DeviceKind::kCuda && offload != OffloadDevice::kNone;
  TRIDENT_CHECK(!on_host_ || param_array_ < 0,
                "--offload-params with --device cuda: the ZeRO-3 gather reads the offloaded "
                "weights on the host; not supported on a GPU yet (drop --offload-params)");
  if (on_host_) {
    stage_elements_ = std::max<std::int64_t>(1024, window_bytes / 16);
    const std::int64_t stage = std::min<std::int64_t>(n, stage_elements_) * 4;
    for (auto& set : stage_)
      for (kernels::HostBuffer& b : set)
        b = kernels::HostBuffer(ctx, std::max<std::int64_t>(4, stage));
  }
  state_.assign(static_cast<std::size_t>(arrays), nullptr);
  if (on_host_ && state_array_ < 0) {  // cpu: pinned host memory, zeros
    host_state_ = kernels::HostBuffer(ctx, std::max<std::int64_t>(4, arrays * n * 4));
    std::fill_n(host_state_.as<float>(), arrays * n, 0.0f);
    for (std::int64_t k = 0; k < arrays; ++k) state_[k] = host_state_.as<float>() + k * n;
    return;
  }
  if (state_array_ >= 0) {
    // Zeros, like the Arena's state; read and written by the streamed update.
    for (std::int64_t k = 0; k < arrays; ++k) {
      state_[k] = store_->mapped(state_array_ + static_cast<int>(k));
    }
    return;
  }
  state_arena_ = core::Arena(arrays * core::Arena::footprint(core::DType::kF32, {n}),
                             buffers.memory_resource());
  if (n > 0) {
    for (float*& s : state_) s = state_arena_.alloc(core::DType::kF32, {n}).as<float>();
  }
}

Range DistributedOptimizer::stored() const {
  return {range_.begin, std::min(range_.end, buf_.layout().numel())};
}

std::vector<DistributedOptimizer::StateArray> DistributedOptimizer::state() const {
  std::vector<StateArray> out;
  const std::span<const char* const> names = rule_->state_arrays();
  for (std::size_t k = 0; k < names.size(); ++k) out.push_back({names[k], {state_[k], stored()}});
  return out;
}

void DistributedOptimizer::update(const core::ExecContext& ctx, double lr, std::int64_t step,
                                  float grad_scale, const float* grads, std::int64_t first,
                                  std::int64_t last, float* p, std::span<float* const> state) {
  const Range part{range_.begin + first, range_.begin + last};
  std::vector<float*> at(state.size());
  for (const LayoutChunk& ch : buf_.layout().chunks()) {
    const std::int64_t lo = std::max(part.begin, ch.base);
    const std::int64_t hi = std::min(part.end, ch.base + ch.table->total_numel);
    if (lo >= hi) continue;
    for (std::size_t k = 0; k < state.size(); ++k) at[k] = state[k] + (lo - part.begin);
    rule_->apply(ctx, *ch.table, lr, step, grad_scale,
                 {.range = {lo - ch.base, hi - ch.base},
                  .params = p + (lo - part.begin),
                  .grads = grads + (lo - part.begin),
                  .state = at});
  }
}

void DistributedOptimizer::step_on_host(const core::ExecContext& ctx, double lr, std::int64_t step,
                                        float grad_scale, const float* device_grads) {
  core::ExecContext host = ctx;  // the CPU's rule, with this rank's threads
  host.device = core::Device{};
  host.stream = nullptr;
  float* const device_params = buf_.master_weights(range_).data;
  // Chunks of at most stage_elements_ inside [lo, hi) (a store's chunk, or the whole range): the
  // copies of chunk k + 1 are queued before chunk k is updated; the stream orders each set's
  // upload before the next download into it. `state` addresses element lo.
  const auto run = [&](std::int64_t lo, std::int64_t hi, std::span<float* const> state) {
    std::vector<std::pair<std::int64_t, std::int64_t>> parts;
    for (std::int64_t a = lo; a < hi; a += stage_elements_)
      parts.emplace_back(a, std::min(hi, a + stage_elements_));
    const auto down = [&](std::size_t k) {
      const auto [a, b] = parts[k];
      const std::int64_t bytes = (b - a) * 4;
      kernels::copy_to_host(ctx, stage_[k % 2][0].data(), device_grads + a, bytes);
      kernels::copy_to_host(ctx, stage_[k % 2][1].data(), device_params + a, bytes);
    };
    std::vector<float*> at(state.size());
    if (!parts.empty()) down(0);
    for (std::size_t k = 0; k < parts.size(); ++k) {
      kernels::synchronize(ctx);  // chunk k is down (and chunk k - 1 up)
      if (k + 1 < parts.size()) down(k + 1);
      const auto [a, b] = parts[k];
      float* g = stage_[k % 2][0].as<float>();
      float* p = stage_[k % 2][1].as<float>();
      for (std::size_t s = 0; s < state.size(); ++s) at[s] = state[s] + (a - lo);
      update(host, lr, step, grad_scale, g, a, b, p, at);
      kernels::copy_to_device(ctx, device_params + a, p, (b - a) * 4);
    }
  };
  if (store_ != nullptr) {
    store_->stream([&](std::int64_t lo, std::int64_t hi, float* const* d) {
      run(lo, hi, {d + state_array_, state_.size()});
    });
  } else {
    run(0, range_.size(), state_);
  }
  kernels::synchronize(ctx);  // the weights are up before the buffers are reused
}

void DistributedOptimizer::step(const core::ExecContext& ctx, double lr, std::int64_t step,
                                float grad_scale, const float* grads) {
  if (on_host_) {
    step_on_host(ctx, lr, step, grad_scale, grads);
  } else if (store_ != nullptr) {
    std::vector<float*> at(state_.size());
    store_->stream([&](std::int64_t lo, std::int64_t hi, float* const* d) {
      float* p = param_array_ >= 0 ? d[param_array_] : buf_.master_weights(range_).data + lo;
      for (std::size_t k = 0; k < at.size(); ++k) {
        at[k] = state_array_ >= 0 ? d[state_array_ + static_cast<int>(k)] : state_[k] + lo;
      }
      update(ctx, lr, step, grad_scale, grads + lo, lo, hi, p, at);
    });
  } else {
    update(ctx, lr, step, grad_scale, grads, 0, range_.size(), buf_.master_weights(range_).data,
           state_);
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
