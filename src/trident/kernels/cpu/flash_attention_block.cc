// CPU bodies of the ring attention's block ops (flash_attention_block.h). The forward follows
// cpu/flash_attention.cc: OpenMP over (batch, head, query block), each task streaming the block's
// keys in blocks with an online softmax; the mask is by global position (k_pos <= q_pos) and the
// dropout mask is drawn for the global (q_pos, k_pos), in one vectorized run where a key block's
// positions are consecutive. The backward gives one task per (batch, head), as the full backward
// does: dk and dv of a key gather every query's contribution, so no atomics and a fixed order.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

constexpr std::int64_t kBq = 32;  // query rows per task
constexpr std::int64_t kBk = 64;  // key rows per inner block

template <class R>
auto* head_row(const R& r, std::int64_t b, std::int64_t t, std::int64_t h) {
  return r.data + b * r.batch_stride + t * r.row_stride + h * r.head_stride;
}

struct DropoutRule {
  AttentionDropout d;
  std::uint64_t threshold = 0;
  std::int64_t heads = 0, T = 0;  // total heads, global sequence length
  float keep_scale = 1.0f;
  bool on() const { return d.p > 0.0f; }
  std::uint64_t index(std::int64_t b, std::int64_t h, std::int64_t qp, std::int64_t kp) const {
    return static_cast<std::uint64_t>(((d.first_sample + b) * heads + d.head_offset + h) * T * T +
                                      qp * T + kp);
  }
};

template <class A>
DropoutRule dropout_rule(const A& a) {
  return {a.dropout, detail::dropout_threshold(a.dropout.p),
          a.dropout.total_heads > 0 ? a.dropout.total_heads : a.num_heads, a.total_len,
          1.0f / (1.0f - a.dropout.p)};
}

// keep[j] (1 kept, 0 dropped) for the keys k0 .. k0 + n - 1 of query position qp.
void keep_flags(const DropoutRule& r, std::int64_t b, std::int64_t h, std::int64_t qp,
                const std::int32_t* k_pos, std::int64_t k0, std::int64_t n, float* keep) {
  bool consecutive = true;
  for (std::int64_t j = 1; j < n; ++j) consecutive &= k_pos[k0 + j] == k_pos[k0] + j;
  if (consecutive) {
    detail::dropout_keep_run(r.d.seed, r.d.stream, r.index(b, h, qp, k_pos[k0]), n, r.threshold,
                             keep);
    return;
  }
  for (std::int64_t j = 0; j < n; ++j) {
    keep[j] = detail::dropout_keep_bits(r.d.seed, r.d.stream, r.index(b, h, qp, k_pos[k0 + j]),
                                        r.threshold)
                  ? 1.0f
                  : 0.0f;
  }
}

}  // namespace

