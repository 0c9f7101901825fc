// CUDA bodies of the mixture-of-experts ops (moe.h), deterministic (no float atomics; every sum in
// a fixed order), with the CPU's integer results exactly:
// - moe_router_forward / moe_router_backward: one thread per token, in double as the CPU (scores,
//   lse and the keys over the experts in order). The top-k by repeated argmax in (key descending,
//   expert ascending) order, so ties go to the lower expert. The backward writes each d_logits
//   row once per expert, then rewrites the chosen experts' entries with the combine's term added.
// - moe_dispatch_map: three launches. Every rows and sources entry set to -1; one block per expert
//   counts its assignments (its kept count); one block per expert walks the N*k assignments in
//   token order, a block-wide prefix count (warp ballots) giving each kept assignment its row, the
//   expert's offset being the sum of the lower experts' counts (or e * capacity when padded). Drop
//   policy kProbs finds the capacity-th largest (weight, earlier token) by a binary search over the
//   weights' ordered bits, then keeps the larger weights and the first of the equal ones.
// - moe_permute, moe_permute_backward, moe_unpermute and moe_unpermute_backward's d_y_perm:
//   grid-stride loops over the output elements, each summing over j in order; d_weights: one warp
//   per (n, j), a double dot product over the columns reduced by warp_sum's fixed shuffle tree.
#include <cuda_runtime.h>

#include <cstdint>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;        // element-wise and warp-per-item kernels
constexpr int kTokenThreads = 128;   // the router's thread per token
constexpr int kExpertThreads = 256;  // the dispatch map's block per expert

__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_threads() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// ---- router -------------------------------------------------------------------------------------

// scores[n, e] in double: softmax(l)[e] (lse = log sum exp l) or sigmoid(l[e]).
__device__ __forceinline__ double router_score(bool softmax, float l, double lse) {
  const double x = l;
  return softmax ? exp(x - lse) : 1.0 / (1.0 + exp(-x));
}

// The top-k key of expert e (moe.h): the logit, or with an expert bias sigmoid(l[e]) + bias[e].
__device__ __forceinline__ double router_key(const MoeRouterForwardArgs& a, const float* l,
                                             double lse, std::int64_t e) {
  if (a.expert_bias == nullptr) return l[e];
  return router_score(false, l[e], lse) + static_cast<double>(a.expert_bias[e]);
}

// What group-limited routing's group scores sum (moe.h): the logit (softmax without
// pre_softmax), the softmax score, or sigmoid(l[e]) (+ bias[e]).
__device__ __forceinline__ double group_value(const MoeRouterForwardArgs& a, const float* l,
                                              double lse, std::int64_t e) {
  if (a.cfg.score == MoeScore::kSoftmax) {
    return a.cfg.pre_softmax ? router_score(true, l[e], lse) : static_cast<double>(l[e]);
  }
  return a.expert_bias != nullptr ? router_key(a, l, lse, e) : router_score(false, l[e], lse);
}

// The j-th largest of value(i) for i in [first, end), in the total order (value descending, index
// ascending): the largest after (prev, prev_value). -1 when none is left (or only NaNs).
template <class Value>
__device__ std::int64_t next_largest(Value value, std::int64_t first, std::int64_t end,
                                     std::int64_t prev, double prev_value, double* out) {
  std::int64_t best = -1;
  double best_value = 0.0;
  for (std::int64_t i = first; i < end; ++i) {
    const double v = value(i);
    if (prev >= 0 && !(v < prev_value || (v == prev_value && i > prev))) continue;
    if (best < 0 || v > best_value) {
      best = i;
      best_value = v;
    }
  }
  *out = best_value;
  return best;
}

