#include "trident/optim/grad_sync.h"

#include <algorithm>

#include "trident/core/error.h"
#include "trident/core/view.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/fill.h"

namespace trident::optim {

namespace {

using comm::Datatype;
using comm::ReduceOp;

void zero(const core::ExecContext& ctx, float* x, std::int64_t n) {
  kernels::fill(ctx, {.out = core::view(x, {n}, ctx.device), .value = 0.0f});
}

// Stages 0-1: backward accumulates straight into the full gradient; each bucket of consecutive
// layers is reduced once, on the last micro-batch, as soon as its first layer (the last one
// backward reaches) is done.
class BucketedSync : public GradSync {
 public:
  BucketedSync(ParamGradBuffers& b, comm::Communicator& dp, CommCounters& c,
               std::int64_t bucket_size)
      : GradSync(b, dp, c), buckets_(b.layout().layer_buckets(bucket_size)) {
    done_.assign(buckets_.size(), false);
  }

  void begin_iteration(const core::ExecContext& ctx) override {
    zero(ctx, buf_.full_grads(), buf_.sizes().full_grads);
    std::fill(done_.begin(), done_.end(), false);
  }
  float* layer_grads(const core::ExecContext&, int u) override {
    return buf_.full_grads() + buf_.layout().units()[static_cast<std::size_t>(u)].range.begin;
  }
  void layer_done(const core::ExecContext&, int u) override {
    if (!last_backward_) return;
    const Range& unit = buf_.layout().units()[static_cast<std::size_t>(u)].range;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (done_[b] || unit.begin != buckets_[b].begin) continue;
      done_[b] = true;
      if (dp_.size() > 1) pending_.push_back(launch(buckets_[b]));
    }
    if (!dp_.progresses_itself()) {
      for (comm::Request& r : pending_) r.test();  // let MPI progress while backward goes on
    }
  }
  void finish_layers() override {
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (done_[b] || dp_.size() == 1) continue;
      reduce_now(buckets_[b]);
    }
    for (comm::Request& r : pending_) r.wait();
    pending_.clear();
  }
  void reduce_rest(const core::ExecContext&) override {
    if (dp_.size() == 1) return;
    for (const Range& r : buf_.layout().rest()) reduce_now(r);
  }
  bool stages_layer_grads() const override { return false; }

 protected:
  virtual comm::Request launch(const Range& r) = 0;
  virtual void reduce_now(const Range& r) = 0;

 private:
  std::vector<Range> buckets_;
  std::vector<bool> done_;
  std::vector<comm::Request> pending_;
};

class BucketAllReduce final : public BucketedSync {
 public:
  using BucketedSync::BucketedSync;
  HeldGrads held() const override {
    return {{buf_.full_grads(), {0, buf_.layout().numel()}}, false};
  }

 protected:
  comm::Request launch(const Range& r) override {
    account(comm::OpKind::kAllReduce, r.size());
    return dp_.iall_reduce(buf_.full_grads() + r.begin, r.size(), Datatype::kF32, ReduceOp::kSum);
  }
  void reduce_now(const Range& r) override {
    account(comm::OpKind::kAllReduce, r.size());
    dp_.all_reduce(buf_.full_grads() + r.begin, r.size(), Datatype::kF32, ReduceOp::kSum);
  }
};

// In place: this rank's piece of a range is its block of that range.
class BucketReduceScatter final : public BucketedSync {
 public:
  using BucketedSync::BucketedSync;
  HeldGrads held() const override {
    const Range s = buf_.shard();
    return {{buf_.full_grads() + s.begin, s}, true};
  }

 protected:
  comm::Request launch(const Range& r) override {
    account(comm::OpKind::kReduceScatter, r.size());
    return dp_.ireduce_scatter_v(buf_.full_grads() + r.begin, mine(r), buf_.plan().split(r),
                                 Datatype::kF32, ReduceOp::kSum);
  }
  void reduce_now(const Range& r) override {
    account(comm::OpKind::kReduceScatter, r.size());
    dp_.reduce_scatter_v(buf_.full_grads() + r.begin, mine(r), buf_.plan().split(r), Datatype::kF32,
                         ReduceOp::kSum);
  }

 private:
  float* mine(const Range& r) const {
    return buf_.full_grads() + buf_.plan().owned(r, dp_.rank()).begin;
  }
};

// Stages 2-3: the layer gradient of every micro-batch goes into one staging slot and is
// reduce-scattered right after the layer's backward; this rank keeps only its piece, accumulated
// across micro-batches. Non-layer gradients accumulate whole for the iteration.
class LayerReduceScatter final : public GradSync {
 public:
  using GradSync::GradSync;

  void begin_iteration(const core::ExecContext& ctx) override {
    zero(ctx, buf_.grad_shard(), buf_.sizes().grad_shard);
    zero(ctx, buf_.rest_grads(), buf_.sizes().rest_grads);
  }
  float* layer_grads(const core::ExecContext& ctx, int) override {
    zero(ctx, buf_.grad_slot(), buf_.sizes().grad_slot);
    return buf_.grad_slot();
  }
  void layer_done(const core::ExecContext& ctx, int u) override {
    const Range& r = buf_.layout().units()[static_cast<std::size_t>(u)].range;
    scatter_and_accumulate(ctx, buf_.grad_slot(), r);
  }
  void finish_layers() override {}
  void reduce_rest(const core::ExecContext& ctx) override {
    for (const Range& r : buf_.layout().rest()) {
      scatter_and_accumulate(ctx, buf_.rest_grad_at(r.begin), r);
    }
  }
  HeldGrads held() const override { return {{buf_.grad_shard(), buf_.shard()}, true}; }
  bool stages_layer_grads() const override { return true; }

 private:
  // `in` holds the whole gradient of flat range r; this rank's reduced piece is added to its
  // gradient shard.
  void scatter_and_accumulate(const core::ExecContext& ctx, const float* in, const Range& r) {
    const Range mine = buf_.plan().owned(r, dp_.rank());
    account(comm::OpKind::kReduceScatter, r.size());
    const float* piece = in;  // one rank: its piece is the whole range
    if (dp_.size() > 1) {
      dp_.reduce_scatter_v(in, buf_.rs_piece(), buf_.plan().split(r), Datatype::kF32,
                           ReduceOp::kSum);
      piece = buf_.rs_piece();
    }
    float* acc = buf_.grad_shard() + (mine.begin - buf_.shard().begin);
    const core::TensorView acc_view = core::view(acc, {mine.size()}, ctx.device);
    kernels::add(
        ctx, {.out = acc_view, .a = acc_view, .b = core::view(piece, {mine.size()}, ctx.device)});
  }
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(ParamGradBuffers& buffers, comm::Communicator& dp,
                                         CommCounters& counters, std::int64_t bucket_size) {
  const ZeroPolicy policy = buffers.policy();
  if (policy.shards_gradients()) return std::make_unique<LayerReduceScatter>(buffers, dp, counters);
  if (policy.shards_optimizer()) {
    return std::make_unique<BucketReduceScatter>(buffers, dp, counters, bucket_size);
  }
  return std::make_unique<BucketAllReduce>(buffers, dp, counters, bucket_size);
}

}  // namespace trident::optim
