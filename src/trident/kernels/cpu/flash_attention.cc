// CPU flash attention: OpenMP over (batch, head, query block); each task streams the causal key
// blocks with an online softmax, so memory is O(T) per head instead of O(T^2). See
// flash_attention.h for the math and the dropout indexing.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/rng.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

constexpr std::int64_t kBq = 32;  // query rows per task
constexpr std::int64_t kBk = 64;  // key rows per inner block

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

void check_dropout(const char* op, const AttentionDropout& d) {
  TRIDENT_CHECK(d.p >= 0.0f && d.p < 1.0f, op, ": dropout probability must be in [0, 1), got ",
                d.p);
}

std::uint64_t dropout_index(const AttentionDropout& d, std::int64_t NH, std::int64_t T,
                            std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k) {
  const std::int64_t heads = d.total_heads > 0 ? d.total_heads : NH;
  return static_cast<std::uint64_t>(((d.first_sample + b) * heads + d.head_offset + h) * T * T +
                                    q * T + k);
}

// keep[j] = 1 when the score (q, k0 + j) is kept, else 0, for j < n: dropout_keep's decisions
// (flash_attention.h), drawn in one vectorized loop before the scalar loop uses them.
void keep_flags(const AttentionDropout& d, std::uint64_t threshold, std::int64_t NH, std::int64_t T,
                std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k0, std::int64_t n,
                float* keep) {
  detail::dropout_keep_run(d.seed, d.stream, dropout_index(d, NH, T, b, h, q, k0), n, threshold,
                           keep);
}

}  // namespace

void flash_attention_forward(const core::ExecContext& ctx, const FlashAttentionForwardArgs& a) {
  const Geometry g =
      geometry("flash_attention_forward", a.batch, a.seq_len, a.num_heads, a.head_dim);
  check_dropout("flash_attention_forward", a.dropout);
  const std::int64_t num_qb = (g.T + kBq - 1) / kBq;
  const float keep_scale = 1.0f / (1.0f - a.dropout.p);
  const std::uint64_t threshold = detail::dropout_threshold(a.dropout.p);
  // Per-thread working rows from the context's workspace (grown, never shrunk): no allocation
  // once warm.
  const int threads = detail::num_threads(ctx);
  core::Workspace& ws = ctx.scratch();
  ws.prepare(threads, 5);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const auto n_s = static_cast<std::size_t>(kBq * kBk),
               n_acc = static_cast<std::size_t>(kBq * g.HS);
    const std::span<float> s(ws.floats(t, 0, n_s), n_s), acc(ws.floats(t, 1, n_acc), n_acc);
    const std::span<float> m(ws.floats(t, 2, kBq), kBq), l(ws.floats(t, 3, kBq), kBq);
    float* keep = ws.floats(t, 4, kBk);
#pragma omp for collapse(3) schedule(dynamic)
    for (std::int64_t b = 0; b < g.B; ++b) {
      for (std::int64_t h = 0; h < g.NH; ++h) {
        for (std::int64_t qb = 0; qb < num_qb; ++qb) {
          const std::int64_t q0 = qb * kBq, nq = std::min(kBq, g.T - q0);
          const float* base = a.qkv + b * g.T * g.ld + h * 3 * g.HS;
          const std::int32_t* doc = a.doc ? a.doc + b * g.T : nullptr;
          const float slope = a.alibi ? a.alibi[h] : 0.0f;
          std::fill(m.begin(), m.end(), -INFINITY);
          std::fill(l.begin(), l.end(), 0.0f);
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (std::int64_t k0 = 0; k0 < q0 + nq; k0 += kBk) {
            const std::int64_t nk = std::min(kBk, q0 + nq - k0);
            for (std::int64_t i = 0; i < nq; ++i) {
              const std::int64_t q = q0 + i;
              const float* qv = base + q * g.ld;
              float* srow = s.data() + i * kBk;
              float row_max = m[static_cast<std::size_t>(i)];
              for (std::int64_t j = 0; j < nk; ++j) {
                const std::int64_t k = k0 + j;
                if (k > q || (doc && doc[k] != doc[q])) {  // future, or another document
                  srow[j] = -INFINITY;
                  continue;
                }
                const float* kv = base + k * g.ld + g.HS;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (std::int64_t d = 0; d < g.HS; ++d) dot += qv[d] * kv[d];
                srow[j] = dot * g.scale + slope * static_cast<float>(k);
                row_max = std::max(row_max, srow[j]);
              }
              // A block of only other documents' keys: nothing to add (and no -inf - -inf).
              if (row_max == -INFINITY) continue;
              // Online softmax: rescale what was accumulated under the old maximum.
              const float old_max = m[static_cast<std::size_t>(i)];
              const float correction = std::exp(old_max - row_max);
              float row_sum = 0.0f;
              float* acc_row = acc.data() + i * g.HS;
              for (std::int64_t d = 0; d < g.HS; ++d) acc_row[d] *= correction;
              if (a.dropout.p > 0.0f) {
                keep_flags(a.dropout, threshold, g.NH, g.T, b, h, q, k0, std::min(nk, q - k0 + 1),
                           keep);
              }
              for (std::int64_t j = 0; j < nk; ++j) {
                const std::int64_t k = k0 + j;
                if (k > q) break;
                if (srow[j] == -INFINITY) continue;  // another document
                const float p = std::exp(srow[j] - row_max);
                row_sum += p;
                float w = p;
                if (a.dropout.p > 0.0f) w = keep[j] != 0.0f ? p * keep_scale : 0.0f;
                if (w == 0.0f) continue;
                const float* vv = base + k * g.ld + 2 * g.HS;
#pragma omp simd
                for (std::int64_t d = 0; d < g.HS; ++d) acc_row[d] += w * vv[d];
              }
              l[static_cast<std::size_t>(i)] =
                  l[static_cast<std::size_t>(i)] * correction + row_sum;
              m[static_cast<std::size_t>(i)] = row_max;
            }
          }
          for (std::int64_t i = 0; i < nq; ++i) {
            const std::int64_t q = q0 + i;
            const float inv = 1.0f / l[static_cast<std::size_t>(i)];
            float* o = a.out + (b * g.T + q) * g.C + h * g.HS;
            const float* acc_row = acc.data() + i * g.HS;
            for (std::int64_t d = 0; d < g.HS; ++d) o[d] = acc_row[d] * inv;
            a.lse[(b * g.NH + h) * g.T + q] =
                m[static_cast<std::size_t>(i)] + std::log(l[static_cast<std::size_t>(i)]);
          }
        }
      }
    }
  }
}