// Group-limited routing: a mask of the group_topk groups whose top-(k / group_topk) values sum
// largest (ties to the lower expert, then group), summed in descending order as the CPU.
__device__ std::uint64_t chosen_groups(const MoeRouterForwardArgs& a, const float* l, double lse) {
  const std::int64_t G = a.cfg.num_groups, per = a.num_experts / G;
  const std::int64_t m = a.cfg.topk / a.cfg.group_topk;
  double score[kMoeMaxGroups];
  for (std::int64_t g = 0; g < G; ++g) {
    score[g] = 0.0;
    std::int64_t prev = -1;
    double prev_value = 0.0;
    for (std::int64_t i = 0; i < m; ++i) {
      double v = 0.0;
      prev = next_largest([&](std::int64_t e) { return group_value(a, l, lse, e); }, g * per,
                          (g + 1) * per, prev, prev_value, &v);
      if (prev < 0) break;
      score[g] += v;
      prev_value = v;
    }
  }
  std::uint64_t mask = 0;
  std::int64_t prev = -1;
  double prev_score = 0.0;
  for (std::int64_t i = 0; i < a.cfg.group_topk; ++i) {
    double v = 0.0;
    prev = next_largest([&](std::int64_t g) { return score[g]; }, 0, G, prev, prev_score, &v);
    if (prev < 0) break;
    mask |= std::uint64_t{1} << prev;
    prev_score = v;
  }
  return mask;
}

__global__ void moe_router_forward_kernel(MoeRouterForwardArgs a) {
  const std::int64_t E = a.num_experts, k = a.cfg.topk;
  const bool softmax = a.cfg.score == MoeScore::kSoftmax;
  for (std::int64_t n = global_thread(); n < a.tokens; n += grid_threads()) {
    const float* l = a.logits + n * E;
    float* s = a.scores + n * E;
    std::int32_t* experts = a.experts + n * k;
    float* weights = a.weights + n * k;
    double max = l[0];
    for (std::int64_t e = 1; e < E; ++e) max = fmax(max, static_cast<double>(l[e]));
    double sum = 0.0;
    for (std::int64_t e = 0; e < E; ++e) sum += exp(static_cast<double>(l[e]) - max);
    const double lse = max + log(sum);
    for (std::int64_t e = 0; e < E; ++e)
      s[e] = static_cast<float>(router_score(softmax, l[e], lse));
    if (a.lse != nullptr) a.lse[n] = static_cast<float>(lse);

    // Repeated argmax: the j-th choice is the largest key after the (j-1)-th in the total order
    // (key descending, expert ascending), so no marks are needed; with groups, among the chosen
    // groups' experts only.
    const bool grouped = a.cfg.num_groups > 1;
    const std::uint64_t groups = grouped ? chosen_groups(a, l, lse) : ~std::uint64_t{0};
    const std::int64_t per = grouped ? E / a.cfg.num_groups : E;
    const auto allowed = [&](std::int64_t e) { return ((groups >> (e / per)) & 1) != 0; };
    std::int64_t prev = -1;
    double prev_key = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t best = -1;
      double best_key = 0.0;
      for (std::int64_t e = 0; e < E; ++e) {
        if (!allowed(e)) continue;
        const double ke = router_key(a, l, lse, e);
        if (prev >= 0 && !(ke < prev_key || (ke == prev_key && e > prev))) continue;
        if (best < 0 || ke > best_key) {
          best = e;
          best_key = ke;
        }
      }
      if (best < 0) {  // only with NaN keys: the lowest expert not chosen yet
        for (std::int64_t e = 0; e < E && best < 0; ++e) {
          bool taken = false;
          for (std::int64_t i = 0; i < j; ++i) taken = taken || experts[i] == e;
          if (!taken && allowed(e)) best = e;
        }
        best_key = router_key(a, l, lse, best);
      }
      experts[j] = static_cast<std::int32_t>(best);
      prev = best;
      prev_key = best_key;
    }

    // weights[j] = scaling * q_j / z (z = 1: no normaliser), q and z in double.
    const bool topk_softmax = softmax && !a.cfg.pre_softmax;
    const double l0 = l[experts[0]];
    double z = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      z += topk_softmax ? exp(static_cast<double>(l[experts[j]]) - l0)
                        : router_score(softmax, l[experts[j]], lse);
    }
    if (softmax && a.cfg.pre_softmax) z = 1.0;
    if (!softmax) z = k > 1 ? z + 1e-20 : 1.0;
    const double scaling = a.cfg.scaling;
    for (std::int64_t j = 0; j < k; ++j) {
      const double q = topk_softmax ? exp(static_cast<double>(l[experts[j]]) - l0)
                                    : router_score(softmax, l[experts[j]], lse);
      weights[j] = static_cast<float>(scaling * (q / z));
    }
  }
}

