// Reference (double precision, scores materialized per row) of the ring attention's block ops:
// the specification the CPU and CUDA bodies are tested against. See flash_attention_block.h.
#include <cmath>
#include <vector>

#include "trident/core/error.h"
#include "trident/kernels/flash_attention_block.h"

namespace trident::kernels {

namespace {

template <class A>
void check_sizes(const char* op, const A& a) {
  TRIDENT_CHECK(a.batch >= 0 && a.q_len >= 0 && a.k_len >= 0 && a.num_heads > 0 && a.head_dim > 0 &&
                    a.total_len >= 0,
                op, ": bad sizes");
  TRIDENT_CHECK(a.dropout.p >= 0.0f && a.dropout.p < 1.0f, op,
                ": dropout probability must be in [0, 1), got ", a.dropout.p);
}

template <class T>
const T* row(const BasicHeadRows<const T>& r, std::int64_t b, std::int64_t t, std::int64_t h) {
  return r.data + b * r.batch_stride + t * r.row_stride + h * r.head_stride;
}
template <class T>
T* row(const BasicHeadRows<T>& r, std::int64_t b, std::int64_t t, std::int64_t h) {
  return r.data + b * r.batch_stride + t * r.row_stride + h * r.head_stride;
}

// The dropout multiplier of element (q_pos, k_pos) of head h of batch row b: keep / (1 - p) or 0.
template <class A>
double dropout_mult(const A& a, std::int64_t b, std::int64_t h, std::int64_t qp, std::int64_t kp) {
  if (a.dropout.p <= 0.0f) return 1.0;
  const AttentionDropout& d = a.dropout;
  const std::int64_t heads = d.total_heads > 0 ? d.total_heads : a.num_heads;
  const std::int64_t T = a.total_len;
  const auto index = static_cast<std::uint64_t>(
      ((d.first_sample + b) * heads + d.head_offset + h) * T * T + qp * T + kp);
  return dropout_keep(d.seed, d.stream, index, d.p) ? 1.0 / (1.0 - static_cast<double>(d.p)) : 0.0;
}

// s[k] for the visible keys of query row (b, h, i), -inf for the others.
template <class A>
std::vector<double> scores(const A& a, std::int64_t b, std::int64_t h, std::int64_t i) {
  std::vector<double> s(static_cast<std::size_t>(a.k_len), -INFINITY);
  const auto* qv = row(a.q, b, i, h);
  const double slope = a.alibi ? static_cast<double>(a.alibi[h]) : 0.0;
  for (std::int64_t j = 0; j < a.k_len; ++j) {
    if (a.k_pos[j] > a.q_pos[i]) continue;
    if (a.q_doc && a.q_doc[b * a.q_len + i] != a.k_doc[b * a.k_len + j]) continue;
    const auto* kv = row(a.k, b, j, h);
    double dot = 0;
    for (std::int64_t d = 0; d < a.head_dim; ++d)
      dot += static_cast<double>(qv[d]) * static_cast<double>(kv[d]);
    s[static_cast<std::size_t>(j)] =
        dot / std::sqrt(static_cast<double>(a.head_dim)) + slope * static_cast<double>(a.k_pos[j]);
  }
  return s;
}

}  // namespace

namespace ref {

template <class T>
void flash_attention_block_forward(const BasicFlashAttentionBlockArgs<T>& a) {
  check_sizes("ref::flash_attention_block_forward", a);
  const std::int64_t NH = a.num_heads, HS = a.head_dim, C = NH * HS;
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      for (std::int64_t i = 0; i < a.q_len; ++i) {
        const std::vector<double> s = scores(a, b, h, i);
        double mx = -INFINITY;
        for (double x : s) mx = std::max(mx, x);
        T* o = a.out + (b * a.q_len + i) * C + h * HS;
        T& lse = a.lse[(b * NH + h) * a.q_len + i];
        if (mx == -INFINITY) {  // no visible key
          for (std::int64_t d = 0; d < HS; ++d) o[d] = T(0);
          lse = static_cast<T>(-INFINITY);
          continue;
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x - mx);
        const double l = mx + std::log(sum);
        for (std::int64_t d = 0; d < HS; ++d) {
          double acc = 0;
          for (std::int64_t j = 0; j < a.k_len; ++j) {
            const double sj = s[static_cast<std::size_t>(j)];
            if (sj == -INFINITY) continue;
            acc += std::exp(sj - l) * dropout_mult(a, b, h, a.q_pos[i], a.k_pos[j]) *
                   static_cast<double>(row(a.v, b, j, h)[d]);
          }
          o[d] = static_cast<T>(acc);
        }
        lse = static_cast<T>(l);
      }
    }
  }
}

