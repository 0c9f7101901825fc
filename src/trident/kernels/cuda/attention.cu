// CUDA causal attention, within documents where document ids are given (--reset-attention-mask):
// the materialized form (attention.h: probabilities saved for backward) and the flash form
// (flash_attention.h: online softmax over the keys, ALiBi and Philox dropout inside, O(T) memory
// per head, backward recomputing the probabilities from the saved log-sum-exp).
//
// The flash kernels give one warp per (sample, head, query row) in the forward and the dQ pass,
// and one warp per (sample, head, key row) in the dK/dV pass, so no atomics are needed and the
// results are deterministic; the head dimension is spread over the lanes (head_dim <= 256). They
// are correct, not yet tiled through shared memory / tensor cores (docs/gpu.md: what remains).
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"
#include "trident/kernels/cuda/philox.h"

namespace trident::kernels::cuda {

namespace {

struct Dims {
  std::int64_t B, T, NH, HS, C, ld;
  float scale;
};

Dims check_dims(const char* op, std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t HS) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && NH > 0 && HS > 0, op,
                ": need batch, seq_len >= 0 and num_heads, head_dim > 0, got batch=", B,
                " seq_len=", T, " num_heads=", NH, " head_dim=", HS);
  return {B, T, NH, HS, NH * HS, 3 * NH * HS, 1.0f / std::sqrt(static_cast<float>(HS))};
}

// ---- materialized attention -------------------------------------------------------------------

// probs[b,h,q,k] = scale * q.k for k <= q (0 above), one thread per element.
__global__ void scores_kernel(float* probs, const float* qkv, Dims d) {
  const std::int64_t n = d.B * d.NH * d.T * d.T;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t k = i % d.T, q = (i / d.T) % d.T, h = (i / (d.T * d.T)) % d.NH,
                       b = i / (d.T * d.T * d.NH);
    float v = 0.0f;
    if (k <= q) {
      const float* qv = qkv + (b * d.T + q) * d.ld + h * 3 * d.HS;
      const float* kv = qkv + (b * d.T + k) * d.ld + h * 3 * d.HS + d.HS;
      float dot = 0.0f;
      for (std::int64_t j = 0; j < d.HS; ++j) dot += qv[j] * kv[j];
      v = dot * d.scale;
    }
    probs[i] = v;
  }
}

// Whether key k is seen from query q of sample b: k <= q and, with document ids
// (--reset-attention-mask), in q's document.
__device__ __forceinline__ bool sees(const std::int32_t* doc, std::int64_t b, std::int64_t T,
                                     std::int64_t q, std::int64_t k) {
  return k <= q && (doc == nullptr || doc[b * T + k] == doc[b * T + q]);
}

// Causal softmax of each row in place (one block per row), within the query's document when
// `doc` is given (the masked probabilities are 0, so the backward needs no document ids).
__global__ void causal_softmax_kernel(float* probs, std::int64_t T, std::int64_t NH,
                                      const std::int32_t* doc) {
  const std::int64_t row = blockIdx.x, q = row % T, b = row / (T * NH);
  float* p = probs + row * T;
  float m = -FLT_MAX;
  for (std::int64_t k = threadIdx.x; k <= q; k += blockDim.x)
    if (sees(doc, b, T, q, k)) m = fmaxf(m, p[k]);
  m = block_max(m);
  float s = 0.0f;
  for (std::int64_t k = threadIdx.x; k <= q; k += blockDim.x)
    if (sees(doc, b, T, q, k)) s += expf(p[k] - m);
  const float inv = 1.0f / block_sum(s);
  for (std::int64_t k = threadIdx.x; k < T; k += blockDim.x) {
    p[k] = sees(doc, b, T, q, k) ? expf(p[k] - m) * inv : 0.0f;
  }
}

// out[b,q,h,:] = sum_{k<=q} probs[b,h,q,k] v[b,k,h,:], one thread per output element.
__global__ void probs_v_kernel(float* out, const float* probs, const float* qkv, Dims d) {
  const std::int64_t n = d.B * d.T * d.C;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i % d.HS, h = (i / d.HS) % d.NH, q = (i / d.C) % d.T,
                       b = i / (d.C * d.T);
    const float* p = probs + ((b * d.NH + h) * d.T + q) * d.T;
    float acc = 0.0f;
    for (std::int64_t k = 0; k <= q; ++k) {
      acc += p[k] * qkv[(b * d.T + k) * d.ld + h * 3 * d.HS + 2 * d.HS + j];
    }
    out[i] = acc;
  }
}

