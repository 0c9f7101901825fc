#include "trident/optim/zero3_gather.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "trident/core/error.h"
#include "trident/core/view.h"
#include "trident/kernels/bf16.h"

namespace trident::optim {

namespace {

constexpr std::int64_t kMinFetchElements = 1024;

// The largest piece of a layer unit any rank owns.
std::int64_t max_unit_piece(const FlatLayout& layout, const parallel::ShardPlan& plan) {
  std::int64_t m = 0;
  for (const LayerUnit& u : layout.units()) {
    for (int r = 0; r < plan.dp; ++r) m = std::max(m, plan.owned(u.range, r).size());
  }
  return std::max(m, kMinFetchElements);
}

}  // namespace

std::int64_t Zero3ParamGatherer::fetch_window_bytes(const FlatLayout& layout,
                                                    const parallel::ShardPlan& plan) {
  return kFetchBuffers * OffloadStore::read_span_bytes(max_unit_piece(layout, plan));
}

Zero3ParamGatherer::Zero3ParamGatherer(ParamGradBuffers& buffers, comm::Communicator& dp,
                                       CommCounters& counters, OffloadStore* store, int array)
    : buf_(buffers), dp_(dp), counters_(counters), store_(store), array_(array) {
  TRIDENT_ASSERT(buffers.policy().shards_parameters(), "ZeRO-3 gathering needs sharded weights");
  TRIDENT_ASSERT((store == nullptr) == (buffers.master() != nullptr),
                 "the master shard is either in memory or in the offload store");
  if (store_ != nullptr) {
    fetch_each_ = OffloadStore::read_span_bytes(max_unit_piece(buf_.layout(), buf_.plan()));
    fetch_bytes_ = kFetchBuffers * fetch_each_;
    if (::posix_memalign(&fetch_mem_, 4096, static_cast<std::size_t>(fetch_bytes_)) != 0) {
      throw std::bad_alloc();
    }
    std::memset(fetch_mem_, 0, static_cast<std::size_t>(fetch_bytes_));
  }
}

Zero3ParamGatherer::~Zero3ParamGatherer() {
  try {
    drain();
  } catch (...) {
  }
  std::free(fetch_mem_);
}

void Zero3ParamGatherer::forget_fetches() {
  for (int b = 0; b < kFetchBuffers; ++b) fetch_[b] = Fetch{};
  slot_fetch_[0] = slot_fetch_[1] = -1;
}

void Zero3ParamGatherer::read_rest_piece(Range piece, float* out) {
  // Through two of the read buffers in turn: the read of the next part overlaps the copy.
  const std::int64_t part = (fetch_each_ - 4096) / 4;
  auto* mem = static_cast<char*>(fetch_mem_);
  const Range shard = buf_.shard();
  const float* data[2] = {nullptr, nullptr};
  const auto submit = [&](std::int64_t lo, int b) {
    const std::int64_t hi = std::min(piece.end, lo + part);
    data[b] =
        store_->read_async(array_, lo - shard.begin, hi - shard.begin, mem + b * fetch_each_, b);
  };
  int b = 0;
  if (piece.size() > 0) submit(piece.begin, 0);
  for (std::int64_t lo = piece.begin; lo < piece.end; lo += part, b ^= 1) {
    if (lo + part < piece.end) submit(lo + part, b ^ 1);
    store_->wait_read(b);
    const std::int64_t n = std::min(piece.end, lo + part) - lo;
    std::memcpy(out + (lo - piece.begin), data[b], static_cast<std::size_t>(n) * 4);
  }
}

void Zero3ParamGatherer::begin_iteration(const core::ExecContext& ctx, bool training) {
  drain();
  forget_fetches();
  slot_unit_[0] = slot_unit_[1] = -1;
  if (store_ != nullptr) {
    store_->check_files();
    recording_on_ = training;
    if (training) {
      // Prefetch this iteration in the order the last one gathered (the master shard changed,
      // the order did not).
      if (!recording_.empty()) trace_ = std::move(recording_);
      recording_.clear();
    }
    pos_ = 0;
    on_trace_ = training && !trace_.empty();
  }
  std::int64_t c = 0;
  const Range shard = buf_.shard();
  for (const Range& r : buf_.layout().rest()) {
    const Range mine = buf_.plan().owned(r, dp_.rank());
    float* out = buf_.rest_params() + c;
    const float* in;
    if (store_ != nullptr) {
      // Read straight into this rank's block of the gathered range; gathered in place.
      float* own = out + (mine.begin - r.begin);
      read_rest_piece(mine, own);
      in = own;
    } else {
      in = buf_.master() + (mine.begin - shard.begin);
    }
    counters_.account(comm::OpKind::kAllGather, r.size(), dp_.size());
    dp_.all_gather_v(in, out, buf_.plan().split(r), comm::Datatype::kF32);
    c += r.size();
  }
  if (buf_.bf16_params() != nullptr) {
    const std::int64_t n = buf_.layout().rest_numel();
    kernels::convert(ctx, {.out = core::view(buf_.bf16_params(), {n}, ctx.device),
                           .in = core::view(buf_.rest_params(), {n}, ctx.device)});
  }
  if (store_ != nullptr) read_ahead();
}

int Zero3ParamGatherer::fetch(int u, bool demand) {
  for (int b = 0; b < kFetchBuffers; ++b) {
    if (fetch_[b].unit == u) return b;
  }
  // A free buffer: not feeding a gather in flight, not holding a piece the trace needs soon.
  const auto needed_soon = [&](int unit) {
    if (!on_trace_) return false;
    for (std::size_t d = 0; d <= static_cast<std::size_t>(kReadAhead); ++d) {
      if (pos_ + d < trace_.size() && trace_[pos_ + d] == unit) return true;
    }
    return false;
  };
  int pick = -1;
  for (int b = 0; b < kFetchBuffers && pick < 0; ++b) {
    if (fetch_[b].pinned_by < 0 && fetch_[b].unit < 0) pick = b;
  }
  for (int b = 0; b < kFetchBuffers && pick < 0; ++b) {
    if (fetch_[b].pinned_by < 0 && !needed_soon(fetch_[b].unit)) pick = b;
  }
  for (int b = 0; b < kFetchBuffers && pick < 0 && demand; ++b) {
    if (fetch_[b].pinned_by < 0) pick = b;
  }
  if (pick < 0) return -1;
  Fetch& f = fetch_[pick];
  if (f.pending) store_->wait_read(pick);  // the buffer's last read must land before reuse
  const Range mine =
      buf_.plan().owned(buf_.layout().units()[static_cast<std::size_t>(u)].range, dp_.rank());
  const Range shard = buf_.shard();
  f.unit = u;
  f.pending = mine.size() > 0;
  f.data = store_->read_async(array_, mine.begin - shard.begin, mine.end - shard.begin,
                              static_cast<char*>(fetch_mem_) + pick * fetch_each_, pick);
  return pick;
}

void Zero3ParamGatherer::read_ahead() {
  if (!on_trace_) return;
  // trace_[pos_] is the next acquire's unit, already gathering or about to; read beyond it.
  for (std::size_t d = 0; d <= static_cast<std::size_t>(kReadAhead); ++d) {
    if (pos_ + d >= trace_.size()) break;
    if (fetch(trace_[pos_ + d], false) < 0) break;
  }
}

const float* Zero3ParamGatherer::shard_piece(int u, int slot, bool async) {
  if (store_ == nullptr) {
    const Range& r = buf_.layout().units()[static_cast<std::size_t>(u)].range;
    const Range mine = buf_.plan().owned(r, dp_.rank());
    return buf_.master() + (mine.begin - buf_.shard().begin);
  }
  const int b = fetch(u, true);
  TRIDENT_ASSERT(b >= 0, "no free parameter read buffer");
  Fetch& f = fetch_[b];
  if (f.pending) {
    store_->wait_read(b);
    f.pending = false;
  }
  if (async) {
    f.pinned_by = slot;
    slot_fetch_[slot] = b;
  }
  return f.data;
}

void Zero3ParamGatherer::release_slot(int slot) {
  if (slot_fetch_[slot] >= 0) {
    fetch_[slot_fetch_[slot]].pinned_by = -1;
    slot_fetch_[slot] = -1;
  }
}

void Zero3ParamGatherer::gather_into(int u, int slot, bool async) {
  // Every rank contributes its piece of the layer from its master shard.
  const Range& r = buf_.layout().units()[static_cast<std::size_t>(u)].range;
  const auto counts = buf_.plan().split(r);
  const float* in = shard_piece(u, slot, async);
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
  if (store_ != nullptr) {
    if (recording_on_) recording_.push_back(u);
    if (on_trace_ && (pos_ >= trace_.size() || trace_[pos_] != u)) on_trace_ = false;
    ++pos_;
  }
  slot_request_[slot].wait();  // a prefetch of this slot, if any
  release_slot(slot);
  if (slot_unit_[slot] != u) gather_into(u, slot, false);
  StagedLayer staged{slot, buf_.param_slot(slot), nullptr};
  if (buf_.bf16_slot(slot) != nullptr) {
    const Range& r = buf_.layout().units()[static_cast<std::size_t>(u)].range;
    kernels::convert(ctx, {.out = core::view(buf_.bf16_slot(slot), {r.size()}, ctx.device),
                           .in = core::view(buf_.param_slot(slot), {r.size()}, ctx.device)});
    staged.params_bf16 = buf_.bf16_slot(slot);
  }
  const int other = 1 - slot;
  if (next >= 0 && slot_unit_[other] != next) {
    slot_request_[other].wait();
    release_slot(other);
    gather_into(next, other, true);
  }
  if (store_ != nullptr) read_ahead();
  return staged;
}

void Zero3ParamGatherer::drain() {
  slot_request_[0].wait();
  slot_request_[1].wait();
  release_slot(0);
  release_slot(1);
  if (store_ != nullptr) {
    for (int b = 0; b < kFetchBuffers; ++b) {
      if (fetch_[b].pending) {
        store_->wait_read(b);
        fetch_[b].pending = false;
      }
    }
  }
}

}  // namespace trident::optim