// d_logits[n, e] = base(e) + (for a chosen e = e_j) combine_j, with base the load-balancing and
// z-loss terms and combine_j the combine's, each row written once per expert in double, then the
// chosen experts' entries rewritten with their combine term added.
__global__ void moe_router_backward_kernel(MoeRouterBackwardArgs a) {
  const std::int64_t E = a.num_experts, k = a.cfg.topk;
  const bool softmax = a.cfg.score == MoeScore::kSoftmax;
  const bool pre = softmax && a.cfg.pre_softmax;
  const double scaling = a.cfg.scaling;
  const double z2 = 2.0 * static_cast<double>(a.z_scale);
  for (std::int64_t n = global_thread(); n < a.tokens; n += grid_threads()) {
    const float* l = a.logits + n * E;
    const float* s = a.scores + n * E;
    const float* w = a.weights + n * k;
    const float* g = a.d_weights + n * k;
    const std::int32_t* ex = a.experts + n * k;
    const float* aux = a.d_aux != nullptr ? a.d_aux + (n / a.group_tokens) * E : nullptr;
    float* d = a.d_logits + n * E;
    const double lse = a.z_scale != 0.0f ? static_cast<double>(a.lse[n]) : 0.0;

    // sd = sum_f s_f d_s[f], d_s the gradient on the scores that goes through the full softmax:
    // d_aux, plus the combine's scaling * g_j at e_j with pre_softmax.
    double sd = 0.0;
    if (pre) {
      for (std::int64_t j = 0; j < k; ++j) sd += static_cast<double>(s[ex[j]]) * (scaling * g[j]);
    }
    if (softmax && aux != nullptr) {
      for (std::int64_t f = 0; f < E; ++f) sd += static_cast<double>(s[f]) * aux[f];
    }
    const bool jacobian = softmax && (pre || aux != nullptr);
    // base(e): everything but the combine's own entry at the chosen experts.
    auto base = [&](std::int64_t e) {
      double v = 0.0;
      if (jacobian) {
        const double ds = aux != nullptr ? static_cast<double>(aux[e]) : 0.0;
        v = static_cast<double>(s[e]) * (ds - sd);
      }
      if (a.z_scale != 0.0f) v += z2 * lse * exp(static_cast<double>(l[e]) - lse);
      return v;
    };
    for (std::int64_t e = 0; e < E; ++e) d[e] = static_cast<float>(base(e));

    if (softmax && !pre) {  // w_j = scaling p_j: d l[e_j] = w_j (g_j - sum_i p_i g_i)
      double pg = 0.0;
      for (std::int64_t j = 0; j < k; ++j) pg += static_cast<double>(w[j]) / scaling * g[j];
      for (std::int64_t j = 0; j < k; ++j) {
        d[ex[j]] = static_cast<float>(base(ex[j]) + static_cast<double>(w[j]) * (g[j] - pg));
      }
    } else if (pre) {  // d_s[e_j] = scaling g_j through the softmax's diagonal
      for (std::int64_t j = 0; j < k; ++j) {
        d[ex[j]] =
            static_cast<float>(base(ex[j]) + static_cast<double>(s[ex[j]]) * (scaling * g[j]));
      }
    } else {  // sigmoid: d q_j, then through s (1 - s)
      double q = 1e-20, gq = 0.0;
      for (std::int64_t j = 0; j < k; ++j) {
        q += s[ex[j]];
        gq += static_cast<double>(g[j]) * s[ex[j]];
      }
      for (std::int64_t j = 0; j < k; ++j) {
        const double dq = k > 1 ? scaling * (g[j] / q - gq / (q * q)) : scaling * g[j];
        const double se = s[ex[j]];
        d[ex[j]] = static_cast<float>(base(ex[j]) + dq * se * (1.0 - se));
      }
    }
  }
}

