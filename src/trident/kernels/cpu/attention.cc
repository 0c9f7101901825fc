// CPU causal attention forward and backward over Megatron's interleaved QKV layout. The per-head
// products go through dnnl_sgemm on blocks of kBlock query rows (or key rows), so only the causal
// (lower) part of the T x T products is computed. See attention.h.
//
// Legend: B = batch, T = seq_len, NH = num_heads, HS = head_dim, C = NH * HS. Within one (b, h),
// Q, K and V are (T, HS) matrices with row stride 3C inside qkv; the output head is (T, HS) with
// row stride C; P = probs[b, h] and dP = d_probs[b, h] are (T, T).
#include <algorithm>
#include <cmath>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

constexpr std::int64_t kBlock = 64;  // query (or key) rows per task

struct Dims {
  std::int64_t B, T, NH, HS, C, ld_qkv, num_blocks;
};

Dims check_dims(const char* op, std::int64_t batch, std::int64_t seq_len, std::int64_t num_heads,
                std::int64_t head_dim) {
  TRIDENT_CHECK(batch >= 0 && seq_len >= 0 && num_heads > 0 && head_dim > 0, op,
                ": need batch, seq_len >= 0 and num_heads, head_dim > 0, got batch=", batch,
                " seq_len=", seq_len, " num_heads=", num_heads, " head_dim=", head_dim);
  const std::int64_t C = num_heads * head_dim;
  return {batch, seq_len, num_heads, head_dim, C, 3 * C, (seq_len + kBlock - 1) / kBlock};
}

// Row r of P (length T) holds the scaled scores for keys [0, r]: softmax them in place and write 0
// for keys (r, T).
void causal_softmax_row(float* p, std::int64_t r, std::int64_t T) {
  float max = p[0];
  for (std::int64_t c = 1; c <= r; ++c) max = std::max(max, p[c]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t c = 0; c <= r; ++c) {
    const float e = detail::exp_approx(p[c] - max);
    p[c] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (std::int64_t c = 0; c <= r; ++c) p[c] *= inv;
  std::fill(p + r + 1, p + T, 0.0f);
}

// The same over the keys of row r's document only (doc: the sample's document ids); the others'
// probabilities are 0.
void document_softmax_row(float* p, std::int64_t r, std::int64_t T, const std::int32_t* doc) {
  float max = -INFINITY;
  for (std::int64_t c = 0; c <= r; ++c)
    if (doc[c] == doc[r]) max = std::max(max, p[c]);
  float sum = 0.0f;
  for (std::int64_t c = 0; c <= r; ++c) {
    const float e = doc[c] == doc[r] ? detail::exp_approx(p[c] - max) : 0.0f;
    p[c] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (std::int64_t c = 0; c <= r; ++c) p[c] *= inv;
  std::fill(p + r + 1, p + T, 0.0f);
}

}  // namespace

void attention_forward(const core::ExecContext& ctx, const AttentionForwardArgs& args) {
  const Dims d =
      check_dims("attention_forward", args.batch, args.seq_len, args.num_heads, args.head_dim);
  if (d.B == 0 || d.T == 0) return;
  TRIDENT_CHECK(args.out && args.probs && args.qkv,
                "attention_forward: out, probs and qkv must be non-null");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.HS));
  const std::int64_t tasks = d.B * d.NH * d.num_blocks;
  // Every (b, h, query block) is independent. Block i costs ~(i + 1) units, hence dynamic.
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(dynamic, 1)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t blk = task % d.num_blocks;
    const std::int64_t bh = task / d.num_blocks;
    const std::int64_t b = bh / d.NH, h = bh % d.NH;
    const float* q = args.qkv + b * d.T * d.ld_qkv + h * 3 * d.HS;
    const float* k = q + d.HS;
    const float* v = q + 2 * d.HS;
    float* P = args.probs + bh * d.T * d.T;
    float* o = args.out + b * d.T * d.C + h * d.HS;
    const std::int64_t r0 = blk * kBlock, r1 = std::min(d.T, r0 + kBlock);
    // P[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T (keys past r1 are masked for every row here).
    detail::sgemm({.trans_b = Trans::kYes,
                   .m = r1 - r0,
                   .n = r1,
                   .k = d.HS,
                   .alpha = scale,
                   .a = q + r0 * d.ld_qkv,
                   .lda = d.ld_qkv,
                   .b = k,
                   .ldb = d.ld_qkv,
                   .c = P + r0 * d.T,
                   .ldc = d.T});
    for (std::int64_t r = r0; r < r1; ++r) {
      if (args.doc) {
        document_softmax_row(P + r * d.T, r, d.T, args.doc + b * d.T);
      } else {
        causal_softmax_row(P + r * d.T, r, d.T);
      }
    }
    // out[r0:r1] = P[r0:r1, 0:r1] V[0:r1]  (P is 0 above the diagonal).
    detail::sgemm({.m = r1 - r0,
                   .n = d.HS,
                   .k = r1,
                   .a = P + r0 * d.T,
                   .lda = d.T,
                   .b = v,
                   .ldb = d.ld_qkv,
                   .c = o + r0 * d.C,
                   .ldc = d.C});
  }
}