void flash_attention_backward(const core::ExecContext& ctx, const FlashAttentionBackwardArgs& a) {
  const Geometry g =
      geometry("flash_attention_backward", a.batch, a.seq_len, a.num_heads, a.head_dim);
  check_dropout("flash_attention_backward", a.dropout);
  const float keep_scale = 1.0f / (1.0f - a.dropout.p);
  const std::uint64_t threshold = detail::dropout_threshold(a.dropout.p);
  // One task per (b, h): d_k and d_v of a key gather contributions from every later query, so
  // splitting queries across threads would need atomics; heads give enough parallelism.
  const int threads = detail::num_threads(ctx);
  core::Workspace& ws = ctx.scratch();
  ws.prepare(threads, 2);
#pragma omp parallel num_threads(threads)
  {
    const auto n_delta = static_cast<std::size_t>(g.T);
    const std::span<float> delta(ws.floats(omp_get_thread_num(), 0, n_delta), n_delta);
    float* keep = ws.floats(omp_get_thread_num(), 1, n_delta);
#pragma omp for collapse(2) schedule(dynamic)
    for (std::int64_t b = 0; b < g.B; ++b) {
      for (std::int64_t h = 0; h < g.NH; ++h) {
        const float* base = a.qkv + b * g.T * g.ld + h * 3 * g.HS;
        float* dbase = a.d_qkv + b * g.T * g.ld + h * 3 * g.HS;
        const float slope = a.alibi ? a.alibi[h] : 0.0f;
        const std::int32_t* doc = a.doc ? a.doc + b * g.T : nullptr;
        for (std::int64_t t = 0; t < g.T; ++t) {
          std::fill_n(dbase + t * g.ld, 3 * g.HS, 0.0f);
          // D = rowsum(dO * O): the softmax-backward correction term.
          const float* o = a.out + (b * g.T + t) * g.C + h * g.HS;
          const float* d_o = a.d_out + (b * g.T + t) * g.C + h * g.HS;
          float dsum = 0.0f;
          for (std::int64_t d = 0; d < g.HS; ++d) dsum += o[d] * d_o[d];
          delta[static_cast<std::size_t>(t)] = dsum;
        }
        for (std::int64_t q = 0; q < g.T; ++q) {
          const float* qv = base + q * g.ld;
          float* dq = dbase + q * g.ld;
          const float* d_o = a.d_out + (b * g.T + q) * g.C + h * g.HS;
          const float lse = a.lse[(b * g.NH + h) * g.T + q];
          if (a.dropout.p > 0.0f)
            keep_flags(a.dropout, threshold, g.NH, g.T, b, h, q, 0, q + 1, keep);
          for (std::int64_t k = 0; k <= q; ++k) {
            if (doc && doc[k] != doc[q]) continue;  // another document: probability 0
            const float* kv = base + k * g.ld + g.HS;
            const float* vv = kv + g.HS;
            float dot = 0.0f, dpv = 0.0f;
#pragma omp simd reduction(+ : dot, dpv)
            for (std::int64_t d = 0; d < g.HS; ++d) {
              dot += qv[d] * kv[d];
              dpv += d_o[d] * vv[d];
            }
            const float p = std::exp(dot * g.scale + slope * static_cast<float>(k) - lse);
            float w = p, dp = dpv;  // dropped probability and the gradient of the undropped one
            if (a.dropout.p > 0.0f) {
              const bool kept = keep[k] != 0.0f;
              w = kept ? p * keep_scale : 0.0f;
              dp = kept ? dpv * keep_scale : 0.0f;
            }
            const float ds = p * (dp - delta[static_cast<std::size_t>(q)]) * g.scale;
            float* dk = dbase + k * g.ld + g.HS;
            float* dv = dk + g.HS;
#pragma omp simd
            for (std::int64_t d = 0; d < g.HS; ++d) {
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
