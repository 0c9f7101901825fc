// Reference causal attention forward and backward over the interleaved QKV layout: plain loops,
// double accumulation, one thread.
//
// Legend: B = batch, T = seq_len, NH = num_heads, HS = head_dim, C = NH * HS.
// q_t = qkv[b, t, h, 0, :], k_t = qkv[b, t, h, 1, :], v_t = qkv[b, t, h, 2, :].
#include <algorithm>
#include <cmath>
#include <vector>

#include "trident/kernels/attention.h"

namespace trident::kernels::ref {
namespace {

struct Layout {
  std::int64_t T, NH, HS, C;
  // Offset of q (part 0), k (1) or v (2) of head h at (b, t) in qkv.
  std::int64_t qkv(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t part) const {
    return ((b * T + t) * NH + h) * 3 * HS + part * HS;
  }
  std::int64_t out(std::int64_t b, std::int64_t t, std::int64_t h) const {
    return (b * T + t) * C + h * HS;
  }
  std::int64_t probs(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return ((b * NH + h) * T + t) * T;
  }
};

}  // namespace

// s_tc = q_t . k_c / sqrt(HS) for c <= t;  P_tc = exp(s_tc - max) / sum_c' exp(s_tc' - max)
// (P_tc = 0 for c > t);  out_t = sum_{c <= t} P_tc v_c.
template <class T>
void attention_forward(const BasicAttentionForwardArgs<T>& a) {
  const Layout L{a.seq_len, a.num_heads, a.head_dim, a.num_heads * a.head_dim};
  const double scale = 1.0 / std::sqrt(static_cast<double>(L.HS));
  std::vector<double> s(static_cast<std::size_t>(L.T));
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t h = 0; h < L.NH; ++h) {
      for (std::int64_t t = 0; t < L.T; ++t) {
        const T* q = a.qkv + L.qkv(b, t, h, 0);
        double max = -INFINITY;
        for (std::int64_t c = 0; c <= t; ++c) {
          const T* k = a.qkv + L.qkv(b, c, h, 1);
          double dot = 0.0;
          for (std::int64_t i = 0; i < L.HS; ++i) dot += static_cast<double>(q[i]) * k[i];
          s[c] = dot * scale;
          // Another document's key: probability 0 (exp(-inf)).
          if (a.doc && a.doc[b * L.T + c] != a.doc[b * L.T + t]) s[c] = -INFINITY;
          max = std::max(max, s[c]);
        }
        double sum = 0.0;
        for (std::int64_t c = 0; c <= t; ++c) sum += std::exp(s[c] - max);
        T* p = a.probs + L.probs(b, h, t);
        for (std::int64_t c = 0; c < L.T; ++c) {
          s[c] = c <= t ? std::exp(s[c] - max) / sum : 0.0;
          p[c] = static_cast<T>(s[c]);
        }
        T* o = a.out + L.out(b, t, h);
        for (std::int64_t i = 0; i < L.HS; ++i) {
          double acc = 0.0;
          for (std::int64_t c = 0; c <= t; ++c) acc += s[c] * a.qkv[L.qkv(b, c, h, 2) + i];
          o[i] = static_cast<T>(acc);
        }
      }
    }
  }
}

// With upstream gradient dO and the saved probabilities P, per (b, h):
//   dv_c  = sum_{t >= c} P_tc dO_t                         (out = P v)
//   dP_tc = dO_t . v_c                                     (c <= t)
//   dS_tc = P_tc (dP_tc - sum_{c' <= t} P_tc' dP_tc')      (softmax backward)
//   dq_t  = sum_{c <= t} dS_tc k_c / sqrt(HS)              (s = q k^T / sqrt(HS))
//   dk_c  = sum_{t >= c} dS_tc q_t / sqrt(HS)
// dS is kept in d_probs (zero above the diagonal).
template <class T>
void attention_backward(const BasicAttentionBackwardArgs<T>& a) {
  const Layout L{a.seq_len, a.num_heads, a.head_dim, a.num_heads * a.head_dim};
  const double scale = 1.0 / std::sqrt(static_cast<double>(L.HS));
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t h = 0; h < L.NH; ++h) {
      for (std::int64_t t = 0; t < L.T; ++t) {  // dS row t
        const T* p = a.probs + L.probs(b, h, t);
        T* ds = a.d_probs + L.probs(b, h, t);
        const T* dO = a.d_out + L.out(b, t, h);
        std::vector<double> dp(static_cast<std::size_t>(t + 1));
        double dot = 0.0;
        for (std::int64_t c = 0; c <= t; ++c) {
          const T* v = a.qkv + L.qkv(b, c, h, 2);
          double acc = 0.0;
          for (std::int64_t i = 0; i < L.HS; ++i) acc += static_cast<double>(dO[i]) * v[i];
          dp[c] = acc;
          dot += p[c] * acc;
        }
        for (std::int64_t c = 0; c < L.T; ++c) {
          ds[c] = c <= t ? static_cast<T>(p[c] * (dp[c] - dot)) : T(0);
        }
      }
      for (std::int64_t t = 0; t < L.T; ++t) {
        for (std::int64_t i = 0; i < L.HS; ++i) {
          double dq = 0.0, dk = 0.0, dv = 0.0;
          for (std::int64_t c = 0; c <= t; ++c) {  // queries: keys c <= t
            dq +=
                static_cast<double>(a.d_probs[L.probs(b, h, t) + c]) * a.qkv[L.qkv(b, c, h, 1) + i];
          }
          for (std::int64_t u = t; u < L.T; ++u) {  // keys/values: queries u >= t
            const double ds = a.d_probs[L.probs(b, h, u) + t];
            const double p = a.probs[L.probs(b, h, u) + t];
            dk += ds * a.qkv[L.qkv(b, u, h, 0) + i];
            dv += p * a.d_out[L.out(b, u, h) + i];
          }
          a.d_qkv[L.qkv(b, t, h, 0) + i] = static_cast<T>(dq * scale);
          a.d_qkv[L.qkv(b, t, h, 1) + i] = static_cast<T>(dk * scale);
          a.d_qkv[L.qkv(b, t, h, 2) + i] = static_cast<T>(dv);
        }
      }
    }
  }
}

template void attention_forward<float>(const BasicAttentionForwardArgs<float>&);
template void attention_forward<double>(const BasicAttentionForwardArgs<double>&);
template void attention_backward<float>(const BasicAttentionBackwardArgs<float>&);
template void attention_backward<double>(const BasicAttentionBackwardArgs<double>&);

}  // namespace trident::kernels::ref
