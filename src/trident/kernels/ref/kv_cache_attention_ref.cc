// Reference KV-cache attention: double, one thread.
#include <algorithm>
#include <cmath>
#include <vector>

#include "trident/kernels/kv_cache_attention.h"

namespace trident::kernels::ref {

void kv_cache_attention(const KvCacheAttentionArgs& a) {
  const std::int64_t NH = a.num_heads, HS = a.head_dim, C = NH * HS;
  for (std::int64_t i = 0; i < a.rows; ++i) {
    const std::int64_t pos = a.position + i;
    for (std::int64_t h = 0; h < NH; ++h) {
      const float* q = a.qkv + (i * NH + h) * 3 * HS;
      std::copy_n(q + HS, HS, a.k_cache + pos * C + h * HS);
      std::copy_n(q + 2 * HS, HS, a.v_cache + pos * C + h * HS);
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  std::vector<double> s;
  for (std::int64_t i = 0; i < a.rows; ++i) {
    const std::int64_t pos = a.position + i;
    for (std::int64_t h = 0; h < NH; ++h) {
      const float* q = a.qkv + (i * NH + h) * 3 * HS;
      s.assign(static_cast<std::size_t>(pos + 1), 0.0);
      double mx = -INFINITY;
      for (std::int64_t t = 0; t <= pos; ++t) {
        double dot = 0;
        for (std::int64_t d = 0; d < HS; ++d) dot += double(q[d]) * a.k_cache[t * C + h * HS + d];
        const double slope = a.alibi ? a.alibi[h] : 0.0;
        s[t] = dot * scale + slope * static_cast<double>(t);
        mx = std::max(mx, s[t]);
      }
      double denom = 0;
      for (double& v : s) denom += (v = std::exp(v - mx));
      for (std::int64_t d = 0; d < HS; ++d) {
        double acc = 0;
        for (std::int64_t t = 0; t <= pos; ++t) acc += s[t] / denom * a.v_cache[t * C + h * HS + d];
        a.out[i * C + h * HS + d] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace trident::kernels::ref
