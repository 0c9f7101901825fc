#include "trident/optim/zero3_gather.h"

#include "trident/core/error.h"
#include "trident/kernels/bf16.h"

namespace trident::optim {

Zero3ParamGatherer::Zero3ParamGatherer(ParamGradBuffers& buffers, comm::Communicator& dp,
                                       CommCounters& counters)
    : buf_(buffers), dp_(dp), counters_(counters) {
  TRIDENT_ASSERT(buffers.policy().shards_parameters(), "ZeRO-3 gathering needs sharded weights");
}

void Zero3ParamGatherer::begin_iteration(const core::ExecContext& ctx) {
  drain();
  std::int64_t c = 0;
  const Range shard = buf_.shard();
  for (const Range& r : buf_.layout().rest()) {
    const Range mine = buf_.plan().owned(r, dp_.rank());
    counters_.account(comm::OpKind::kAllGather, r.size(), dp_.size());
    dp_.all_gather_v(buf_.master() + (mine.begin - shard.begin), buf_.rest_params() + c,
                     buf_.plan().split(r), comm::Datatype::kF32);
    c += r.size();
  }
  if (buf_.bf16_params() != nullptr) {
    kernels::convert_f32_to_bf16(ctx, buf_.bf16_params(), buf_.rest_params(),
                                 buf_.layout().rest_numel());
  }
  slot_unit_[0] = slot_unit_[1] = -1;
}

void Zero3ParamGatherer::gather_into(int u, int slot, bool async) {
  // Every rank contributes its piece of the layer from its master shard.
  const Range& r = buf_.layout().units()[static_cast<std::size_t>(u)].range;
  const Range mine = buf_.plan().owned(r, dp_.rank());
  const auto counts = buf_.plan().split(r);
  const float* in = buf_.master() + (mine.begin - buf_.shard().begin);
  counters_.account(comm::OpKind::kAllGather, r.size(), dp_.size());
  if (async) {
    slot_request_[slot] =
        dp_.iall_gather_v(in, buf_.param_slot(slot), counts, comm::Datatype::kF32);
  } else {
    dp_.all_gather_v(in, buf_.param_slot(slot), counts, comm::Datatype::kF32);
  }
  slot_unit_[slot] = u;
}

StagedLayer Zero3ParamGatherer::acquire(const core::ExecContext& ctx, int u, int slot, int next) {
  TRIDENT_ASSERT(slot == 0 || slot == 1, "slot ", slot);
  slot_request_[slot].wait();  // a prefetch of this slot, if any
  if (slot_unit_[slot] != u) gather_into(u, slot, false);
  StagedLayer staged{slot, buf_.param_slot(slot), nullptr};
  if (buf_.bf16_slot(slot) != nullptr) {
    const Range& r = buf_.layout().units()[static_cast<std::size_t>(u)].range;
    kernels::convert_f32_to_bf16(ctx, buf_.bf16_slot(slot), buf_.param_slot(slot), r.size());
    staged.params_bf16 = buf_.bf16_slot(slot);
  }
  const int other = 1 - slot;
  if (next >= 0 && slot_unit_[other] != next) {
    slot_request_[other].wait();
    gather_into(next, other, true);
  }
  return staged;
}

void Zero3ParamGatherer::drain() {
  slot_request_[0].wait();
  slot_request_[1].wait();
}

}  // namespace trident::optim