// d_probs = dP[q,k] = d_out[q] . v[k] for k <= q, then in place dS = P (dP - rowsum(P dP)) (one
// block per row).
__global__ void softmax_backward_kernel(float* d_probs, const float* probs, const float* d_out,
                                        const float* qkv, Dims d) {
  const std::int64_t row = blockIdx.x, q = row % d.T, h = (row / d.T) % d.NH,
                     b = row / (d.T * d.NH);
  const float* p = probs + row * d.T;
  float* dp = d_probs + row * d.T;
  const float* go = d_out + (b * d.T + q) * d.C + h * d.HS;
  float acc = 0.0f;
  for (std::int64_t k = threadIdx.x; k <= q; k += blockDim.x) {
    const float* vv = qkv + (b * d.T + k) * d.ld + h * 3 * d.HS + 2 * d.HS;
    float dot = 0.0f;
    for (std::int64_t j = 0; j < d.HS; ++j) dot += go[j] * vv[j];
    dp[k] = dot;
    acc += p[k] * dot;
  }
  const float rowsum = block_sum(acc);
  for (std::int64_t k = threadIdx.x; k < d.T; k += blockDim.x) {
    dp[k] = k <= q ? p[k] * (dp[k] - rowsum) : 0.0f;
  }
}

// d_qkv from dS (in d_probs) and P: one thread per element of d_qkv.
//   dQ[q] = scale sum_{k<=q} dS[q,k] K[k];  dK[k] = scale sum_{q>=k} dS[q,k] Q[q];
//   dV[k] = sum_{q>=k} P[q,k] dO[q].
__global__ void attention_dqkv_kernel(float* d_qkv, const float* ds, const float* probs,
                                      const float* d_out, const float* qkv, Dims d) {
  const std::int64_t n = d.B * d.T * d.ld;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i % d.HS, part = (i / d.HS) % 3, h = (i / (3 * d.HS)) % d.NH,
                       t = (i / d.ld) % d.T, b = i / (d.ld * d.T);
    const std::int64_t bh = b * d.NH + h;
    const float* base = qkv + b * d.T * d.ld + h * 3 * d.HS;
    float acc = 0.0f;
    if (part == 0) {
      const float* row = ds + (bh * d.T + t) * d.T;
      for (std::int64_t k = 0; k <= t; ++k) acc += row[k] * base[k * d.ld + d.HS + j];
      acc *= d.scale;
    } else if (part == 1) {
      for (std::int64_t q = t; q < d.T; ++q)
        acc += ds[(bh * d.T + q) * d.T + t] * base[q * d.ld + j];
      acc *= d.scale;
    } else {
      for (std::int64_t q = t; q < d.T; ++q) {
        acc += probs[(bh * d.T + q) * d.T + t] * d_out[(b * d.T + q) * d.C + h * d.HS + j];
      }
    }
    d_qkv[i] = acc;
  }
}

// ---- flash attention ------------------------------------------------------------------------

constexpr int kMaxPerLane = 8;  // head_dim <= 32 * 8
constexpr int kWarpsPerBlock = 4;

struct Flash {
  Dims d;
  const float* alibi;
  AttentionDropout drop;
  float keep_scale;
  const std::int32_t* doc;  // (B, T) document ids, or null: one document per sample
};

__device__ __forceinline__ std::uint64_t dropout_index(const Flash& f, std::int64_t b,
                                                       std::int64_t h, std::int64_t q,
                                                       std::int64_t k) {
  const std::int64_t heads = f.drop.total_heads > 0 ? f.drop.total_heads : f.d.NH;
  return static_cast<std::uint64_t>(
      ((f.drop.first_sample + b) * heads + f.drop.head_offset + h) * f.d.T * f.d.T + q * f.d.T + k);
}