void flash_attention_block_forward(const core::ExecContext& ctx, const FlashAttentionBlockArgs& a) {
  const std::int64_t NH = a.num_heads, HS = a.head_dim, C = NH * HS, Tq = a.q_len, Tk = a.k_len;
  if (a.batch == 0 || Tq == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const DropoutRule drop = dropout_rule(a);
  const std::int64_t num_qb = (Tq + kBq - 1) / kBq;
  const int threads = detail::num_threads(ctx);
  core::Workspace& ws = ctx.scratch();
  ws.prepare(threads, 5);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const auto n_s = static_cast<std::size_t>(kBq * kBk),
               n_acc = static_cast<std::size_t>(kBq * HS);
    const std::span<float> s(ws.floats(t, 0, n_s), n_s), acc(ws.floats(t, 1, n_acc), n_acc);
    const std::span<float> m(ws.floats(t, 2, kBq), kBq), l(ws.floats(t, 3, kBq), kBq);
    float* keep = ws.floats(t, 4, kBk);
#pragma omp for collapse(3) schedule(dynamic)
    for (std::int64_t b = 0; b < a.batch; ++b) {
      for (std::int64_t h = 0; h < NH; ++h) {
        for (std::int64_t qb = 0; qb < num_qb; ++qb) {
          const std::int64_t q0 = qb * kBq, nq = std::min(kBq, Tq - q0);
          const float slope = a.alibi ? a.alibi[h] : 0.0f;
          const std::int32_t* q_doc = a.q_doc ? a.q_doc + b * Tq : nullptr;
          const std::int32_t* k_doc = a.k_doc ? a.k_doc + b * Tk : nullptr;
          std::fill(m.begin(), m.end(), -INFINITY);
          std::fill(l.begin(), l.end(), 0.0f);
          std::fill(acc.begin(), acc.end(), 0.0f);
          const std::int32_t last_q = *std::max_element(a.q_pos + q0, a.q_pos + q0 + nq);
          for (std::int64_t k0 = 0; k0 < Tk; k0 += kBk) {
            const std::int64_t nk = std::min(kBk, Tk - k0);
            // A key block after every query of this block (the causal mask's other side): skip.
            if (*std::min_element(a.k_pos + k0, a.k_pos + k0 + nk) > last_q) continue;
            for (std::int64_t i = 0; i < nq; ++i) {
              const std::int64_t q = q0 + i;
              const std::int32_t qp = a.q_pos[q];
              const float* qv = head_row(a.q, b, q, h);
              float* srow = s.data() + i * kBk;
              float row_max = m[static_cast<std::size_t>(i)];
              bool any = false;
              for (std::int64_t j = 0; j < nk; ++j) {
                const std::int64_t k = k0 + j;
                if (a.k_pos[k] > qp || (q_doc && q_doc[q] != k_doc[k])) {
                  srow[j] = -INFINITY;  // a later position, or another document
                  continue;
                }
                const float* kv = head_row(a.k, b, k, h);
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (std::int64_t d = 0; d < HS; ++d) dot += qv[d] * kv[d];
                srow[j] = dot * scale + slope * static_cast<float>(a.k_pos[k]);
                row_max = std::max(row_max, srow[j]);
                any = true;
              }
              if (!any) continue;  // no visible key in this block: nothing to add
              // Online softmax: rescale what was accumulated under the old maximum.
              const float correction = std::exp(m[static_cast<std::size_t>(i)] - row_max);
              float row_sum = 0.0f;
              float* acc_row = acc.data() + i * HS;
              for (std::int64_t d = 0; d < HS; ++d) acc_row[d] *= correction;
              if (drop.on()) keep_flags(drop, b, h, qp, a.k_pos, k0, nk, keep);
              for (std::int64_t j = 0; j < nk; ++j) {
                if (srow[j] == -INFINITY) continue;
                const float p = std::exp(srow[j] - row_max);
                row_sum += p;
                float w = p;
                if (drop.on()) w = keep[j] != 0.0f ? p * drop.keep_scale : 0.0f;
                if (w == 0.0f) continue;
                const float* vv = head_row(a.v, b, k0 + j, h);
#pragma omp simd
                for (std::int64_t d = 0; d < HS; ++d) acc_row[d] += w * vv[d];
              }
              l[static_cast<std::size_t>(i)] =
                  l[static_cast<std::size_t>(i)] * correction + row_sum;
              m[static_cast<std::size_t>(i)] = row_max;
            }
          }
          for (std::int64_t i = 0; i < nq; ++i) {
            const std::int64_t q = q0 + i;
            const float li = l[static_cast<std::size_t>(i)];
            float* o = a.out + (b * Tq + q) * C + h * HS;
            const float* acc_row = acc.data() + i * HS;
            float& lse = a.lse[(b * NH + h) * Tq + q];
            if (li == 0.0f) {  // no visible key in the whole block
              std::fill_n(o, HS, 0.0f);
              lse = -INFINITY;
              continue;
            }
            const float inv = 1.0f / li;
            for (std::int64_t d = 0; d < HS; ++d) o[d] = acc_row[d] * inv;
            lse = m[static_cast<std::size_t>(i)] + std::log(li);
          }
        }
      }
    }
  }
}

void flash_attention_merge(const core::ExecContext& ctx, const FlashAttentionMergeArgs& a) {
  const std::int64_t NH = a.num_heads, HS = a.head_dim, C = NH * HS, T = a.seq_len;
  const std::int64_t rows = a.batch * NH * T;
  const int threads = detail::num_threads(ctx);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = r % T, h = (r / T) % NH, b = r / (T * NH);
    const float l1 = a.lse[r], l2 = a.lse_blk[r];
    if (l2 == -INFINITY) continue;  // the block adds nothing
    float* o = a.out + (b * T + t) * C + h * HS;
    const float* ob = a.out_blk + (b * T + t) * C + h * HS;
    if (l1 == -INFINITY) {  // nothing so far: the block's row
      std::copy_n(ob, HS, o);
      a.lse[r] = l2;
      continue;
    }
    const float mx = std::max(l1, l2);
    const float l = mx + std::log1p(std::exp(std::min(l1, l2) - mx));
    const float w1 = std::exp(l1 - l), w2 = std::exp(l2 - l);
#pragma omp simd
    for (std::int64_t d = 0; d < HS; ++d) o[d] = o[d] * w1 + ob[d] * w2;
    a.lse[r] = l;
  }
}

