// Backend dispatch of attention.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/attention.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/attention.h"

#include "trident/core/profile.h"
#include "trident/kernels/attention_views.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void attention_forward(const core::ExecContext& ctx, const AttentionForwardArgs& args) {
  const core::profile::Scope prof(
      core::profile::Kind::kAttention, "attention_forward",
      2.0 * args.batch * args.seq_len * args.seq_len * args.num_heads * args.head_dim, 0);
  TRIDENT_DISPATCH(attention_forward, ctx, args);
}

void attention_backward(const core::ExecContext& ctx, const AttentionBackwardArgs& args) {
  const core::profile::Scope prof(
      core::profile::Kind::kAttention, "attention_backward",
      4.0 * args.batch * args.seq_len * args.seq_len * args.num_heads * args.head_dim, 0);
  TRIDENT_DISPATCH(attention_backward, ctx, args);
}

void attention(const core::ExecContext& ctx, const AttentionViews& v) {
  constexpr const char* op = "attention";
  const detail::AttentionSizes s = detail::attention_sizes(op, v.qkv, ctx);
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_view(op, "out", v.out, f32, s.out(), ctx);
  detail::check_view(op, "probs", v.probs, f32, s.probs(), ctx);
  detail::check_optional_view(op, "doc", v.doc, core::DType::kI32, s.tokens(), ctx);
  attention_forward(ctx, {.out = v.out.as<float>(),
                          .probs = v.probs.as<float>(),
                          .qkv = v.qkv.as<float>(),
                          .batch = s.batch,
                          .seq_len = s.seq_len,
                          .num_heads = s.num_heads,
                          .head_dim = s.head_dim,
                          .doc = detail::data_or_null<std::int32_t>(v.doc)});
}

void attention_backward(const core::ExecContext& ctx, const AttentionBackwardViews& v) {
  constexpr const char* op = "attention_backward";
  const detail::AttentionSizes s = detail::attention_sizes(op, v.qkv, ctx);
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_view(op, "d_qkv", v.d_qkv, f32, v.qkv.shape, ctx);
  detail::check_views(op, ctx, f32, s.probs(), {{"d_probs", v.d_probs}, {"probs", v.probs}});
  detail::check_view(op, "d_out", v.d_out, f32, s.out(), ctx);
  attention_backward(ctx, AttentionBackwardArgs{.d_qkv = v.d_qkv.as<float>(),
                                                .d_probs = v.d_probs.as<float>(),
                                                .d_out = v.d_out.as<float>(),
                                                .qkv = v.qkv.as<float>(),
                                                .probs = v.probs.as<float>(),
                                                .batch = s.batch,
                                                .seq_len = s.seq_len,
                                                .num_heads = s.num_heads,
                                                .head_dim = s.head_dim});
}

}  // namespace trident::kernels