// Loads HS elements spread over the lanes: element lane + 32 i.
__device__ __forceinline__ void load_row(float (&r)[kMaxPerLane], const float* p, std::int64_t HS,
                                         int lane) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const std::int64_t j = lane + 32 * i;
    r[i] = j < HS ? p[j] : 0.0f;
  }
}

__device__ __forceinline__ float dot_row(const float (&r)[kMaxPerLane], const float* p,
                                         std::int64_t HS, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const std::int64_t j = lane + 32 * i;
    if (j < HS) s += r[i] * p[j];
  }
  return warp_sum(s);
}

__global__ void flash_forward_kernel(float* out, float* lse, const float* qkv, Flash f) {
  const Dims& d = f.d;
  const int lane = threadIdx.x & 31;
  const std::int64_t w =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (w >= d.B * d.NH * d.T) return;
  const std::int64_t q = w % d.T, h = (w / d.T) % d.NH, b = w / (d.T * d.NH);
  const float* base = qkv + b * d.T * d.ld + h * 3 * d.HS;
  const float slope = f.alibi ? f.alibi[h] : 0.0f;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  load_row(qv, base + q * d.ld, d.HS, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t k = 0; k <= q; ++k) {
    if (!sees(f.doc, b, d.T, q, k)) continue;
    const float s =
        dot_row(qv, base + k * d.ld + d.HS, d.HS, lane) * d.scale + slope * static_cast<float>(k);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
    m = m_new;
    float wgt = p;
    if (f.drop.p > 0.0f) {
      wgt = dropout_keep(f.drop.seed, f.drop.stream, dropout_index(f, b, h, q, k), f.drop.p)
                ? p * f.keep_scale
                : 0.0f;
    }
    const float* vv = base + k * d.ld + 2 * d.HS;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const std::int64_t j = lane + 32 * i;
      acc[i] = acc[i] * corr + (j < d.HS ? wgt * vv[j] : 0.0f);
    }
  }
  const float inv = 1.0f / l;
  float* o = out + (b * d.T + q) * d.C + h * d.HS;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const std::int64_t j = lane + 32 * i;
    if (j < d.HS) o[j] = acc[i] * inv;
  }
  if (lane == 0) lse[(b * d.NH + h) * d.T + q] = m + logf(l);
}

// delta[b,h,t] = d_out[b,t,h,:] . out[b,t,h,:]
__global__ void flash_delta_kernel(float* delta, const float* out, const float* d_out, Dims d) {
  const int lane = threadIdx.x & 31;
  const std::int64_t w =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (w >= d.B * d.NH * d.T) return;
  const std::int64_t t = w % d.T, h = (w / d.T) % d.NH, b = w / (d.T * d.NH);
  const float* o = out + (b * d.T + t) * d.C + h * d.HS;
  const float* go = d_out + (b * d.T + t) * d.C + h * d.HS;
  float s = 0.0f;
  for (std::int64_t j = lane; j < d.HS; j += 32) s += o[j] * go[j];
  s = warp_sum(s);
  if (lane == 0) delta[w] = s;
}

// dQ: one warp per query row, over keys k <= q.
__global__ void flash_dq_kernel(float* d_qkv, const float* qkv, const float* d_out,
                                const float* lse, const float* delta, Flash f) {
  const Dims& d = f.d;
  const int lane = threadIdx.x & 31;
  const std::int64_t w =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (w >= d.B * d.NH * d.T) return;
  const std::int64_t q = w % d.T, h = (w / d.T) % d.NH, b = w / (d.T * d.NH);
  const float* base = qkv + b * d.T * d.ld + h * 3 * d.HS;
  const float slope = f.alibi ? f.alibi[h] : 0.0f;
  float qv[kMaxPerLane], go[kMaxPerLane], dq[kMaxPerLane];
  load_row(qv, base + q * d.ld, d.HS, lane);
  load_row(go, d_out + (b * d.T + q) * d.C + h * d.HS, d.HS, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) dq[i] = 0.0f;
  const float row_lse = lse[w], row_delta = delta[w];
  for (std::int64_t k = 0; k <= q; ++k) {
    if (!sees(f.doc, b, d.T, q, k)) continue;
    const float* kv = base + k * d.ld + d.HS;
    const float p =
        expf(dot_row(qv, kv, d.HS, lane) * d.scale + slope * static_cast<float>(k) - row_lse);
    float dp = dot_row(go, kv + d.HS, d.HS, lane);
    if (f.drop.p > 0.0f) {
      dp = dropout_keep(f.drop.seed, f.drop.stream, dropout_index(f, b, h, q, k), f.drop.p)
               ? dp * f.keep_scale
               : 0.0f;
    }
    const float ds = p * (dp - row_delta) * d.scale;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const std::int64_t j = lane + 32 * i;
      if (j < d.HS) dq[i] += ds * kv[j];
    }
  }
  float* out = d_qkv + (b * d.T + q) * d.ld + h * 3 * d.HS;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const std::int64_t j = lane + 32 * i;
    if (j < d.HS) out[j] = dq[i];
  }
}

