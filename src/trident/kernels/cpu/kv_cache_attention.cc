// KV-cache attention, CPU: the cache append, then OpenMP over heads (each with its own row of
// scores in the scratch); FP32 arithmetic.
#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void kv_cache_attention(const core::ExecContext& ctx, const KvCacheAttentionArgs& a) {
  const std::int64_t NH = a.num_heads, HS = a.head_dim, C = NH * HS, P = a.max_positions;
  TRIDENT_CHECK(a.position >= 0 && a.position + a.rows <= P, "kv_cache_attention: positions [",
                a.position, ", ", a.position + a.rows, ") do not fit the cache of ", P);
  TRIDENT_CHECK(
      static_cast<std::int64_t>(a.scratch.size()) >= kv_cache_attention_scratch_floats(P, NH),
      "kv_cache_attention: scratch of ", a.scratch.size(), " floats, need ",
      kv_cache_attention_scratch_floats(P, NH));
  for (std::int64_t i = 0; i < a.rows; ++i) {
    for (std::int64_t h = 0; h < NH; ++h) {
      const float* q = a.qkv + (i * NH + h) * 3 * HS;
      std::copy_n(q + HS, HS, a.k_cache + (a.position + i) * C + h * HS);
      std::copy_n(q + 2 * HS, HS, a.v_cache + (a.position + i) * C + h * HS);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  for (std::int64_t i = 0; i < a.rows; ++i) {
    const std::int64_t pos = a.position + i;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
    for (std::int64_t h = 0; h < NH; ++h) {
      const float* q = a.qkv + (i * NH + h) * 3 * HS;
      const float* kc = a.k_cache + h * HS;
      const float* vc = a.v_cache + h * HS;
      float* scores = a.scratch.data() + h * P;
      const float slope = a.alibi ? a.alibi[h] : 0.0f;
      float max_score = -INFINITY;
      for (std::int64_t t = 0; t <= pos; ++t) {
        float s = 0;
        for (std::int64_t d = 0; d < HS; ++d) s += q[d] * kc[t * C + d];
        s = s * scale + slope * static_cast<float>(t);
        scores[t] = s;
        max_score = std::max(max_score, s);
      }
      float denom = 0;
      for (std::int64_t t = 0; t <= pos; ++t) {
        scores[t] = std::exp(scores[t] - max_score);
        denom += scores[t];
      }
      float* out = a.out + i * C + h * HS;
      std::fill_n(out, HS, 0.0f);
      for (std::int64_t t = 0; t <= pos; ++t) {
        const float p = scores[t] / denom;
        for (std::int64_t d = 0; d < HS; ++d) out[d] += p * vc[t * C + d];
      }
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