template <class T>
void flash_attention_merge(const BasicFlashAttentionMergeArgs<T>& a) {
  TRIDENT_CHECK(a.batch >= 0 && a.seq_len >= 0 && a.num_heads > 0 && a.head_dim > 0,
                "ref::flash_attention_merge: bad sizes");
  const std::int64_t NH = a.num_heads, HS = a.head_dim, C = NH * HS;
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      for (std::int64_t t = 0; t < a.seq_len; ++t) {
        T& lse = a.lse[(b * NH + h) * a.seq_len + t];
        const double l1 = static_cast<double>(lse);
        const double l2 = static_cast<double>(a.lse_blk[(b * NH + h) * a.seq_len + t]);
        if (l2 == -INFINITY) continue;  // nothing to add
        T* o = a.out + (b * a.seq_len + t) * C + h * HS;
        const T* ob = a.out_blk + (b * a.seq_len + t) * C + h * HS;
        const double mx = std::max(l1, l2);
        const double l = mx + std::log(std::exp(l1 - mx) + std::exp(l2 - mx));
        const double w1 = std::exp(l1 - l), w2 = std::exp(l2 - l);  // w1 = 0 for l1 = -inf
        for (std::int64_t d = 0; d < HS; ++d) {
          o[d] = static_cast<T>((l1 == -INFINITY ? 0.0 : w1 * static_cast<double>(o[d])) +
                                w2 * static_cast<double>(ob[d]));
        }
        lse = static_cast<T>(l);
      }
    }
  }
}

template <class T>
void flash_attention_block_backward(const BasicFlashAttentionBlockBackwardArgs<T>& a) {
  check_sizes("ref::flash_attention_block_backward", a);
  const std::int64_t NH = a.num_heads, HS = a.head_dim, C = NH * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t h = 0; h < NH; ++h) {
      std::vector<double> dq(static_cast<std::size_t>(a.q_len * HS), 0.0);
      std::vector<double> dk(static_cast<std::size_t>(a.k_len * HS), 0.0), dv(dk.size(), 0.0);
      for (std::int64_t i = 0; i < a.q_len; ++i) {
        const double lse = static_cast<double>(a.lse[(b * NH + h) * a.q_len + i]);
        if (lse == -INFINITY) continue;  // no key anywhere: no gradient
        const std::vector<double> s = scores(a, b, h, i);
        const T* d_o = a.d_out + (b * a.q_len + i) * C + h * HS;
        const T* o = a.out + (b * a.q_len + i) * C + h * HS;
        double D = 0;
        for (std::int64_t d = 0; d < HS; ++d)
          D += static_cast<double>(d_o[d]) * static_cast<double>(o[d]);
        const auto* qv = row(a.q, b, i, h);
        for (std::int64_t j = 0; j < a.k_len; ++j) {
          const double sj = s[static_cast<std::size_t>(j)];
          if (sj == -INFINITY) continue;
          const double p = std::exp(sj - lse);
          const double m = dropout_mult(a, b, h, a.q_pos[i], a.k_pos[j]);
          const auto* kv = row(a.k, b, j, h);
          const auto* vv = row(a.v, b, j, h);
          double dpv = 0;
          for (std::int64_t d = 0; d < HS; ++d)
            dpv += static_cast<double>(d_o[d]) * static_cast<double>(vv[d]);
          const double ds = p * (m * dpv - D) * scale;
          for (std::int64_t d = 0; d < HS; ++d) {
            const auto dd = static_cast<std::size_t>(d);
            dv[static_cast<std::size_t>(j * HS) + dd] += p * m * static_cast<double>(d_o[d]);
            dq[static_cast<std::size_t>(i * HS) + dd] += ds * static_cast<double>(kv[d]);
            dk[static_cast<std::size_t>(j * HS) + dd] += ds * static_cast<double>(qv[d]);
          }
        }
      }
      for (std::int64_t i = 0; i < a.q_len; ++i) {
        T* out = row(a.d_q, b, i, h);
        for (std::int64_t d = 0; d < HS; ++d)
          out[d] = static_cast<T>(static_cast<double>(out[d]) +
                                  dq[static_cast<std::size_t>(i * HS + d)]);
      }
      for (std::int64_t j = 0; j < a.k_len; ++j) {
        T* gk = row(a.d_k, b, j, h);
        T* gv = row(a.d_v, b, j, h);
        for (std::int64_t d = 0; d < HS; ++d) {
          const auto e = static_cast<std::size_t>(j * HS + d);
          gk[d] = static_cast<T>((a.accumulate_dkv ? static_cast<double>(gk[d]) : 0.0) + dk[e]);
          gv[d] = static_cast<T>((a.accumulate_dkv ? static_cast<double>(gv[d]) : 0.0) + dv[e]);
        }
      }
    }
  }
}

template void flash_attention_block_forward<float>(const BasicFlashAttentionBlockArgs<float>&);
template void flash_attention_block_forward<double>(const BasicFlashAttentionBlockArgs<double>&);
template void flash_attention_merge<float>(const BasicFlashAttentionMergeArgs<float>&);
template void flash_attention_merge<double>(const BasicFlashAttentionMergeArgs<double>&);
template void flash_attention_block_backward<float>(
    const BasicFlashAttentionBlockBackwardArgs<float>&);
template void flash_attention_block_backward<double>(
    const BasicFlashAttentionBlockBackwardArgs<double>&);

}  // namespace ref

}  // namespace trident::kernels
