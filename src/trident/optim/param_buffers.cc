#include "trident/optim/param_buffers.h"

#include "trident/core/error.h"

namespace trident::optim {

namespace {

std::int64_t f32_bytes(std::int64_t n) { return core::Arena::footprint(core::DType::kF32, {n}); }
std::int64_t bf16_bytes(std::int64_t n) { return core::Arena::footprint(core::DType::kBF16, {n}); }

float* take(core::Arena& a, std::int64_t n) {
  return n > 0 ? a.alloc(core::DType::kF32, {n}).as<float>() : nullptr;
}
core::bf16* take_bf16(core::Arena& a, std::int64_t n) {
  return n > 0 ? a.alloc(core::DType::kBF16, {n}).as<core::bf16>() : nullptr;
}

}  // namespace

ParamGradBuffers::ParamGradBuffers(const FlatLayout& layout, const parallel::ShardPlan& plan,
                                   ZeroPolicy policy, int dp_rank, bool bf16, bool offload_params,
                                   core::MemoryResource& memory)
    : layout_(layout),
      plan_(plan),
      policy_(policy),
      dp_rank_(dp_rank),
      sizes_(buffer_sizes(layout, plan, policy, bf16, offload_params)),
      memory_(&memory) {
  const BufferSizes& s = sizes_;
  params_arena_ = core::Arena(f32_bytes(s.full_params) + f32_bytes(s.master), memory);
  grads_arena_ = core::Arena(f32_bytes(s.full_grads) + f32_bytes(s.grad_shard), memory);
  staging_arena_ =
      core::Arena(f32_bytes(s.rest_params) + f32_bytes(s.rest_grads) + f32_bytes(s.grad_slot) +
                      f32_bytes(s.rs_piece) + 2 * f32_bytes(s.param_slot),
                  memory);
  bf16_arena_ = core::Arena(bf16_bytes(s.bf16_params) + 2 * bf16_bytes(s.bf16_slot), memory);
  full_params_ = take(params_arena_, s.full_params);
  master_ = take(params_arena_, s.master);
  full_grads_ = take(grads_arena_, s.full_grads);
  grad_shard_ = take(grads_arena_, s.grad_shard);
  rest_params_ = take(staging_arena_, s.rest_params);
  rest_grads_ = take(staging_arena_, s.rest_grads);
  grad_slot_ = take(staging_arena_, s.grad_slot);
  rs_piece_ = take(staging_arena_, s.rs_piece);
  for (int i = 0; i < 2; ++i) param_slots_[i] = take(staging_arena_, s.param_slot);
  bf16_params_ = take_bf16(bf16_arena_, s.bf16_params);
  for (int i = 0; i < 2; ++i) bf16_slots_[i] = take_bf16(bf16_arena_, s.bf16_slot);
}

FlatSpan<float> ParamGradBuffers::master_weights(Range range) const {
  if (policy_.shards_parameters()) {
    const Range sh = shard();
    TRIDENT_ASSERT(range.begin >= sh.begin && range.end <= sh.end, "range outside the shard");
    TRIDENT_ASSERT(master_ != nullptr || range.size() == 0, "the master shard is offloaded");
    return {master_ + (range.begin - sh.begin), range};
  }
  return {full_params_ + range.begin, range};
}

float* ParamGradBuffers::rest_grad_at(std::int64_t flat) const {
  if (!policy_.shards_gradients()) return full_grads_ + flat;
  const std::int64_t c = layout_.rest_index(flat);
  TRIDENT_ASSERT(c >= 0, "flat index ", flat, " is not an embedding or head parameter");
  return rest_grads_ + c;
}

MemoryReport ParamGradBuffers::memory(int state_arrays) const {
  return memory_report(sizes_, policy_, layout_.numel(), plan_.dp, state_arrays);
}

}  // namespace trident::optim
