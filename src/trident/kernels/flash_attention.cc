// Flash attention: the backend dispatch of flash_attention.h, the dropout mask rule and the ALiBi
// slopes (shared by every backend and the reference).
#include "trident/kernels/flash_attention.h"

#include <cmath>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/core/rng.h"
#include "trident/kernels/attention_views.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

bool dropout_keep(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, float p) {
  const std::uint64_t block = index >> 2;
  const core::Philox4x32 r = core::philox4x32(
      {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
       static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  return static_cast<double>(r[index & 3]) >= std::floor(static_cast<double>(p) * 0x1.0p32);
}

void alibi_slopes(std::int64_t n, float* slopes) {
  TRIDENT_CHECK(n > 0, "alibi_slopes: need a positive head count, got ", n);
  auto power_of_two_slopes = [](std::int64_t m, std::vector<double>& out) {
    const double start = std::pow(2.0, -8.0 / static_cast<double>(m));
    for (std::int64_t i = 0; i < m; ++i) out.push_back(std::pow(start, static_cast<double>(i + 1)));
  };
  std::int64_t closest = 1;
  while (closest * 2 <= n) closest *= 2;
  std::vector<double> s;
  power_of_two_slopes(closest, s);
  if (closest < n) {
    std::vector<double> extra;
    power_of_two_slopes(2 * closest, extra);
    for (std::int64_t i = 0; static_cast<std::int64_t>(s.size()) < n; i += 2) {
      s.push_back(extra[static_cast<std::size_t>(i)]);
    }
  }
  for (std::int64_t i = 0; i < n; ++i)
    slopes[i] = static_cast<float>(s[static_cast<std::size_t>(i)]);
}

void flash_attention_forward(const core::ExecContext& ctx, const FlashAttentionForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kAttention, "flash_attention_forward");
  TRIDENT_DISPATCH(flash_attention_forward, ctx, args);
}

void flash_attention_backward(const core::ExecContext& ctx,
                              const FlashAttentionBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kAttention, "flash_attention_backward");
  TRIDENT_DISPATCH(flash_attention_backward, ctx, args);
}

void flash_attention(const core::ExecContext& ctx, const FlashAttentionViews& v) {
  constexpr const char* op = "flash_attention";
  const detail::AttentionSizes s = detail::attention_sizes(op, v.qkv, ctx);
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_view(op, "out", v.out, f32, s.out(), ctx);
  detail::check_view(op, "lse", v.lse, f32, s.lse(), ctx);
  detail::check_optional_view(op, "alibi", v.alibi, f32, {s.num_heads}, ctx);
  detail::check_optional_view(op, "doc", v.doc, core::DType::kI32, s.tokens(), ctx);
  flash_attention_forward(ctx, {.out = v.out.as<float>(),
                                .lse = v.lse.as<float>(),
                                .qkv = v.qkv.as<float>(),
                                .alibi = detail::data_or_null<float>(v.alibi),
                                .dropout = v.dropout,
                                .batch = s.batch,
                                .seq_len = s.seq_len,
                                .num_heads = s.num_heads,
                                .head_dim = s.head_dim,
                                .doc = detail::data_or_null<std::int32_t>(v.doc)});
}

void flash_attention_backward(const core::ExecContext& ctx, const FlashAttentionBackwardViews& v) {
  constexpr const char* op = "flash_attention_backward";
  const detail::AttentionSizes s = detail::attention_sizes(op, v.qkv, ctx);
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_view(op, "d_qkv", v.d_qkv, f32, v.qkv.shape, ctx);
  detail::check_views(op, ctx, f32, s.out(), {{"d_out", v.d_out}, {"out", v.out}});
  detail::check_view(op, "lse", v.lse, f32, s.lse(), ctx);
  detail::check_optional_view(op, "alibi", v.alibi, f32, {s.num_heads}, ctx);
  detail::check_optional_view(op, "doc", v.doc, core::DType::kI32, s.tokens(), ctx);
  flash_attention_backward(
      ctx, FlashAttentionBackwardArgs{.d_qkv = v.d_qkv.as<float>(),
                                      .d_out = v.d_out.as<float>(),
                                      .qkv = v.qkv.as<float>(),
                                      .out = v.out.as<float>(),
                                      .lse = v.lse.as<float>(),
                                      .alibi = detail::data_or_null<float>(v.alibi),
                                      .dropout = v.dropout,
                                      .batch = s.batch,
                                      .seq_len = s.seq_len,
                                      .num_heads = s.num_heads,
                                      .head_dim = s.head_dim,
                                      .doc = detail::data_or_null<std::int32_t>(v.doc)});
}

}  // namespace trident::kernels