// ---- dispatch map -------------------------------------------------------------------------------

// Of the block's threads, how many below this one have flag set; *total: how many in all. Every
// thread of the block must call it (blockDim.x a multiple of 32, at most 1024).
__device__ int block_rank(bool flag, int* total) {
  __shared__ int warp_counts[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int below = __popc(ballot & ((1u << lane) - 1u));
  __syncthreads();  // warp_counts may still be read by a previous call
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x >> 5);
  int before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    if (w < warp) before += warp_counts[w];
    all += warp_counts[w];
  }
  *total = all;
  return before + below;
}

// A weight's bits, ordered as the floats are (-0 taken as +0, which compares equal to it).
__device__ __forceinline__ unsigned order_key(float w) {
  if (w == 0.0f) w = 0.0f;
  const unsigned u = __float_as_uint(w);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

__global__ void moe_dispatch_fill_kernel(std::int32_t* rows, std::int32_t* sources, std::int64_t nk,
                                         std::int64_t max_rows) {
  const std::int64_t n = nk > max_rows ? nk : max_rows;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    if (i < nk) rows[i] = -1;
    if (i < max_rows) sources[i] = -1;
  }
}

// Block e: counts[e] = the assignments to expert e, at most capacity (when > 0).
__global__ void moe_dispatch_count_kernel(std::int32_t* counts, const std::int32_t* experts,
                                          std::int64_t nk, std::int64_t capacity) {
  const std::int32_t e = static_cast<std::int32_t>(blockIdx.x);
  int c = 0;
  for (std::int64_t i = threadIdx.x; i < nk; i += blockDim.x) c += experts[i] == e ? 1 : 0;
  c = block_sum(c);
  if (threadIdx.x == 0) {
    counts[e] = static_cast<std::int32_t>(capacity > 0 && c > capacity ? capacity : c);
  }
}