void flash_attention_block_backward(const core::ExecContext& ctx,
                                    const FlashAttentionBlockBackwardArgs& a) {
  const std::int64_t NH = a.num_heads, HS = a.head_dim, C = NH * HS, Tq = a.q_len, Tk = a.k_len;
  if (a.batch == 0 || Tk == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const DropoutRule drop = dropout_rule(a);
  const int threads = detail::num_threads(ctx);
  core::Workspace& ws = ctx.scratch();
  ws.prepare(threads, 2);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    float* delta = ws.floats(t, 0, static_cast<std::size_t>(std::max<std::int64_t>(Tq, 1)));
    float* keep = ws.floats(t, 1, static_cast<std::size_t>(Tk));
#pragma omp for collapse(2) schedule(dynamic)
    for (std::int64_t b = 0; b < a.batch; ++b) {
      for (std::int64_t h = 0; h < NH; ++h) {
        const float slope = a.alibi ? a.alibi[h] : 0.0f;
        const std::int32_t* q_doc = a.q_doc ? a.q_doc + b * Tq : nullptr;
        const std::int32_t* k_doc = a.k_doc ? a.k_doc + b * Tk : nullptr;
        if (!a.accumulate_dkv) {
          for (std::int64_t k = 0; k < Tk; ++k) {
            std::fill_n(head_row(a.d_k, b, k, h), HS, 0.0f);
            std::fill_n(head_row(a.d_v, b, k, h), HS, 0.0f);
          }
        }
        // D = rowsum(dO * O) of the final output: the softmax-backward correction term.
        for (std::int64_t q = 0; q < Tq; ++q) {
          const float* o = a.out + (b * Tq + q) * C + h * HS;
          const float* d_o = a.d_out + (b * Tq + q) * C + h * HS;
          float dsum = 0.0f;
          for (std::int64_t d = 0; d < HS; ++d) dsum += o[d] * d_o[d];
          delta[q] = dsum;
        }
        for (std::int64_t q = 0; q < Tq; ++q) {
          const float lse = a.lse[(b * NH + h) * Tq + q];
          if (lse == -INFINITY) continue;  // no visible key anywhere: no gradient
          const std::int32_t qp = a.q_pos[q];
          const float* qv = head_row(a.q, b, q, h);
          float* dq = head_row(a.d_q, b, q, h);
          const float* d_o = a.d_out + (b * Tq + q) * C + h * HS;
          if (drop.on()) {
            for (std::int64_t k0 = 0; k0 < Tk; k0 += kBk)
              keep_flags(drop, b, h, qp, a.k_pos, k0, std::min(kBk, Tk - k0), keep + k0);
          }
          for (std::int64_t k = 0; k < Tk; ++k) {
            if (a.k_pos[k] > qp || (q_doc && q_doc[q] != k_doc[k])) continue;
            const float* kv = head_row(a.k, b, k, h);
            const float* vv = head_row(a.v, b, k, h);
            float dot = 0.0f, dpv = 0.0f;
#pragma omp simd reduction(+ : dot, dpv)
            for (std::int64_t d = 0; d < HS; ++d) {
              dot += qv[d] * kv[d];
              dpv += d_o[d] * vv[d];
            }
            const float p = std::exp(dot * scale + slope * static_cast<float>(a.k_pos[k]) - lse);
            float w = p, dp = dpv;  // dropped probability and the gradient of the undropped one
            if (drop.on()) {
              const bool kept = keep[k] != 0.0f;
              w = kept ? p * drop.keep_scale : 0.0f;
              dp = kept ? dpv * drop.keep_scale : 0.0f;
            }
            const float ds = p * (dp - delta[q]) * scale;
            float* dk = head_row(a.d_k, b, k, h);
            float* dv = head_row(a.d_v, b, k, h);
#pragma omp simd
            for (std::int64_t d = 0; d < HS; ++d) {
              dv[d] += w * d_o[d];
              dq[d] += ds * kv[d];
              dk[d] += ds * qv[d];
            }
          }
        }
      }
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
