// CUDA bodies of the ring attention's block ops (flash_attention_block.h), in the form of the
// flash kernels of cuda/attention.cu: one warp per (sample, head, query row) in the forward and
// the dQ pass, one warp per (sample, head, key row) in the dK/dV pass, the head dimension spread
// over the lanes (head_dim <= 256), so no atomics and deterministic results; the merge gives one
// thread per (sample, head, row). The mask is by global position (k_pos <= q_pos, within a
// document where ids are given) and the dropout mask is flash_attention's for the global
// (q_pos, k_pos), the CPU's bits (the same Philox stream).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"
#include "trident/kernels/cuda/philox.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kMaxPerLane = 8;  // head_dim <= 32 * 8
constexpr int kWarpsPerBlock = 4;

struct Block {
  std::int64_t B, Tq, Tk, NH, HS, C, total;
  float scale, keep_scale;
  const float* alibi;
  AttentionDropout drop;
  const std::int32_t* q_pos;
  const std::int32_t* k_pos;
  const std::int32_t* q_doc;
  const std::int32_t* k_doc;
};

template <class A>
Block make_block(const char* op, const A& a) {
  TRIDENT_CHECK(a.head_dim <= 32 * kMaxPerLane, op, ": head_dim ", a.head_dim,
                " is more than the CUDA kernel's ", 32 * kMaxPerLane);
  return {a.batch,
          a.q_len,
          a.k_len,
          a.num_heads,
          a.head_dim,
          a.num_heads * a.head_dim,
          a.total_len,
          1.0f / std::sqrt(static_cast<float>(a.head_dim)),
          1.0f / (1.0f - a.dropout.p),
          a.alibi,
          a.dropout,
          a.q_pos,
          a.k_pos,
          a.q_doc,
          a.k_doc};
}

template <class T>
__device__ __forceinline__ T* head_row(const BasicHeadRows<T>& r, std::int64_t b, std::int64_t t,
                                       std::int64_t h) {
  return r.data + b * r.batch_stride + t * r.row_stride + h * r.head_stride;
}

// Whether key row k is seen from query row q of sample b.
__device__ __forceinline__ bool sees(const Block& f, std::int64_t b, std::int64_t q,
                                     std::int64_t k) {
  return f.k_pos[k] <= f.q_pos[q] &&
         (f.q_doc == nullptr || f.q_doc[b * f.Tq + q] == f.k_doc[b * f.Tk + k]);
}

__device__ __forceinline__ bool kept(const Block& f, std::int64_t b, std::int64_t h, std::int64_t q,
                                     std::int64_t k) {
  const std::int64_t heads = f.drop.total_heads > 0 ? f.drop.total_heads : f.NH;
  const auto index = static_cast<std::uint64_t>(
      ((f.drop.first_sample + b) * heads + f.drop.head_offset + h) * f.total * f.total +
      static_cast<std::int64_t>(f.q_pos[q]) * f.total + f.k_pos[k]);
  return dropout_keep(f.drop.seed, f.drop.stream, index, f.drop.p);
}

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

__device__ __forceinline__ std::int64_t warp_index() {
  return static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
}

__global__ void flash_block_forward_kernel(float* out, float* lse, ConstHeadRows qr,
                                           ConstHeadRows kr, ConstHeadRows vr, Block f) {
  const int lane = threadIdx.x & 31;
  const std::int64_t w = warp_index();
  if (w >= f.B * f.NH * f.Tq) return;
  const std::int64_t q = w % f.Tq, h = (w / f.Tq) % f.NH, b = w / (f.Tq * f.NH);
  const float slope = f.alibi ? f.alibi[h] : 0.0f;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  load_row(qv, head_row(qr, b, q, h), f.HS, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t k = 0; k < f.Tk; ++k) {
    if (!sees(f, b, q, k)) continue;
    const float s = dot_row(qv, head_row(kr, b, k, h), f.HS, lane) * f.scale +
                    slope * static_cast<float>(f.k_pos[k]);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
    m = m_new;
    float wgt = p;
    if (f.drop.p > 0.0f) wgt = kept(f, b, h, q, k) ? p * f.keep_scale : 0.0f;
    const float* vv = head_row(vr, b, k, h);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const std::int64_t j = lane + 32 * i;
      acc[i] = acc[i] * corr + (j < f.HS ? wgt * vv[j] : 0.0f);
    }
  }
  // No visible key: out 0, lse -inf (no 0 / 0).
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float* o = out + (b * f.Tq + q) * f.C + h * f.HS;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const std::int64_t j = lane + 32 * i;
    if (j < f.HS) o[j] = acc[i] * inv;
  }
  if (lane == 0) lse[(b * f.NH + h) * f.Tq + q] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// One thread per (b, h, t) row.