// Block e: the rows of expert e's assignments, in token order from its offset; the dropped ones -1.
__global__ void moe_dispatch_assign_kernel(std::int32_t* rows, std::int32_t* sources,
                                           const std::int32_t* counts, const std::int32_t* experts,
                                           const float* weights, std::int64_t nk,
                                           std::int64_t capacity, int by_probs, int pad) {
  const std::int32_t e = static_cast<std::int32_t>(blockIdx.x);
  std::int64_t offset = 0;
  if (pad != 0) {
    offset = static_cast<std::int64_t>(e) * capacity;
  } else {
    int partial = 0;
    for (int f = static_cast<int>(threadIdx.x); f < e; f += static_cast<int>(blockDim.x)) {
      partial += counts[f];
    }
    offset = block_sum(partial);
  }

  // kProbs with a full expert: threshold t = the capacity-th largest key; keep the keys above t
  // and the first eq_keep of those equal to t (ties to the earlier token).
  const bool select = by_probs != 0 && counts[e] == capacity;
  unsigned t = 0;
  int eq_keep = 0;
  if (select) {
    unsigned lo = 0, hi = 0xffffffffu;
    while (lo < hi) {  // the largest t with at least capacity keys >= t
      const unsigned mid =
          static_cast<unsigned>(lo + ((static_cast<std::uint64_t>(hi) - lo + 1) >> 1));
      int c = 0;
      for (std::int64_t i = threadIdx.x; i < nk; i += blockDim.x) {
        c += experts[i] == e && order_key(weights[i]) >= mid ? 1 : 0;
      }
      c = block_sum(c);
      if (c >= capacity) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    t = lo;
    int above = 0;
    for (std::int64_t i = threadIdx.x; i < nk; i += blockDim.x) {
      above += experts[i] == e && order_key(weights[i]) > t ? 1 : 0;
    }
    eq_keep = static_cast<int>(capacity) - block_sum(above);
  }

  int kept_before = 0, eq_before = 0;
  for (std::int64_t base = 0; base < nk; base += blockDim.x) {
    const std::int64_t i = base + threadIdx.x;
    const bool mine = i < nk && experts[i] == e;
    bool keep = mine;
    if (select) {
      const unsigned key = mine ? order_key(weights[i]) : 0u;
      const bool eq = mine && key == t;
      int eq_total = 0;
      const int eq_rank = eq_before + block_rank(eq, &eq_total);
      eq_before += eq_total;
      keep = mine && (key > t || (eq && eq_rank < eq_keep));
    }
    int total = 0;
    const int rank = kept_before + block_rank(keep, &total);
    kept_before += total;
    // Without a threshold every assignment is ranked: keep the first `capacity` (kPosition, or
    // an expert under its capacity, where this keeps all).
    if (!select && capacity > 0 && rank >= capacity) keep = false;
    if (mine) {
      const std::int64_t row = offset + rank;
      rows[i] = keep ? static_cast<std::int32_t>(row) : -1;
      if (keep) sources[row] = static_cast<std::int32_t>(i);
    }
  }
}

// ---- permutation --------------------------------------------------------------------------------

__global__ void moe_permute_kernel(float* x_perm, const float* x, const std::int32_t* sources,
                                   std::int64_t nk, std::int64_t hidden, std::int64_t topk,
                                   std::int64_t n_out) {
  for (std::int64_t i = global_thread(); i < n_out; i += grid_threads()) {
    const std::int64_t r = i / hidden, c = i - r * hidden;
    const std::int64_t src = sources[r];
    x_perm[i] = src >= 0 && src < nk ? x[(src / topk) * hidden + c] : 0.0f;
  }
}

__global__ void moe_permute_backward_kernel(float* d_x, const float* d_x_perm,
                                            const std::int32_t* rows, std::int64_t n_out,
                                            std::int64_t hidden, std::int64_t topk,
                                            std::int64_t rows_out) {
  for (std::int64_t i = global_thread(); i < n_out; i += grid_threads()) {
    const std::int64_t n = i / hidden, c = i - n * hidden;
    float acc = d_x[i];
    for (std::int64_t j = 0; j < topk; ++j) {
      const std::int64_t r = rows[n * topk + j];
      if (r >= 0 && r < rows_out) acc += d_x_perm[r * hidden + c];
    }
    d_x[i] = acc;
  }
}

__global__ void moe_unpermute_kernel(float* out, const float* y_perm, const float* weights,
                                     const std::int32_t* rows, std::int64_t n_out,
                                     std::int64_t hidden, std::int64_t topk,
                                     std::int64_t rows_out) {
  for (std::int64_t i = global_thread(); i < n_out; i += grid_threads()) {
    const std::int64_t n = i / hidden, c = i - n * hidden;
    float acc = 0.0f;
    for (std::int64_t j = 0; j < topk; ++j) {
      const std::int64_t r = rows[n * topk + j];
      if (r >= 0 && r < rows_out) acc += weights[n * topk + j] * y_perm[r * hidden + c];
    }
    out[i] = acc;
  }
}

__global__ void moe_unpermute_backward_rows_kernel(float* d_y_perm, const float* d_out,
                                                   const float* weights,
                                                   const std::int32_t* sources, std::int64_t nk,
                                                   std::int64_t hidden, std::int64_t topk,
                                                   std::int64_t n_out) {
  for (std::int64_t i = global_thread(); i < n_out; i += grid_threads()) {
    const std::int64_t r = i / hidden, c = i - r * hidden;
    const std::int64_t src = sources[r];
    d_y_perm[i] = src >= 0 && src < nk ? weights[src] * d_out[(src / topk) * hidden + c] : 0.0f;
  }
}

// One warp per (n, j): d_weights[n, j] = d_out[n] . y_perm[rows[n, j]], lane partials in double
// over the columns lane, lane + 32, ..., added by warp_sum's fixed tree.
__global__ void moe_unpermute_backward_weights_kernel(float* d_weights, const float* d_out,
                                                      const float* y_perm, const std::int32_t* rows,
                                                      std::int64_t nk, std::int64_t hidden,
                                                      std::int64_t topk, std::int64_t rows_out) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t warps = grid_threads() / 32;
  for (std::int64_t p = global_thread() / 32; p < nk; p += warps) {
    const std::int64_t n = p / topk, r = rows[p];
    double acc = 0.0;
    if (r >= 0 && r < rows_out) {
      const float* a = d_out + n * hidden;
      const float* b = y_perm + r * hidden;
      for (std::int64_t c = lane; c < hidden; c += 32) {
        acc += static_cast<double>(a[c]) * static_cast<double>(b[c]);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) d_weights[p] = static_cast<float>(acc);
  }
}

}  // namespace

