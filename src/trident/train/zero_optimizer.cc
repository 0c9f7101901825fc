#include "trident/train/zero_optimizer.h"

#include <unistd.h>

#include "trident/core/error.h"
#include "trident/core/view.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/memory.h"

namespace trident::train {

namespace {
// The views of a layer without parameters in an optimizer's part (every pointer null).
const model::layers::BlockParams kNoBlockParams{};
model::layers::BlockGrads kNoBlockGrads{};
}  // namespace

optim::FlatLayout flat_layout_of(const RankModel& model) {
  std::vector<optim::LayoutChunk> chunks;
  for (const ModelChunk& ch : model.chunks()) {
    chunks.push_back({&ch.table, ch.base, ch.shard.first_layer});
  }
  return optim::FlatLayout(std::move(chunks), model.tp_rank());
}

ZeroOptimizer::ZeroOptimizer(const RankModel& model, const parallel::ParallelContext& par,
                             const optim::OptimizerConfig& optimizer, const ZeroConfig& zero)
    : model_(model),
      par_(par),
      policy_(optim::zero_policy(zero.stage)),
      layout_(flat_layout_of(model)) {
  comm::Communicator& dp = zero.experts ? par.edp() : par.dp();
  const parallel::ShardPlan plan =
      parallel::build_shard_plan(layout_.numel(), dp.size(), optim::kShardAlign);
  TRIDENT_CHECK(!zero.offload_params || policy_.shards_parameters(),
                "--offload-params nvme needs --zero-stage 3 (got ", zero.stage,
                "): only ZeRO-3 shards the weights; use --zero-stage 3 or drop --offload-params");
  hook_ctx_ = zero.ctx;
  buffers_ =
      std::make_unique<optim::ParamGradBuffers>(layout_, plan, policy_, dp.rank(), zero.bf16,
                                                zero.offload_params, kernels::memory_for(zero.ctx));
  // One store for everything offloaded: the optimizer streams the arrays together.
  std::vector<std::string> arrays;
  if (zero.offload_params) {
    param_array_ = static_cast<int>(arrays.size());
    arrays.push_back("params");
  }
  if (zero.offload.device == optim::OffloadDevice::kNvme) {
    state_array_ = static_cast<int>(arrays.size());
    for (const char* name : optim::make_update_rule(optimizer)->state_arrays()) {
      arrays.emplace_back(name);
    }
  }
  if (!arrays.empty()) {
    const std::int64_t n = buffers_->sizes().state;
    TRIDENT_ASSERT(!zero.offload_params || buffers_->sizes().master_offloaded == n,
                   "the master shard and the optimizer state cover different ranges");
    store_ = std::make_unique<optim::OffloadStore>(
        zero.offload,
        core::str("trident.", ::getpid(), ".rank", par.rank(), zero.experts ? ".experts" : ""),
        arrays, n);
  }
  sync_ = optim::make_grad_sync(*buffers_, dp, comm_, zero.bucket_size);
  if (policy_.shards_parameters()) {
    gatherer_ = std::make_unique<optim::Zero3ParamGatherer>(
        *buffers_, dp, comm_, param_array_ >= 0 ? store_.get() : nullptr, param_array_);
  }
  finalizer_ =
      std::make_unique<optim::GradFinalizer>(layout_, par, optimizer.clip_grad, zero.experts);
  opt_ = std::make_unique<optim::DistributedOptimizer>(
      *buffers_, dp, comm_, optimizer, store_.get(), param_array_, state_array_, zero.ctx,
      zero.offload.device, zero.offload.window_bytes);
  build_chunk_views();
  build_slot_views();
}

class ZeroOptimizer::ChunkWeights final : public model::LayerWeightsProvider {
 public:
  ChunkWeights(ZeroOptimizer& opt, int chunk) : opt_(opt), chunk_(chunk) {}
  void begin_backward(bool last_of_iteration) override {
    opt_.begin_backward(chunk_, last_of_iteration);
  }
  model::LayerWeights forward(std::int64_t layer) override {
    return opt_.layer_weights(chunk_, layer, true);
  }
  model::LayerBackwardWeights backward(std::int64_t layer) override {
    return opt_.layer_backward(chunk_, layer);
  }
  void backward_done(std::int64_t layer) override { opt_.layer_backward_done(chunk_, layer); }