__global__ void flash_merge_kernel(float* out, float* lse, const float* out_blk,
                                   const float* lse_blk, std::int64_t B, std::int64_t T,
                                   std::int64_t NH, std::int64_t HS) {
  const std::int64_t rows = B * NH * T;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = r % T, h = (r / T) % NH, b = r / (T * NH);
    const float l1 = lse[r], l2 = lse_blk[r];
    if (l2 == -INFINITY) continue;  // the block adds nothing
    float* o = out + (b * T + t) * NH * HS + h * HS;
    const float* ob = out_blk + (b * T + t) * NH * HS + h * HS;
    if (l1 == -INFINITY) {  // nothing so far: the block's row
      for (std::int64_t d = 0; d < HS; ++d) o[d] = ob[d];
      lse[r] = l2;
      continue;
    }
    const float mx = fmaxf(l1, l2);
    const float l = mx + log1pf(expf(fminf(l1, l2) - mx));
    const float w1 = expf(l1 - l), w2 = expf(l2 - l);
    for (std::int64_t d = 0; d < HS; ++d) o[d] = o[d] * w1 + ob[d] * w2;
    lse[r] = l;
  }
}

// delta[b,h,q] = d_out[b,q,h,:] . out[b,q,h,:]
__global__ void flash_block_delta_kernel(float* delta, const float* out, const float* d_out,
                                         Block f) {
  const int lane = threadIdx.x & 31;
  const std::int64_t w = warp_index();
  if (w >= f.B * f.NH * f.Tq) return;
  const std::int64_t q = w % f.Tq, h = (w / f.Tq) % f.NH, b = w / (f.Tq * f.NH);
  const float* o = out + (b * f.Tq + q) * f.C + h * f.HS;
  const float* go = d_out + (b * f.Tq + q) * f.C + h * f.HS;
  float s = 0.0f;
  for (std::int64_t j = lane; j < f.HS; j += 32) s += o[j] * go[j];
  s = warp_sum(s);
  if (lane == 0) delta[w] = s;
}

// dQ += over the block's keys: one warp per query row.
__global__ void flash_block_dq_kernel(HeadRows dqr, ConstHeadRows qr, ConstHeadRows kr,
                                      ConstHeadRows vr, const float* d_out, const float* lse,
                                      const float* delta, Block f) {
  const int lane = threadIdx.x & 31;
  const std::int64_t w = warp_index();
  if (w >= f.B * f.NH * f.Tq) return;
  const std::int64_t q = w % f.Tq, h = (w / f.Tq) % f.NH, b = w / (f.Tq * f.NH);
  const float row_lse = lse[w], row_delta = delta[w];
  if (row_lse == -INFINITY) return;  // no visible key anywhere: no gradient
  const float slope = f.alibi ? f.alibi[h] : 0.0f;
  float qv[kMaxPerLane], go[kMaxPerLane], dq[kMaxPerLane];
  load_row(qv, head_row(qr, b, q, h), f.HS, lane);
  load_row(go, d_out + (b * f.Tq + q) * f.C + h * f.HS, f.HS, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) dq[i] = 0.0f;
  for (std::int64_t k = 0; k < f.Tk; ++k) {
    if (!sees(f, b, q, k)) continue;
    const float* kv = head_row(kr, b, k, h);
    const float p = expf(dot_row(qv, kv, f.HS, lane) * f.scale +
                         slope * static_cast<float>(f.k_pos[k]) - row_lse);
    float dp = dot_row(go, head_row(vr, b, k, h), f.HS, lane);
    if (f.drop.p > 0.0f) dp = kept(f, b, h, q, k) ? dp * f.keep_scale : 0.0f;
    const float ds = p * (dp - row_delta) * f.scale;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const std::int64_t j = lane + 32 * i;
      if (j < f.HS) dq[i] += ds * kv[j];
    }
  }
  float* out = head_row(dqr, b, q, h);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const std::int64_t j = lane + 32 * i;
    if (j < f.HS) out[j] += dq[i];
  }
}