// dK, dV: one warp per key row, over queries q >= k.
__global__ void flash_dkv_kernel(float* d_qkv, const float* qkv, const float* d_out,
                                 const float* lse, const float* delta, Flash f) {
  const Dims& d = f.d;
  const int lane = threadIdx.x & 31;
  const std::int64_t w =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (w >= d.B * d.NH * d.T) return;
  const std::int64_t k = w % d.T, h = (w / d.T) % d.NH, b = w / (d.T * d.NH);
  const std::int64_t bh = b * d.NH + h;
  const float* base = qkv + b * d.T * d.ld + h * 3 * d.HS;
  const float slope = f.alibi ? f.alibi[h] : 0.0f;
  float kv[kMaxPerLane], vv[kMaxPerLane], dk[kMaxPerLane], dv[kMaxPerLane];
  load_row(kv, base + k * d.ld + d.HS, d.HS, lane);
  load_row(vv, base + k * d.ld + 2 * d.HS, d.HS, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) dk[i] = dv[i] = 0.0f;
  for (std::int64_t q = k; q < d.T; ++q) {
    if (!sees(f.doc, b, d.T, q, k)) continue;
    const float* qv = base + q * d.ld;
    const float* go = d_out + (b * d.T + q) * d.C + h * d.HS;
    const float p = expf(dot_row(kv, qv, d.HS, lane) * d.scale + slope * static_cast<float>(k) -
                         lse[bh * d.T + q]);
    float dp = dot_row(vv, go, d.HS, lane);
    float wgt = p;
    if (f.drop.p > 0.0f) {
      const bool keep =
          dropout_keep(f.drop.seed, f.drop.stream, dropout_index(f, b, h, q, k), f.drop.p);
      wgt = keep ? p * f.keep_scale : 0.0f;
      dp = keep ? dp * f.keep_scale : 0.0f;
    }
    const float ds = p * (dp - delta[bh * d.T + q]) * d.scale;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const std::int64_t j = lane + 32 * i;
      if (j < d.HS) {
        dv[i] += wgt * go[j];
        dk[i] += ds * qv[j];
      }
    }
  }
  float* out = d_qkv + (b * d.T + k) * d.ld + h * 3 * d.HS;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const std::int64_t j = lane + 32 * i;
    if (j < d.HS) {
      out[d.HS + j] = dk[i];
      out[2 * d.HS + j] = dv[i];
    }
  }
}

Flash make_flash(const char* op, const Dims& d, const float* alibi, const AttentionDropout& drop,
                 const std::int32_t* doc) {
  TRIDENT_CHECK(drop.p >= 0.0f && drop.p < 1.0f, op,
                ": dropout probability must be in [0, 1), got ", drop.p);
  TRIDENT_CHECK(d.HS <= 32 * kMaxPerLane, op, ": head_dim ", d.HS,
                " is more than the CUDA kernel's ", 32 * kMaxPerLane);
  return {d, alibi, drop, 1.0f / (1.0f - drop.p), doc};
}