void moe_router_forward(const ExecContext& ctx, const MoeRouterForwardArgs& args) {
  if (args.tokens == 0 || args.num_experts == 0) return;  // checked in kernels/moe.cc
  moe_router_forward_kernel<<<grid_for(args.tokens, kTokenThreads), kTokenThreads, 0,
                              stream_of(ctx)>>>(args);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_router_forward");
}

void moe_router_backward(const ExecContext& ctx, const MoeRouterBackwardArgs& args) {
  if (args.tokens == 0 || args.num_experts == 0) return;
  moe_router_backward_kernel<<<grid_for(args.tokens, kTokenThreads), kTokenThreads, 0,
                               stream_of(ctx)>>>(args);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_router_backward");
}

void moe_dispatch_map(const ExecContext& ctx, const MoeDispatchMapArgs& args) {
  const std::int64_t E = args.num_experts, nk = args.tokens * args.topk;
  if (E == 0) return;
  const cudaStream_t stream = stream_of(ctx);
  const std::int64_t fill = nk > args.max_rows ? nk : args.max_rows;
  if (fill > 0) {
    moe_dispatch_fill_kernel<<<grid_for(fill, kThreads), kThreads, 0, stream>>>(
        args.rows, args.sources, nk, args.max_rows);
    TRIDENT_CUDA_LAUNCH_CHECK("moe_dispatch_map (fill)");
  }
  const unsigned blocks = static_cast<unsigned>(E);
  moe_dispatch_count_kernel<<<blocks, kExpertThreads, 0, stream>>>(args.counts, args.experts, nk,
                                                                   args.capacity);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_dispatch_map (count)");
  if (nk == 0) return;
  const int by_probs = args.capacity > 0 && args.policy == MoeDropPolicy::kProbs ? 1 : 0;
  moe_dispatch_assign_kernel<<<blocks, kExpertThreads, 0, stream>>>(
      args.rows, args.sources, args.counts, args.experts, args.weights, nk, args.capacity, by_probs,
      args.pad_to_capacity ? 1 : 0);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_dispatch_map (assign)");
}

void moe_permute(const ExecContext& ctx, const MoePermuteArgs& args) {
  const std::int64_t n_out = args.rows_out * args.hidden;
  if (n_out == 0) return;
  moe_permute_kernel<<<grid_for(n_out, kThreads), kThreads, 0, stream_of(ctx)>>>(
      args.x_perm, args.x, args.sources, args.tokens * args.topk, args.hidden, args.topk, n_out);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_permute");
}

void moe_permute_backward(const ExecContext& ctx, const MoePermuteBackwardArgs& args) {
  const std::int64_t n_out = args.tokens * args.hidden;
  if (n_out == 0 || args.topk == 0) return;
  moe_permute_backward_kernel<<<grid_for(n_out, kThreads), kThreads, 0, stream_of(ctx)>>>(
      args.d_x, args.d_x_perm, args.rows, n_out, args.hidden, args.topk, args.rows_out);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_permute_backward");
}

