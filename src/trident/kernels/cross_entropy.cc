// Backend dispatch of cross_entropy.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/cross_entropy.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/cross_entropy.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void cross_entropy_forward_backward(const core::ExecContext& ctx, const CrossEntropyArgs& args) {
  const core::profile::Scope prof(
      core::profile::Kind::kLoss, "cross_entropy_forward_backward", 0,
      4.0 * (args.d_logits != nullptr ? 2 : 1) * args.rows * args.vocab_padded);
  TRIDENT_DISPATCH(cross_entropy_forward_backward, ctx, args);
}

void cross_entropy_forward_backward(const core::ExecContext& ctx, const CrossEntropyViews& v) {
  constexpr const char* op = "cross_entropy_forward_backward";
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_rank(op, "logits", v.logits, 2);
  const std::int64_t rows = v.logits.shape[0], vocab_padded = v.logits.shape[1];
  detail::check_view(op, "logits", v.logits, f32, v.logits.shape, ctx);
  detail::check_optional_view(op, "d_logits", v.d_logits, f32, v.logits.shape, ctx);
  detail::check_view(op, "losses", v.losses, f32, {rows}, ctx);
  detail::check_view(op, "targets", v.targets, core::DType::kI32, {rows}, ctx);
  cross_entropy_forward_backward(ctx, {.losses = v.losses.as<float>(),
                                       .d_logits = detail::data_or_null<float>(v.d_logits),
                                       .logits = v.logits.as<float>(),
                                       .targets = v.targets.as<std::int32_t>(),
                                       .d_scale = v.d_scale,
                                       .rows = rows,
                                       .vocab = v.vocab,
                                       .vocab_padded = vocab_padded});
}

}  // namespace trident::kernels
