// CUDA bodies of rope.h (rotary positions on a fused QKV, grouped heads expanded) and
// kv_cache_attention.h (new tokens against the KV cache). Same arithmetic as the CPU bodies
// (kernels/cpu/rope.cc, kernels/cpu/kv_cache_attention.cc): angles and their cos/sin in double,
// rounded to FP32 once; the group sums of the rotary backward in query-head order.
#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void rope_angle(const RopeQkvShape& s, std::int64_t r, std::int64_t i,
                                           float& c, float& sn) {
  const double pos = static_cast<double>(s.positions ? s.positions[r] : s.position + r % s.seq_len);
  const double a = pos * static_cast<double>(s.inv_freq[i]);
  c = static_cast<float>(cos(a));
  sn = static_cast<float>(sin(a));
}

// One thread per (row, expanded head, i < head_dim / 2): the pair (i, i + half) of the query and
// the key rotated, the value copied.
__global__ void rope_forward_kernel(float* out, const float* in, RopeQkvShape s) {
  const std::int64_t HS = s.head_dim, half = HS / 2, hpg = s.heads_per_group;
  const std::int64_t heads = s.groups * hpg, n = s.rows * heads * half;
  const std::int64_t in_cols = s.groups * (hpg + 2) * HS, out_cols = heads * 3 * HS;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = idx % half, t = idx / half, h = t % heads, r = t / heads;
    const std::int64_t g = h / hpg, hh = h % hpg;
    const float* grp = in + r * in_cols + g * (hpg + 2) * HS;
    const float* q = grp + hh * HS;
    const float* k = grp + hpg * HS;
    const float* v = k + HS;
    float* o = out + r * out_cols + h * 3 * HS;
    if (s.inv_freq) {
      float c, sn;
      rope_angle(s, r, i, c, sn);
      o[i] = q[i] * c - q[i + half] * sn;
      o[i + half] = q[i + half] * c + q[i] * sn;
      o[HS + i] = k[i] * c - k[i + half] * sn;
      o[HS + i + half] = k[i + half] * c + k[i] * sn;
    } else {
      o[i] = q[i];
      o[i + half] = q[i + half];
      o[HS + i] = k[i];
      o[HS + i + half] = k[i + half];
    }
    o[2 * HS + i] = v[i];
    o[2 * HS + i + half] = v[i + half];
  }
}

// One thread per (row, group, i < half): each query head's gradient rotated back, the group's key
// and value gradients summed over its query heads (in head order), the key's rotated back.
__global__ void rope_backward_kernel(float* d_in, const float* d_out, RopeQkvShape s) {
  const std::int64_t HS = s.head_dim, half = HS / 2, hpg = s.heads_per_group;
  const std::int64_t n = s.rows * s.groups * half;
  const std::int64_t in_cols = s.groups * (hpg + 2) * HS, out_cols = s.groups * hpg * 3 * HS;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = idx % half, t = idx / half, g = t % s.groups, r = t / s.groups;
    float c = 1.0f, sn = 0.0f;
    if (s.inv_freq) rope_angle(s, r, i, c, sn);
    float* grp = d_in + r * in_cols + g * (hpg + 2) * HS;
    float k0 = 0.0f, k1 = 0.0f, v0 = 0.0f, v1 = 0.0f;
    for (std::int64_t hh = 0; hh < hpg; ++hh) {
      const float* o = d_out + r * out_cols + (g * hpg + hh) * 3 * HS;
      k0 += o[HS + i];
      k1 += o[HS + i + half];
      v0 += o[2 * HS + i];
      v1 += o[2 * HS + i + half];
      float* dq = grp + hh * HS;
      if (s.inv_freq) {
        const float m = -sn;  // the transpose: rotate by -angle
        dq[i] = o[i] * c - o[i + half] * m;
        dq[i + half] = o[i + half] * c + o[i] * m;
      } else {
        dq[i] = o[i];
        dq[i + half] = o[i + half];
      }
    }
    float* dk = grp + hpg * HS;
    float* dv = dk + HS;
    if (s.inv_freq) {
      const float m = -sn;
      dk[i] = k0 * c - k1 * m;
      dk[i + half] = k1 * c + k0 * m;
    } else {
      dk[i] = k0;
      dk[i + half] = k1;
    }
    dv[i] = v0;
    dv[i + half] = v1;
  }
}

// The new rows' keys and values into the caches.
__global__ void kv_append_kernel(float* k_cache, float* v_cache, const float* qkv,
                                 std::int64_t rows, std::int64_t position, std::int64_t NH,
                                 std::int64_t HS) {
  const std::int64_t C = NH * HS, n = rows * C;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = idx / C, hd = idx % C, h = hd / HS, d = hd % HS;
    const float* q = qkv + (i * NH + h) * 3 * HS;
    k_cache[(position + i) * C + hd] = q[HS + d];
    v_cache[(position + i) * C + hd] = q[2 * HS + d];
  }
}