unsigned warp_blocks(std::int64_t warps) {
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void attention_forward(const ExecContext& ctx, const AttentionForwardArgs& args) {
  const Dims d =
      check_dims("attention_forward", args.batch, args.seq_len, args.num_heads, args.head_dim);
  if (d.B == 0 || d.T == 0) return;
  TRIDENT_CHECK(args.out && args.probs && args.qkv,
                "attention_forward: out, probs and qkv must be non-null");
  cudaStream_t s = stream_of(ctx);
  scores_kernel<<<grid_for(d.B * d.NH * d.T * d.T, 256), 256, 0, s>>>(args.probs, args.qkv, d);
  TRIDENT_CUDA_LAUNCH_CHECK("attention_forward");
  causal_softmax_kernel<<<static_cast<unsigned>(d.B * d.NH * d.T), 128, 0, s>>>(args.probs, d.T,
                                                                                d.NH, args.doc);
  TRIDENT_CUDA_LAUNCH_CHECK("attention_forward");
  probs_v_kernel<<<grid_for(d.B * d.T * d.C, 256), 256, 0, s>>>(args.out, args.probs, args.qkv, d);
  TRIDENT_CUDA_LAUNCH_CHECK("attention_forward");
}

void attention_backward(const ExecContext& ctx, const AttentionBackwardArgs& args) {
  const Dims d =
      check_dims("attention_backward", args.batch, args.seq_len, args.num_heads, args.head_dim);
  if (d.B == 0 || d.T == 0) return;
  TRIDENT_CHECK(args.d_qkv && args.d_probs && args.d_out && args.qkv && args.probs,
                "attention_backward: d_qkv, d_probs, d_out, qkv and probs must be non-null");
  cudaStream_t s = stream_of(ctx);
  softmax_backward_kernel<<<static_cast<unsigned>(d.B * d.NH * d.T), 128, 0, s>>>(
      args.d_probs, args.probs, args.d_out, args.qkv, d);
  TRIDENT_CUDA_LAUNCH_CHECK("attention_backward");
  attention_dqkv_kernel<<<grid_for(d.B * d.T * d.ld, 256), 256, 0, s>>>(
      args.d_qkv, args.d_probs, args.probs, args.d_out, args.qkv, d);
  TRIDENT_CUDA_LAUNCH_CHECK("attention_backward");
}

void flash_attention_forward(const ExecContext& ctx, const FlashAttentionForwardArgs& a) {
  const Dims d = check_dims("flash_attention_forward", a.batch, a.seq_len, a.num_heads, a.head_dim);
  const Flash f = make_flash("flash_attention_forward", d, a.alibi, a.dropout, a.doc);
  if (d.B == 0 || d.T == 0) return;
  TRIDENT_CHECK(a.out && a.lse && a.qkv,
                "flash_attention_forward: out, lse and qkv must be non-null");
  flash_forward_kernel<<<warp_blocks(d.B * d.NH * d.T), 32 * kWarpsPerBlock, 0, stream_of(ctx)>>>(
      a.out, a.lse, a.qkv, f);
  TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_forward");
}

void flash_attention_backward(const ExecContext& ctx, const FlashAttentionBackwardArgs& a) {
  const Dims d =
      check_dims("flash_attention_backward", a.batch, a.seq_len, a.num_heads, a.head_dim);
  const Flash f = make_flash("flash_attention_backward", d, a.alibi, a.dropout, a.doc);
  if (d.B == 0 || d.T == 0) return;
  TRIDENT_CHECK(a.d_qkv && a.d_out && a.qkv && a.out && a.lse,
                "flash_attention_backward: d_qkv, d_out, qkv, out and lse must be non-null");
  cudaStream_t s = stream_of(ctx);
  const std::int64_t rows = d.B * d.NH * d.T;
  StreamScratch delta(rows * static_cast<std::int64_t>(sizeof(float)), s);
  const unsigned blocks = warp_blocks(rows);
  flash_delta_kernel<<<blocks, 32 * kWarpsPerBlock, 0, s>>>(delta.as<float>(), a.out, a.d_out, d);
  TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_backward");
  flash_dq_kernel<<<blocks, 32 * kWarpsPerBlock, 0, s>>>(a.d_qkv, a.qkv, a.d_out, a.lse,
                                                         delta.as<float>(), f);
  TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_backward");
  flash_dkv_kernel<<<blocks, 32 * kWarpsPerBlock, 0, s>>>(a.d_qkv, a.qkv, a.d_out, a.lse,
                                                          delta.as<float>(), f);
  TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_backward");
}

}  // namespace trident::kernels::cuda
