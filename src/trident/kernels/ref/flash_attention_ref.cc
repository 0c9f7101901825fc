// Reference (double precision, materialized scores) flash attention: the specification the CPU
// and GPU flash kernels are tested against. See flash_attention.h.
#include <cmath>
#include <vector>

#include "trident/core/error.h"
#include "trident/kernels/flash_attention.h"

namespace trident::kernels {

namespace {

struct Geometry {
  std::int64_t B, T, NH, HS, C, ld;  // ld: row stride of qkv (3C)
  float scale;
};

Geometry geometry(const char* op, std::int64_t B, std::int64_t T, std::int64_t NH,
                  std::int64_t HS) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && NH > 0 && HS > 0, op, ": bad sizes batch=", B, " seq_len=", T,
                " num_heads=", NH, " head_dim=", HS);
  return {B, T, NH, HS, NH * HS, 3 * NH * HS, 1.0f / std::sqrt(static_cast<float>(HS))};
}

std::uint64_t dropout_index(const AttentionDropout& d, std::int64_t NH, std::int64_t T,
                            std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k) {
  const std::int64_t heads = d.total_heads > 0 ? d.total_heads : NH;
  return static_cast<std::uint64_t>(((d.first_sample + b) * heads + d.head_offset + h) * T * T +
                                    q * T + k);
}

}  // namespace