// Backward, per (b, h):
//   dV = P^T dO                               (key rows s take query rows t >= s)
//   dP = dO V^T                               (causal part only)
//   dS = P * (dP - rowsum(P * dP))            (softmax backward; 0 above the diagonal)
//   dQ = scale * dS K,   dK = scale * dS^T Q
// Phase 1 runs (b, h, query block) tasks: dP, dS (in d_probs) and dQ. Phase 2 runs
// (b, h, key block) tasks: dK and dV, which read the dS rows of every later query block.
void attention_backward(const core::ExecContext& ctx, const AttentionBackwardArgs& args) {
  const Dims d =
      check_dims("attention_backward", args.batch, args.seq_len, args.num_heads, args.head_dim);
  if (d.B == 0 || d.T == 0) return;
  TRIDENT_CHECK(args.d_qkv && args.d_probs && args.d_out && args.qkv && args.probs,
                "attention_backward: d_qkv, d_probs, d_out, qkv and probs must be non-null");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.HS));
  const std::int64_t tasks = d.B * d.NH * d.num_blocks;
  const int threads = detail::num_threads(ctx);
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t blk = task % d.num_blocks;
      const std::int64_t bh = task / d.num_blocks;
      const std::int64_t b = bh / d.NH, h = bh % d.NH;
      const std::int64_t head = b * d.T * d.ld_qkv + h * 3 * d.HS;
      const float* k = args.qkv + head + d.HS;
      const float* v = args.qkv + head + 2 * d.HS;
      const float* dO = args.d_out + b * d.T * d.C + h * d.HS;
      const float* P = args.probs + bh * d.T * d.T;
      float* dS = args.d_probs + bh * d.T * d.T;
      float* dq = args.d_qkv + head;
      const std::int64_t r0 = blk * kBlock, r1 = std::min(d.T, r0 + kBlock);
      // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T
      detail::sgemm({.trans_b = Trans::kYes,
                     .m = r1 - r0,
                     .n = r1,
                     .k = d.HS,
                     .a = dO + r0 * d.C,
                     .lda = d.C,
                     .b = v,
                     .ldb = d.ld_qkv,
                     .c = dS + r0 * d.T,
                     .ldc = d.T});
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* p = P + r * d.T;
        float* ds = dS + r * d.T;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (std::int64_t c = 0; c <= r; ++c) dot += p[c] * ds[c];
#pragma omp simd
        for (std::int64_t c = 0; c <= r; ++c) ds[c] = p[c] * (ds[c] - dot);
        std::fill(ds + r + 1, ds + r1, 0.0f);  // phase 2 reads the diagonal block's upper part
      }
      // dQ[r0:r1] = scale * dS[r0:r1, 0:r1] K[0:r1]
      detail::sgemm({.m = r1 - r0,
                     .n = d.HS,
                     .k = r1,
                     .alpha = scale,
                     .a = dS + r0 * d.T,
                     .lda = d.T,
                     .b = k,
                     .ldb = d.ld_qkv,
                     .c = dq + r0 * d.ld_qkv,
                     .ldc = d.ld_qkv});
    }
    // (implicit barrier: phase 2 needs every dS row)
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t blk = task % d.num_blocks;
      const std::int64_t bh = task / d.num_blocks;
      const std::int64_t b = bh / d.NH, h = bh % d.NH;
      const std::int64_t head = b * d.T * d.ld_qkv + h * 3 * d.HS;
      const float* q = args.qkv + head;
      const float* dO = args.d_out + b * d.T * d.C + h * d.HS;
      const float* P = args.probs + bh * d.T * d.T;
      const float* dS = args.d_probs + bh * d.T * d.T;
      float* dk = args.d_qkv + head + d.HS;
      float* dv = args.d_qkv + head + 2 * d.HS;
      const std::int64_t s0 = blk * kBlock, s1 = std::min(d.T, s0 + kBlock);
      // Only query rows t >= s0 attend to keys in [s0, s1); their entries at keys > t are 0.
      // dK[s0:s1] = scale * dS[s0:T, s0:s1]^T Q[s0:T]
      detail::sgemm({.trans_a = Trans::kYes,
                     .m = s1 - s0,
                     .n = d.HS,
                     .k = d.T - s0,
                     .alpha = scale,
                     .a = dS + s0 * d.T + s0,
                     .lda = d.T,
                     .b = q + s0 * d.ld_qkv,
                     .ldb = d.ld_qkv,
                     .c = dk + s0 * d.ld_qkv,
                     .ldc = d.ld_qkv});
      // dV[s0:s1] = P[s0:T, s0:s1]^T dO[s0:T]
      detail::sgemm({.trans_a = Trans::kYes,
                     .m = s1 - s0,
                     .n = d.HS,
                     .k = d.T - s0,
                     .a = P + s0 * d.T + s0,
                     .lda = d.T,
                     .b = dO + s0 * d.C,
                     .ldb = d.C,
                     .c = dv + s0 * d.ld_qkv,
                     .ldc = d.ld_qkv});
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
