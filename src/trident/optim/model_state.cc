#include "trident/optim/model_state.h"

#include <algorithm>

#include "trident/core/arena.h"

namespace trident::optim {

namespace {

std::int64_t f32_bytes(std::int64_t n) {
  return n > 0 ? core::Arena::footprint(core::DType::kF32, {n}) : 0;
}
std::int64_t bf16_bytes(std::int64_t n) {
  return n > 0 ? core::Arena::footprint(core::DType::kBF16, {n}) : 0;
}

}  // namespace

BufferSizes buffer_sizes(const FlatLayout& layout, const parallel::ShardPlan& plan,
                         ZeroPolicy policy, bool bf16, bool offload_params) {
  const std::int64_t N = layout.numel(), Np = plan.numel_padded, S = plan.shard_size;
  BufferSizes s;
  if (policy.shards_parameters()) {
    (offload_params ? s.master_offloaded : s.master) = S;
    s.rest_params = layout.rest_numel();
    s.param_slot = layout.max_unit();
  } else {
    s.full_params = Np;
  }
  if (policy.shards_gradients()) {
    s.grad_shard = S;
    s.rest_grads = layout.rest_numel();
    s.grad_slot = layout.max_unit();
    // A rank's piece of any reduced range (a layer, a non-layer range) is at most that range and
    // at most a shard.
    std::int64_t largest = layout.max_unit();
    for (const Range& r : layout.rest()) largest = std::max(largest, r.size());
    s.rs_piece = std::min(S, largest);
  } else {
    s.full_grads = Np;
  }
  s.state = policy.shards_optimizer() ? S : N;
  if (bf16) {
    s.bf16_params = policy.shards_parameters() ? layout.rest_numel() : N;
    s.bf16_slot = policy.shards_parameters() ? layout.max_unit() : 0;
  }
  return s;
}

MemoryReport memory_report(const BufferSizes& s, ZeroPolicy policy, std::int64_t numel, int dp,
                           int state_arrays) {
  MemoryReport m;
  m.param_bytes = f32_bytes(s.full_params) + f32_bytes(s.master) + bf16_bytes(s.bf16_params) +
                  2 * bf16_bytes(s.bf16_slot);
  m.grad_bytes = f32_bytes(s.full_grads) + f32_bytes(s.grad_shard);
  m.optimizer_bytes = state_arrays * f32_bytes(s.state);
  m.staging_bytes = f32_bytes(s.rest_params) + f32_bytes(s.rest_grads) + f32_bytes(s.grad_slot) +
                    f32_bytes(s.rs_piece) + 2 * f32_bytes(s.param_slot);
  const double psi = static_cast<double>(numel), d = dp;
  const auto bytes = [](double x) { return static_cast<std::int64_t>(x); };
  m.predicted_param_bytes = bytes(policy.shards_parameters() ? 4 * psi / d : 4 * psi);
  m.predicted_grad_bytes = bytes(policy.shards_gradients() ? 4 * psi / d : 4 * psi);
  const double k = 4.0 * state_arrays;
  m.predicted_optimizer_bytes = bytes(policy.shards_optimizer() ? k * psi / d : k * psi);
  return m;
}

MemoryReport model_state_memory(const FlatLayout& layout, int stage, int dp, bool bf16,
                                int state_arrays, bool offload_params) {
  const ZeroPolicy policy = zero_policy(stage);
  const parallel::ShardPlan plan = parallel::build_shard_plan(layout.numel(), dp, kShardAlign);
  return memory_report(buffer_sizes(layout, plan, policy, bf16, offload_params), policy,
                       layout.numel(), dp, state_arrays);
}

}  // namespace trident::optim
