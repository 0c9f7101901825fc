// Backend dispatch of kv_cache_attention.h; the CPU bodies are in kernels/cpu/kv_cache_attention.cc
// (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/kv_cache_attention.h"

#include "trident/core/error.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

std::int64_t kv_cache_attention_scratch_floats(std::int64_t max_positions, std::int64_t num_heads) {
  return max_positions * num_heads;
}

void kv_cache_attention(const core::ExecContext& ctx, const KvCacheAttentionArgs& args) {
  TRIDENT_DISPATCH(kv_cache_attention, ctx, args);
}

void kv_cache_attention(const core::ExecContext& ctx, const KvCacheAttentionViews& v) {
  constexpr const char* op = "kv_cache_attention";
  constexpr core::DType f32 = core::DType::kF32;
  detail::check_rank(op, "qkv", v.qkv, 3);
  TRIDENT_CHECK(v.qkv.shape[2] % 3 == 0, op, ": view `qkv` has shape ",
                core::to_string(v.qkv.shape),
                "; its last dimension must be 3 * head_dim (each head's q, k and v)");
  const std::int64_t rows = v.qkv.shape[0], NH = v.qkv.shape[1], HS = v.qkv.shape[2] / 3;
  detail::check_view(op, "qkv", v.qkv, f32, v.qkv.shape, ctx);
  detail::check_view(op, "out", v.out, f32, {rows, NH * HS}, ctx);
  detail::check_rank(op, "k_cache", v.k_cache, 2);
  const std::int64_t max_positions = v.k_cache.shape[0];
  detail::check_views(op, ctx, f32, {max_positions, NH * HS},
                      {{"k_cache", v.k_cache}, {"v_cache", v.v_cache}});
  detail::check_optional_view(op, "alibi", v.alibi, f32, {NH}, ctx);
  kv_cache_attention(ctx, KvCacheAttentionArgs{.out = v.out.as<float>(),
                                               .k_cache = v.k_cache.as<float>(),
                                               .v_cache = v.v_cache.as<float>(),
                                               .qkv = v.qkv.as<float>(),
                                               .alibi = detail::data_or_null<float>(v.alibi),
                                               .rows = rows,
                                               .position = v.position,
                                               .max_positions = max_positions,
                                               .num_heads = NH,
                                               .head_dim = HS,
                                               .scratch = v.scratch});
}

}  // namespace trident::kernels