namespace ref {

// Scores, probabilities and their gradients materialized per (b, h) in double.
void flash_attention_forward(const FlashAttentionForwardArgs& a) {
  const Geometry g =
      geometry("ref::flash_attention_forward", a.batch, a.seq_len, a.num_heads, a.head_dim);
  const double keep_scale = 1.0 / (1.0 - a.dropout.p);
  for (std::int64_t b = 0; b < g.B; ++b) {
    for (std::int64_t h = 0; h < g.NH; ++h) {
      const float* base = a.qkv + b * g.T * g.ld + h * 3 * g.HS;
      const double slope = a.alibi ? a.alibi[h] : 0.0;
      for (std::int64_t q = 0; q < g.T; ++q) {
        std::vector<double> s(static_cast<std::size_t>(q + 1));
        double mx = -INFINITY;
        for (std::int64_t k = 0; k <= q; ++k) {
          double dot = 0;
          for (std::int64_t d = 0; d < g.HS; ++d)
            dot += static_cast<double>(base[q * g.ld + d]) * base[k * g.ld + g.HS + d];
          s[static_cast<std::size_t>(k)] =
              dot / std::sqrt(static_cast<double>(g.HS)) + slope * static_cast<double>(k);
          if (a.doc && a.doc[b * g.T + k] != a.doc[b * g.T + q])
            s[static_cast<std::size_t>(k)] = -INFINITY;  // another document
          mx = std::max(mx, s[static_cast<std::size_t>(k)]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        float* o = a.out + (b * g.T + q) * g.C + h * g.HS;
        for (std::int64_t d = 0; d < g.HS; ++d) {
          double acc = 0;
          for (std::int64_t k = 0; k <= q; ++k) {
            double p = s[static_cast<std::size_t>(k)] / sum;
            if (a.dropout.p > 0.0f) {
              p = dropout_keep(a.dropout.seed, a.dropout.stream,
                               dropout_index(a.dropout, g.NH, g.T, b, h, q, k), a.dropout.p)
                      ? p * keep_scale
                      : 0.0;
            }
            acc += p * base[k * g.ld + 2 * g.HS + d];
          }
          o[d] = static_cast<float>(acc);
        }
        a.lse[(b * g.NH + h) * g.T + q] = static_cast<float>(mx + std::log(sum));
      }
    }
  }
}

void flash_attention_backward(const FlashAttentionBackwardArgs& a) {
  const Geometry g =
      geometry("ref::flash_attention_backward", a.batch, a.seq_len, a.num_heads, a.head_dim);
  const double keep_scale = 1.0 / (1.0 - a.dropout.p);
  const double scale = 1.0 / std::sqrt(static_cast<double>(g.HS));
  for (std::int64_t b = 0; b < g.B; ++b) {
    for (std::int64_t h = 0; h < g.NH; ++h) {
      const float* base = a.qkv + b * g.T * g.ld + h * 3 * g.HS;
      float* dbase = a.d_qkv + b * g.T * g.ld + h * 3 * g.HS;
      const double slope = a.alibi ? a.alibi[h] : 0.0;
      std::vector<double> dqkv(static_cast<std::size_t>(g.T * 3 * g.HS), 0.0);
      for (std::int64_t q = 0; q < g.T; ++q) {
        // P (undropped), the dropout multipliers and dO . v for each key.
        std::vector<double> p(static_cast<std::size_t>(q + 1)), mult(p.size(), 1.0), dpt(p.size());
        double mx = -INFINITY;
        for (std::int64_t k = 0; k <= q; ++k) {
          double dot = 0;
          for (std::int64_t d = 0; d < g.HS; ++d)
            dot += static_cast<double>(base[q * g.ld + d]) * base[k * g.ld + g.HS + d];
          p[static_cast<std::size_t>(k)] = dot * scale + slope * static_cast<double>(k);
          if (a.doc && a.doc[b * g.T + k] != a.doc[b * g.T + q])
            p[static_cast<std::size_t>(k)] = -INFINITY;  // another document
          mx = std::max(mx, p[static_cast<std::size_t>(k)]);
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (double& x : p) x /= sum;
        const float* d_o = a.d_out + (b * g.T + q) * g.C + h * g.HS;
        for (std::int64_t k = 0; k <= q; ++k) {
          if (a.dropout.p > 0.0f) {
            mult[static_cast<std::size_t>(k)] =
                dropout_keep(a.dropout.seed, a.dropout.stream,
                             dropout_index(a.dropout, g.NH, g.T, b, h, q, k), a.dropout.p)
                    ? keep_scale
                    : 0.0;
          }
          double dot = 0;
          for (std::int64_t d = 0; d < g.HS; ++d)
            dot += static_cast<double>(d_o[d]) * base[k * g.ld + 2 * g.HS + d];
          dpt[static_cast<std::size_t>(k)] = dot;  // gradient of the dropped probability
          // dV += (p * mult) dO
          for (std::int64_t d = 0; d < g.HS; ++d) {
            dqkv[static_cast<std::size_t>(k * 3 * g.HS + 2 * g.HS + d)] +=
                p[static_cast<std::size_t>(k)] * mult[static_cast<std::size_t>(k)] * d_o[d];
          }
        }
        // Softmax backward on dP = dP~ * mult.
        double inner = 0;
        for (std::int64_t k = 0; k <= q; ++k) {
          inner += p[static_cast<std::size_t>(k)] * dpt[static_cast<std::size_t>(k)] *
                   mult[static_cast<std::size_t>(k)];
        }
        for (std::int64_t k = 0; k <= q; ++k) {
          const double ds =
              p[static_cast<std::size_t>(k)] *
              (dpt[static_cast<std::size_t>(k)] * mult[static_cast<std::size_t>(k)] - inner) *
              scale;
          for (std::int64_t d = 0; d < g.HS; ++d) {
            dqkv[static_cast<std::size_t>(q * 3 * g.HS + d)] += ds * base[k * g.ld + g.HS + d];
            dqkv[static_cast<std::size_t>(k * 3 * g.HS + g.HS + d)] += ds * base[q * g.ld + d];
          }
        }
      }
      for (std::int64_t t = 0; t < g.T; ++t) {
        for (std::int64_t j = 0; j < 3 * g.HS; ++j) {
          dbase[t * g.ld + j] =
              static_cast<float>(dqkv[static_cast<std::size_t>(t * 3 * g.HS + j)]);
        }
      }
    }
  }
}

}  // namespace ref

}  // namespace trident::kernels
