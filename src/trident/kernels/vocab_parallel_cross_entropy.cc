// Backend dispatch of vocab_parallel_cross_entropy.h; the CPU bodies are in
// kernels/cpu/vocab_parallel_cross_entropy.cc (one per instruction-set variant), the reference in
// kernels/ref/.
#include "trident/kernels/vocab_parallel_cross_entropy.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void vocab_parallel_ce_max(const core::ExecContext& ctx, const VocabParallelCeMaxArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kLoss, "vocab_parallel_ce_max");
  TRIDENT_DISPATCH(vocab_parallel_ce_max, ctx, args);
}

void vocab_parallel_ce_sum_target(const core::ExecContext& ctx,
                                  const VocabParallelCeSumArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kLoss, "vocab_parallel_ce_sum_target");
  TRIDENT_DISPATCH(vocab_parallel_ce_sum_target, ctx, args);
}

void vocab_parallel_ce_loss(const core::ExecContext& ctx, const VocabParallelCeLossArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kLoss, "vocab_parallel_ce_loss");
  TRIDENT_DISPATCH(vocab_parallel_ce_loss, ctx, args);
}

TokenLossSum sum_token_losses(const core::ExecContext& ctx, const float* losses,
                              const std::int32_t* targets, std::int64_t rows) {
  const core::profile::Scope prof(core::profile::Kind::kLoss, "sum_token_losses");
  TRIDENT_DISPATCH(sum_token_losses, ctx, losses, targets, rows);
}

namespace {

constexpr core::DType kF32 = core::DType::kF32, kI32 = core::DType::kI32;

// The shard (vocab_local from the logits' columns) after checking the logits view.
VocabParallelShard shard_of(const char* op, const core::TensorView& logits, std::int64_t vocab,
                            std::int64_t vocab_start, const core::ExecContext& ctx) {
  detail::check_rank(op, "logits", logits, 2);
  detail::check_view(op, "logits", logits, kF32, logits.shape, ctx);
  return {.vocab = vocab, .vocab_start = vocab_start, .vocab_local = logits.shape[1]};
}

}  // namespace

void vocab_parallel_ce_max(const core::ExecContext& ctx, const VocabParallelCeMaxViews& v) {
  constexpr const char* op = "vocab_parallel_ce_max";
  const VocabParallelShard shard = shard_of(op, v.logits, v.vocab, v.vocab_start, ctx);
  const std::int64_t rows = v.logits.shape[0];
  detail::check_view(op, "row_max", v.row_max, kF32, {rows}, ctx);
  vocab_parallel_ce_max(ctx, {.row_max = v.row_max.as<float>(),
                              .logits = v.logits.as<float>(),
                              .rows = rows,
                              .shard = shard});
}

void vocab_parallel_ce_sum_target(const core::ExecContext& ctx, const VocabParallelCeSumViews& v) {
  constexpr const char* op = "vocab_parallel_ce_sum_target";
  const VocabParallelShard shard = shard_of(op, v.logits, v.vocab, v.vocab_start, ctx);
  const std::int64_t rows = v.logits.shape[0];
  detail::check_views(
      op, ctx, kF32, {rows},
      {{"sum_exp", v.sum_exp}, {"target_logit", v.target_logit}, {"row_max", v.row_max}});
  detail::check_view(op, "targets", v.targets, kI32, {rows}, ctx);
  vocab_parallel_ce_sum_target(ctx, {.sum_exp = v.sum_exp.as<float>(),
                                     .target_logit = v.target_logit.as<float>(),
                                     .logits = v.logits.as<float>(),
                                     .row_max = v.row_max.as<float>(),
                                     .targets = v.targets.as<std::int32_t>(),
                                     .rows = rows,
                                     .shard = shard});
}

void vocab_parallel_ce_loss(const core::ExecContext& ctx, const VocabParallelCeLossViews& v) {
  constexpr const char* op = "vocab_parallel_ce_loss";
  const VocabParallelShard shard = shard_of(op, v.logits, v.vocab, v.vocab_start, ctx);
  const std::int64_t rows = v.logits.shape[0];
  detail::check_optional_view(op, "d_logits", v.d_logits, kF32, v.logits.shape, ctx);
  detail::check_views(op, ctx, kF32, {rows},
                      {{"losses", v.losses},
                       {"row_max", v.row_max},
                       {"sum_exp", v.sum_exp},
                       {"target_logit", v.target_logit}});
  detail::check_view(op, "targets", v.targets, kI32, {rows}, ctx);
  vocab_parallel_ce_loss(ctx, {.losses = v.losses.as<float>(),
                               .d_logits = detail::data_or_null<float>(v.d_logits),
                               .logits = v.logits.as<float>(),
                               .row_max = v.row_max.as<float>(),
                               .sum_exp = v.sum_exp.as<float>(),
                               .target_logit = v.target_logit.as<float>(),
                               .targets = v.targets.as<std::int32_t>(),
                               .d_scale = v.d_scale,
                               .rows = rows,
                               .shard = shard});
}

TokenLossSum sum_token_losses(const core::ExecContext& ctx, const TokenLossViews& v) {
  constexpr const char* op = "sum_token_losses";
  detail::check_rank(op, "losses", v.losses, 1);
  const std::int64_t rows = v.losses.shape[0];
  detail::check_view(op, "losses", v.losses, kF32, {rows}, ctx);
  detail::check_view(op, "targets", v.targets, kI32, {rows}, ctx);
  return sum_token_losses(ctx, v.losses.as<float>(), v.targets.as<std::int32_t>(), rows);
}

void accumulate_token_losses(const core::ExecContext& ctx, const TokenLossViews& v,
                             TokenLossSum* acc) {
  constexpr const char* op = "accumulate_token_losses";
  detail::check_rank(op, "losses", v.losses, 1);
  const std::int64_t rows = v.losses.shape[0];
  detail::check_view(op, "losses", v.losses, kF32, {rows}, ctx);
  detail::check_view(op, "targets", v.targets, kI32, {rows}, ctx);
  TRIDENT_CHECK(acc != nullptr, op, ": a null accumulator");
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    const core::profile::Scope prof(core::profile::Kind::kLoss, op);
    return cuda::accumulate_token_losses(ctx, v.losses.as<float>(), v.targets.as<std::int32_t>(),
                                         rows, acc);
#else
    no_cuda_backend(op);
#endif
  }
  const TokenLossSum s =
      sum_token_losses(ctx, v.losses.as<float>(), v.targets.as<std::int32_t>(), rows);
  acc->sum += s.sum;
  acc->count += s.count;
}

}  // namespace trident::kernels