// One block per head; the new rows in order (each attends to the cache up to its own position),
// the head's scores in its row of the scratch.
__global__ void kv_attention_kernel(float* out, const float* k_cache, const float* v_cache,
                                    const float* qkv, const float* alibi, float* scratch,
                                    std::int64_t rows, std::int64_t position, std::int64_t P,
                                    std::int64_t NH, std::int64_t HS, float scale) {
  const std::int64_t h = blockIdx.x, C = NH * HS;
  float* scores = scratch + h * P;
  const float slope = alibi ? alibi[h] : 0.0f;
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t pos = position + i;
    const float* q = qkv + (i * NH + h) * 3 * HS;
    float local_max = -INFINITY;
    for (std::int64_t t = threadIdx.x; t <= pos; t += blockDim.x) {
      const float* k = k_cache + t * C + h * HS;
      float sc = 0.0f;
      for (std::int64_t d = 0; d < HS; ++d) sc += q[d] * k[d];
      sc = sc * scale + slope * static_cast<float>(t);
      scores[t] = sc;
      local_max = fmaxf(local_max, sc);
    }
    const float m = block_max(local_max);
    float local_sum = 0.0f;
    for (std::int64_t t = threadIdx.x; t <= pos; t += blockDim.x) {
      const float e = expf(scores[t] - m);
      scores[t] = e;
      local_sum += e;
    }
    const float denom = block_sum(local_sum);  // block_sum's barriers also publish scores[]
    float* o = out + i * C + h * HS;
    for (std::int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
      float acc = 0.0f;
      for (std::int64_t t = 0; t <= pos; ++t)
        acc += scores[t] / denom * v_cache[t * C + h * HS + d];
      o[d] = acc;
    }
    __syncthreads();  // scores[] is rewritten by the next row
  }
}

}  // namespace

void rope_qkv_forward(const ExecContext& ctx, const RopeQkvForwardArgs& args) {
  const RopeQkvShape& s = args.shape;
  const std::int64_t n = s.rows * s.groups * s.heads_per_group * (s.head_dim / 2);
  if (n == 0) return;
  rope_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(args.out, args.in, s);
  TRIDENT_CUDA_LAUNCH_CHECK("rope_qkv_forward");
}

void rope_qkv_backward(const ExecContext& ctx, const RopeQkvBackwardArgs& args) {
  const RopeQkvShape& s = args.shape;
  const std::int64_t n = s.rows * s.groups * (s.head_dim / 2);
  if (n == 0) return;
  rope_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(args.d_in,
                                                                               args.d_out, s);
  TRIDENT_CUDA_LAUNCH_CHECK("rope_qkv_backward");
}

void kv_cache_attention(const ExecContext& ctx, const KvCacheAttentionArgs& a) {
  const std::int64_t NH = a.num_heads, HS = a.head_dim, P = a.max_positions;
  TRIDENT_CHECK(NH > 0 && HS > 0 && a.rows >= 0, "kv_cache_attention: bad sizes (heads ", NH,
                ", head_dim ", HS, ", rows ", a.rows, ")");
  TRIDENT_CHECK(a.position >= 0 && a.position + a.rows <= P, "kv_cache_attention: positions [",
                a.position, ", ", a.position + a.rows, ") do not fit the cache of ", P);
  TRIDENT_CHECK(
      static_cast<std::int64_t>(a.scratch.size()) >= kv_cache_attention_scratch_floats(P, NH),
      "kv_cache_attention: scratch of ", a.scratch.size(), " floats, need ",
      kv_cache_attention_scratch_floats(P, NH));
  if (a.rows == 0) return;
  cudaStream_t st = stream_of(ctx);
  kv_append_kernel<<<grid_for(a.rows * NH * HS, kThreads), kThreads, 0, st>>>(
      a.k_cache, a.v_cache, a.qkv, a.rows, a.position, NH, HS);
  TRIDENT_CUDA_LAUNCH_CHECK("kv_cache_attention (append)");
  kv_attention_kernel<<<static_cast<unsigned>(NH), kThreads, 0, st>>>(
      a.out, a.k_cache, a.v_cache, a.qkv, a.alibi, a.scratch.data(), a.rows, a.position, P, NH, HS,
      1.0f / sqrtf(static_cast<float>(HS)));
  TRIDENT_CUDA_LAUNCH_CHECK("kv_cache_attention");
}

}  // namespace trident::kernels::cuda