 private:
  ZeroOptimizer& opt_;
  int chunk_;
};

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::build_chunk_views() {
  const model::ModelConfig& cfg = model_.config();
  const optim::ParamGradBuffers& b = *buffers_;
  const bool bf16 = b.bf16_params() != nullptr;
  for (int c = 0; c < static_cast<int>(model_.chunks().size()); ++c) {
    const ModelChunk& ch = model_.chunks()[static_cast<std::size_t>(c)];
    // Where a non-layer tensor lives when the stage keeps those compact (ZeRO 2-3); layer tensors
    // are then not resident (null).
    const auto in_rest = [&](auto* compact, std::int64_t offset) -> decltype(compact) {
      const std::int64_t i = layout_.rest_index(ch.base + offset);
      return i >= 0 ? compact + i : nullptr;
    };
    if (b.full_params() != nullptr) {
      views_.params.push_back(model::gpt_param_views(cfg, ch.table, b.full_params() + ch.base,
                                                     bf16 ? b.bf16_params() + ch.base : nullptr));
    } else {
      model::Locate<const core::bf16> locate_bf16;
      if (bf16) {
        locate_bf16 = [&](std::int64_t o) {
          return static_cast<const core::bf16*>(in_rest(b.bf16_params(), o));
        };
      }
      views_.params.push_back(model::gpt_param_views(
          cfg, ch.table,
          [&](std::int64_t o) { return static_cast<const float*>(in_rest(b.rest_params(), o)); },
          locate_bf16));
    }
    if (b.full_grads() != nullptr) {
      views_.grads.push_back(model::gpt_grad_views(cfg, ch.table, b.full_grads() + ch.base));
    } else {
      views_.grads.push_back(model::gpt_grad_views(
          cfg, ch.table, [&](std::int64_t o) { return in_rest(b.rest_grads(), o); }));
    }
    providers_.push_back(std::make_unique<ChunkWeights>(*this, c));
  }
}

void ZeroOptimizer::build_slot_views() {
  // Each layer unit's views inside the staging slots, built once.
  const model::ModelConfig& cfg = model_.config();
  const optim::ParamGradBuffers& b = *buffers_;
  for (const optim::LayerUnit& u : layout_.units()) {
    const ModelChunk& ch = model_.chunks()[static_cast<std::size_t>(u.chunk)];
    const auto in_unit = [&](auto* slot, std::int64_t offset) -> decltype(slot) {
      const std::int64_t i = ch.base + offset;
      return i >= u.range.begin && i < u.range.end ? slot + (i - u.range.begin) : nullptr;
    };
    if (b.grad_slot() != nullptr) {
      slot_grad_views_.push_back(model::block_grad_views(
          cfg, ch.table, u.layer, [&](std::int64_t o) { return in_unit(b.grad_slot(), o); }));
    }
    for (int s = 0; s < 2; ++s) {
      if (b.param_slot(s) == nullptr && b.bf16_slot(s) == nullptr) continue;
      model::Locate<const float> locate;
      model::Locate<const core::bf16> locate_bf16;
      if (b.param_slot(s) != nullptr) {
        locate = [&](std::int64_t o) {
          return static_cast<const float*>(in_unit(b.param_slot(s), o));
        };
      }
      if (b.bf16_slot(s) != nullptr) {
        locate_bf16 = [&](std::int64_t o) {
          return static_cast<const core::bf16*>(in_unit(b.bf16_slot(s), o));
        };
      }
      slot_param_views_[s].push_back(
          model::block_param_views(cfg, ch.table, u.layer, locate, locate_bf16));
    }
  }
}

model::LayerWeights ZeroOptimizer::layer_weights(int chunk, std::int64_t layer, bool forward) {
  const auto c = static_cast<std::size_t>(chunk), l = static_cast<std::size_t>(layer);
  if (!gatherer_) {
    return {&views_.params[c].layers[l]};
  }
  // Stage 3: gather into the slot of the layer's parity, prefetch the layer the pass visits next.
  const int u = layout_.unit_of(chunk, layer);
  if (u < 0) return {&kNoBlockParams};  // no parameter of this layer in this optimizer's part
  const int next = layout_.unit_of(chunk, forward ? layer + 1 : layer - 1);
  const optim::StagedLayer staged =
      gatherer_->acquire(hook_ctx_, u, static_cast<int>(layer % 2), next);
  const auto su = static_cast<std::size_t>(u);
  return {&slot_param_views_[staged.slot][su]};
}

model::LayerBackwardWeights ZeroOptimizer::layer_backward(int chunk, std::int64_t layer) {
  model::LayerBackwardWeights w{layer_weights(chunk, layer, false), nullptr};
  const int u = layout_.unit_of(chunk, layer);
  if (u < 0 && sync_->stages_layer_grads()) {
    w.grads = &kNoBlockGrads;
  } else if (sync_->stages_layer_grads()) {
    sync_->layer_grads(hook_ctx_, u);  // zeroes the staging slot
    w.grads = &slot_grad_views_[static_cast<std::size_t>(u)];
  } else {
    w.grads =
        &views_.grads[static_cast<std::size_t>(chunk)].layers[static_cast<std::size_t>(layer)];
  }
  return w;
}

void ZeroOptimizer::layer_backward_done(int chunk, std::int64_t layer) {
  const int u = layout_.unit_of(chunk, layer);
  if (u >= 0) sync_->layer_done(hook_ctx_, u);
}

void ZeroOptimizer::install_hooks(std::vector<model::ModelRuntime>& runtimes) {
  TRIDENT_ASSERT(runtimes.size() == providers_.size(), runtimes.size(), " runtimes for ",
                 providers_.size(), " chunks");
  for (std::size_t c = 0; c < runtimes.size(); ++c) {
    runtimes[c].layer_weights = providers_[c].get();
    runtimes[c].bf16 = buffers_->bf16_params() != nullptr;
  }
}

void ZeroOptimizer::merge_hooks(std::vector<model::ModelRuntime>& runtimes,
                                std::vector<std::unique_ptr<MergedLayerWeights>>& merged) {
  TRIDENT_ASSERT(runtimes.size() == providers_.size(), runtimes.size(), " runtimes for ",
                 providers_.size(), " chunks");
  for (std::size_t c = 0; c < runtimes.size(); ++c) {
    TRIDENT_ASSERT(runtimes[c].layer_weights != nullptr, "no dense provider to merge with");
    merged.push_back(
        std::make_unique<MergedLayerWeights>(*runtimes[c].layer_weights, *providers_[c]));
    runtimes[c].layer_weights = merged.back().get();
  }
}

namespace {
// The expert weights of `from` into `to` (the dense provider's views leave them null).
void take_experts(model::layers::MoeParams& to, const model::layers::MoeParams& from) {
  to.fc_w = from.fc_w;
  to.fc2_w = from.fc2_w;
}
}  // namespace

void MergedLayerWeights::begin_backward(bool last_of_iteration) {
  dense_.begin_backward(last_of_iteration);
  experts_.begin_backward(last_of_iteration);
}

model::LayerWeights MergedLayerWeights::forward(std::int64_t layer) {
  forward_ = *dense_.forward(layer).params;
  take_experts(forward_.moe, experts_.forward(layer).params->moe);
  return {&forward_};
}

model::LayerBackwardWeights MergedLayerWeights::backward(std::int64_t layer) {
  const model::LayerBackwardWeights d = dense_.backward(layer);
  const model::LayerBackwardWeights e = experts_.backward(layer);
  backward_ = *d.weights.params;
  take_experts(backward_.moe, e.weights.params->moe);
  grads_ = *d.grads;
  grads_.moe.fc_w = e.grads->moe.fc_w;
  grads_.moe.fc2_w = e.grads->moe.fc2_w;
  return {{&backward_}, &grads_};
}

void MergedLayerWeights::backward_done(std::int64_t layer) {
  dense_.backward_done(layer);
  experts_.backward_done(layer);
}

void ZeroOptimizer::init_params(std::uint64_t seed) {
  const optim::ParamGradBuffers& b = *buffers_;
  if (b.full_params() != nullptr) {
    model_.init(seed, b.full_params(), hook_ctx_);
    return;
  }
  // Stage 3: only this rank's shard; the padding past the last parameter stays zero.
  const parallel::Range shard = b.shard();
  const parallel::Range held{shard.begin, std::min(shard.end, layout_.numel())};
  if (param_array_ >= 0) {
    // Chunk by chunk through the store's window into the file.
    store_->stream([&](std::int64_t lo, std::int64_t hi, float* const* d) {
      float* p = d[param_array_];
      kernels::fill(hook_ctx_, {.out = core::view(p, {hi - lo}, hook_ctx_.device), .value = 0.0f});
      const parallel::Range part{shard.begin + lo, std::min(shard.begin + hi, held.end)};
      if (part.size() > 0) model_.init_range(seed, part, p, hook_ctx_);
    });
    return;
  }
  kernels::fill(hook_ctx_,
                {.out = core::view(b.master(), {shard.size()}, hook_ctx_.device), .value = 0.0f});
  if (held.size() > 0) model_.init_range(seed, held, b.master(), hook_ctx_);
}

void ZeroOptimizer::refresh_bf16(const core::ExecContext& ctx) {
  // Stage 3 converts when it gathers (begin_iteration, before each layer).
  const optim::ParamGradBuffers& b = *buffers_;
  if (b.bf16_params() != nullptr && b.full_params() != nullptr) {
    kernels::convert(ctx, {.out = core::view(b.bf16_params(), {layout_.numel()}, ctx.device),
                           .in = core::view(b.full_params(), {layout_.numel()}, ctx.device)});
  }
}

void ZeroOptimizer::begin_iteration() {
  sync_->begin_iteration(hook_ctx_);
  if (gatherer_) gatherer_->begin_iteration(hook_ctx_);
}

void ZeroOptimizer::begin_evaluation() {
  if (gatherer_) gatherer_->begin_iteration(hook_ctx_, /*training=*/false);
}

void ZeroOptimizer::begin_backward(int /*chunk*/, bool last_of_iteration) {
  sync_->begin_backward(last_of_iteration);
}

optim::GradShare ZeroOptimizer::reduce_grads(const core::ExecContext& ctx,
                                             const GradScaling& scaling) {
  sync_->finish_layers();
  finalizer_->sum_tied_embeddings(*sync_);
  sync_->reduce_rest(ctx);
  held_ = sync_->held();
  TRIDENT_ASSERT(held_.grads.range == opt_->updated_range(), "held gradients [",
                 held_.grads.range.begin, ", ", held_.grads.range.end,
                 ") are not the updated range");
  return finalizer_->share(ctx, held_, scaling);
}

void ZeroOptimizer::update(const core::ExecContext& ctx, double lr, std::int64_t step,
                           float grad_scale) {
  if (gatherer_) gatherer_->drain();
  opt_->step(ctx, lr, step, grad_scale, held_.grads.data);
  refresh_bf16(ctx);
}

OptimizerStepResult ZeroOptimizer::step(const core::ExecContext& ctx, double lr, std::int64_t step,
                                        const GradScaling& scaling) {
  const optim::FinalizedGrads f = finalizer_->finalize(reduce_grads(ctx, scaling), scaling);
  if (f.skipped) return {f.grad_norm, true};
  update(ctx, lr, step, f.grad_scale);
  return {f.grad_norm, false};
}

OptimizerStepResult ZeroOptimizer::step_together(const core::ExecContext& ctx, double lr,
                                                 std::int64_t step, const GradScaling& scaling,
                                                 ZeroOptimizer& dense, ZeroOptimizer& experts) {
  const optim::GradShare a = dense.reduce_grads(ctx, scaling);
  const optim::GradShare b = experts.reduce_grads(ctx, scaling);
  const optim::FinalizedGrads f = dense.finalizer_->finalize(
      {.norm_sq = a.norm_sq + b.norm_sq, .overflow = a.overflow || b.overflow}, scaling);
  if (f.skipped) return {f.grad_norm, true};
  dense.update(ctx, lr, step, f.grad_scale);
  experts.update(ctx, lr, step, f.grad_scale);
  return {f.grad_norm, false};
}

void ZeroOptimizer::add_to_param(const std::string& name, const std::vector<float>& delta) {
  const TensorSlice held = params_slice();
  for (const ModelChunk& ch : model_.chunks()) {
    for (const model::ParamSpec& p : ch.table.params) {
      if (p.name != name) continue;
      TRIDENT_ASSERT(static_cast<std::int64_t>(delta.size()) == p.numel, name, ": ", delta.size(),
                     " values for ", p.numel, " elements");
      const std::int64_t at = ch.base + p.offset;
      const std::int64_t lo = std::max(at, held.range.begin);
      const std::int64_t hi = std::min(at + p.numel, held.range.end);
      if (lo >= hi) continue;
      float* dst = held.data + (lo - held.range.begin);
      std::vector<float> v(static_cast<std::size_t>(hi - lo));
      const auto bytes = static_cast<std::int64_t>(v.size() * sizeof(float));
      kernels::copy_to_host(hook_ctx_, v.data(), dst, bytes);
      kernels::synchronize(hook_ctx_);
      for (std::int64_t i = lo; i < hi; ++i) {
        v[static_cast<std::size_t>(i - lo)] += delta[static_cast<std::size_t>(i - at)];
      }
      kernels::copy_to_device(hook_ctx_, dst, v.data(), bytes);
      kernels::synchronize(hook_ctx_);
    }
  }
}

MemoryReport ZeroOptimizer::memory() const {
  const auto arrays = static_cast<std::int64_t>(opt_->rule().state_arrays().size());
  MemoryReport m = buffers_->memory(static_cast<int>(arrays));
  if (store_) {
    // Resident: the streaming window (an equal share per array) and the read-ahead buffers.
    const auto files = static_cast<std::int64_t>(store_->paths().size());
    const std::int64_t share = store_->window_bytes() / files;
    m.offloaded_bytes = store_->file_bytes();
    if (state_array_ >= 0) m.optimizer_bytes = arrays * share;
    if (param_array_ >= 0) m.param_bytes += share + gatherer_->fetch_bytes();
  }
  return m;
}

parallel::Range ZeroOptimizer::stored_range(int stage, bool state, std::int64_t numel, int dp,
                                            int dp_rank) {
  const optim::ZeroPolicy policy = optim::zero_policy(stage);
  if (!(state ? policy.shards_optimizer() : policy.shards_parameters())) return {0, numel};
  const parallel::Range s =
      parallel::build_shard_plan(numel, dp, optim::kShardAlign).shard(dp_rank);
  return {std::min(s.begin, numel), std::min(s.end, numel)};
}

ZeroOptimizer::TensorSlice ZeroOptimizer::params_slice() {
  const optim::ParamGradBuffers& b = *buffers_;
  if (b.full_params() != nullptr) return {b.full_params(), {0, layout_.numel()}};
  const parallel::Range s = b.shard();
  float* data = param_array_ >= 0 ? store_->mapped(param_array_) : b.master();
  return {data, {s.begin, std::min(s.end, layout_.numel())}};
}

bool ZeroOptimizer::state_on_host() const { return opt_->updates_on_host(); }

std::vector<ZeroOptimizer::NamedSlice> ZeroOptimizer::state_slices() {
  std::vector<NamedSlice> out;
  for (const optim::DistributedOptimizer::StateArray& a : opt_->state()) {
    out.push_back({a.name, {a.span.data, a.span.range}});
  }
  return out;
}

}  // namespace trident::train