void moe_unpermute(const ExecContext& ctx, const MoeUnpermuteArgs& args) {
  const std::int64_t n_out = args.tokens * args.hidden;
  if (n_out == 0) return;
  moe_unpermute_kernel<<<grid_for(n_out, kThreads), kThreads, 0, stream_of(ctx)>>>(
      args.out, args.y_perm, args.weights, args.rows, n_out, args.hidden, args.topk, args.rows_out);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_unpermute");
}

void moe_unpermute_backward(const ExecContext& ctx, const MoeUnpermuteBackwardArgs& args) {
  const cudaStream_t stream = stream_of(ctx);
  const std::int64_t nk = args.tokens * args.topk, n_out = args.rows_out * args.hidden;
  if (n_out > 0) {
    moe_unpermute_backward_rows_kernel<<<grid_for(n_out, kThreads), kThreads, 0, stream>>>(
        args.d_y_perm, args.d_out, args.weights, args.sources, nk, args.hidden, args.topk, n_out);
    TRIDENT_CUDA_LAUNCH_CHECK("moe_unpermute_backward (d_y_perm)");
  }
  if (nk > 0) {
    moe_unpermute_backward_weights_kernel<<<grid_for(nk * 32, kThreads), kThreads, 0, stream>>>(
        args.d_weights, args.d_out, args.y_perm, args.rows, nk, args.hidden, args.topk,
        args.rows_out);
    TRIDENT_CUDA_LAUNCH_CHECK("moe_unpermute_backward (d_weights)");
  }
}

namespace {

__global__ void moe_shared_gate_kernel(float* out, const float* shared, const float* logits,
                                       std::int64_t n_out, std::int64_t hidden) {
  for (std::int64_t i = global_thread(); i < n_out; i += grid_threads()) {
    const std::int64_t n = i / hidden;
    const float g = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(logits[n]))));
    out[i] += g * shared[i];
  }
}

// One warp per token: d_shared's row, and d_logits[n] from the lanes' double partials over the
// columns lane, lane + 32, ..., added by warp_sum's fixed tree.
__global__ void moe_shared_gate_backward_kernel(float* d_shared, float* d_logits,
                                                const float* d_out, const float* shared,
                                                const float* logits, std::int64_t tokens,
                                                std::int64_t hidden) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t warps = grid_threads() / 32;
  for (std::int64_t n = global_thread() / 32; n < tokens; n += warps) {
    const double g = 1.0 / (1.0 + exp(-static_cast<double>(logits[n])));
    const float gf = static_cast<float>(g);
    double acc = 0.0;
    for (std::int64_t c = lane; c < hidden; c += 32) {
      const std::int64_t i = n * hidden + c;
      d_shared[i] = gf * d_out[i];
      acc += static_cast<double>(d_out[i]) * static_cast<double>(shared[i]);
    }
    acc = warp_sum(acc);
    if (lane == 0) d_logits[n] = static_cast<float>(g * (1.0 - g) * acc);
  }
}

}  // namespace

void moe_shared_gate_forward(const ExecContext& ctx, const MoeSharedGateArgs& args) {
  const std::int64_t n_out = args.tokens * args.hidden;
  if (n_out == 0) return;
  moe_shared_gate_kernel<<<grid_for(n_out, kThreads), kThreads, 0, stream_of(ctx)>>>(
      args.out, args.shared, args.logits, n_out, args.hidden);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_shared_gate_forward");
}

void moe_shared_gate_backward(const ExecContext& ctx, const MoeSharedGateBackwardArgs& args) {
  if (args.tokens == 0) return;
  moe_shared_gate_backward_kernel<<<grid_for(args.tokens * 32, kThreads), kThreads, 0,
                                    stream_of(ctx)>>>(
      args.d_shared, args.d_logits, args.d_out, args.shared, args.logits, args.tokens, args.hidden);
  TRIDENT_CUDA_LAUNCH_CHECK("moe_shared_gate_backward");
}

}  // namespace trident::kernels::cuda