// dK, dV of the block: one warp per key row, over every query row that sees it.
__global__ void flash_block_dkv_kernel(HeadRows dkr, HeadRows dvr, bool accumulate,
                                       ConstHeadRows qr, ConstHeadRows kr, ConstHeadRows vr,
                                       const float* d_out, const float* lse, const float* delta,
                                       Block f) {
  const int lane = threadIdx.x & 31;
  const std::int64_t w = warp_index();
  if (w >= f.B * f.NH * f.Tk) return;
  const std::int64_t k = w % f.Tk, h = (w / f.Tk) % f.NH, b = w / (f.Tk * f.NH);
  const std::int64_t bh = b * f.NH + h;
  const float slope = f.alibi ? f.alibi[h] : 0.0f;
  float kv[kMaxPerLane], vv[kMaxPerLane], dk[kMaxPerLane], dv[kMaxPerLane];
  load_row(kv, head_row(kr, b, k, h), f.HS, lane);
  load_row(vv, head_row(vr, b, k, h), f.HS, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) dk[i] = dv[i] = 0.0f;
  const float bias = slope * static_cast<float>(f.k_pos[k]);
  for (std::int64_t q = 0; q < f.Tq; ++q) {
    const float row_lse = lse[bh * f.Tq + q];
    if (row_lse == -INFINITY || !sees(f, b, q, k)) continue;
    const float* qv = head_row(qr, b, q, h);
    const float* go = d_out + (b * f.Tq + q) * f.C + h * f.HS;
    const float p = expf(dot_row(kv, qv, f.HS, lane) * f.scale + bias - row_lse);
    float dp = dot_row(vv, go, f.HS, lane);
    float wgt = p;
    if (f.drop.p > 0.0f) {
      const bool keep = kept(f, b, h, q, k);
      wgt = keep ? p * f.keep_scale : 0.0f;
      dp = keep ? dp * f.keep_scale : 0.0f;
    }
    const float ds = p * (dp - delta[bh * f.Tq + q]) * f.scale;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const std::int64_t j = lane + 32 * i;
      if (j < f.HS) {
        dv[i] += wgt * go[j];
        dk[i] += ds * qv[j];
      }
    }
  }
  float* gk = head_row(dkr, b, k, h);
  float* gv = head_row(dvr, b, k, h);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const std::int64_t j = lane + 32 * i;
    if (j < f.HS) {
      gk[j] = accumulate ? gk[j] + dk[i] : dk[i];
      gv[j] = accumulate ? gv[j] + dv[i] : dv[i];
    }
  }
}

unsigned warp_blocks(std::int64_t warps) {
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void flash_attention_block_forward(const ExecContext& ctx, const FlashAttentionBlockArgs& a) {
  const Block f = make_block("flash_attention_block_forward", a);
  if (f.B == 0 || f.Tq == 0) return;
  flash_block_forward_kernel<<<warp_blocks(f.B * f.NH * f.Tq), 32 * kWarpsPerBlock, 0,
                               stream_of(ctx)>>>(a.out, a.lse, a.q, a.k, a.v, f);
  TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_block_forward");
}

void flash_attention_merge(const ExecContext& ctx, const FlashAttentionMergeArgs& a) {
  const std::int64_t rows = a.batch * a.num_heads * a.seq_len;
  if (rows == 0) return;
  flash_merge_kernel<<<grid_for(rows, 128), 128, 0, stream_of(ctx)>>>(
      a.out, a.lse, a.out_blk, a.lse_blk, a.batch, a.seq_len, a.num_heads, a.head_dim);
  TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_merge");
}

void flash_attention_block_backward(const ExecContext& ctx,
                                    const FlashAttentionBlockBackwardArgs& a) {
  const Block f = make_block("flash_attention_block_backward", a);
  if (f.B == 0 || f.Tk == 0) return;
  cudaStream_t s = stream_of(ctx);
  const std::int64_t q_rows = f.B * f.NH * f.Tq;
  StreamScratch delta(q_rows * static_cast<std::int64_t>(sizeof(float)), s);
  if (q_rows > 0) {
    flash_block_delta_kernel<<<warp_blocks(q_rows), 32 * kWarpsPerBlock, 0, s>>>(delta.as<float>(),
                                                                                 a.out, a.d_out, f);
    TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_block_backward");
    flash_block_dq_kernel<<<warp_blocks(q_rows), 32 * kWarpsPerBlock, 0, s>>>(
        a.d_q, a.q, a.k, a.v, a.d_out, a.lse, delta.as<float>(), f);
    TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_block_backward");
  }
  flash_block_dkv_kernel<<<warp_blocks(f.B * f.NH * f.Tk), 32 * kWarpsPerBlock, 0, s>>>(
      a.d_k, a.d_v, a.accumulate_dkv, a.q, a.k, a.v, a.d_out, a.lse, delta.as<float>(), f);
  TRIDENT_CUDA_LAUNCH_CHECK("flash_attention_block_backward");
}

}  // namespace trident::kernels::cuda
