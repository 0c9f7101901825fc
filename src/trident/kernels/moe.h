// Mixture-of-experts routing: Megatron-Core's top-k router (moe/router.py, moe_utils.py
// topk_softmax_with_capacity) and its token permutation (moe_utils.py permute / unpermute), as
// four ops with their backward passes. N tokens, E experts, k experts per token, C hidden.
//
//   moe_router_forward    logits (N, E) -> scores (N, E), experts (N, k), weights (N, k)
//   moe_dispatch_map      experts, weights -> rows (N, k), sources (R), counts (E): where each
//                         (token, choice) goes in the expert-major permuted order, what is dropped
//   moe_permute           x (N, C) -> x_perm (R, C): each expert's tokens contiguous
//   moe_unpermute         y_perm (R, C) -> out (N, C) = sum_j weights[n, j] * y_perm[rows[n, j]]
//   moe_shared_gate       out (N, C) += sigmoid(logits[n]) * shared (N, C) (Qwen2-MoE's gate)
//
// Routing is deterministic: ties in the top-k go to the lower expert index, an expert's rows are
// in token order, a capacity drop (policy probs) keeps the larger weights and, among equal
// weights, the earlier token; so every parallel layout routes identically.
//
// Callers use the typed views (checked in kernels/moe.cc: dtype, shape, contiguity, device; a
// mismatch is a core::InvalidArgument naming the view). The raw Args structs are the backend
// contract the CPU bodies (kernels/cpu/moe.cc), the CUDA bodies (kernels/cuda/moe.cu) and the
// reference (kernels/ref/moe_ref.cc) implement.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

// --moe-router-score-function.
enum class MoeScore : std::int32_t { kSoftmax = 0, kSigmoid = 1 };
// --moe-token-drop-policy: which of an over-full expert's tokens it keeps.
enum class MoeDropPolicy : std::int32_t { kProbs = 0, kPosition = 1 };

struct MoeRouterConfig {
  std::int64_t topk = 1;
  MoeScore score = MoeScore::kSoftmax;
  bool pre_softmax = false;  // --moe-router-pre-softmax (softmax only)
  float scaling = 1.0f;      // --moe-router-topk-scaling-factor (1: none)
  // Group-limited routing (DeepSeek-V3; --moe-router-num-groups, --moe-router-group-topk): the
  // experts in num_groups equal groups of consecutive indices, and a token's k experts chosen
  // only among the group_topk groups of largest group score. 0 or 1 groups: no limit.
  std::int64_t num_groups = 0;  // divides E; at most kMoeMaxGroups
  std::int64_t group_topk = 0;  // 1..num_groups, divides topk, topk <= group_topk * E / groups
};
// The most groups group-limited routing takes (a token's chosen groups fit one 64-bit mask).
inline constexpr std::int64_t kMoeMaxGroups = 64;

// For each token n (l = logits[n, :]):
//   scores[n, e] = softmax(l)[e]                              (kSoftmax)
//                = sigmoid(l[e])                              (kSigmoid)
//   experts[n, :] = the k largest keys, in descending order, ties to the lower expert, of
//                 l[e]                    (kSoftmax: the softmax is monotone, so with or without
//                                          pre_softmax these are the k largest scores; the
//                                          logits are the key so that every backend picks alike)
//                 l[e]                    (kSigmoid without a bias, for the same reason)
//                 sigmoid(l[e]) + bias[e] (kSigmoid with expert_bias; in double)
//   weights[n, j] = scaling * q_j with, for the chosen e_j,
//                 q_j = softmax over the k chosen logits       (kSoftmax, !pre_softmax)
//                 q_j = scores[n, e_j]                          (kSoftmax, pre_softmax)
//                 q_j = scores[n, e_j] / (sum_i scores[n, e_i] + 1e-20) if k > 1, else
//                       scores[n, e_j]                          (kSigmoid)
//   lse[n] = log sum_e exp(l[e])   (the router z-loss's; any score function)
// Group-limited (cfg.num_groups G > 1, as Megatron-Core's group_limited_topk): each group's score
// is the sum of its top-(k / group_topk) values of
//                 l[e]                    (kSoftmax, !pre_softmax: Megatron groups the logits)
//                 softmax(l)[e]           (kSoftmax, pre_softmax)
//                 sigmoid(l[e]) (+ bias[e] with expert_bias)   (kSigmoid)
// (in double; ties to the lower expert, then group); the group_topk groups of largest score are
// kept (ties to the lower group), and experts[n, :] are the k largest keys among their experts.
// All outputs are written (=); lse may be null.
template <class T>
struct BasicMoeRouterForwardArgs {
  T* scores = nullptr;              // (N, E)
  std::int32_t* experts = nullptr;  // (N, k)
  T* weights = nullptr;             // (N, k)
  T* lse = nullptr;                 // (N) or null
  const T* logits = nullptr;        // (N, E)
  const T* expert_bias = nullptr;   // (E) or null; kSigmoid only
  std::int64_t tokens = 0, num_experts = 0;
  MoeRouterConfig cfg{};
};
using MoeRouterForwardArgs = BasicMoeRouterForwardArgs<float>;

// d_logits (=) is the gradient of
//   sum_{n,j} d_weights[n, j] * weights[n, j]                          (the combine's)
// + sum_{n,e} d_aux[n / group_tokens, e] * scores[n, e]                (load balancing; kSoftmax)
// + z_scale * sum_n lse[n]^2                                           (router z-loss)
// with respect to the logits; the expert choice is piecewise constant (no gradient) and the
// expert bias has none. d_aux (groups, E) may be null (no load-balancing term); group_tokens
// splits the tokens into consecutive groups (N for one global group, the sequence length for
// Megatron's per-sequence loss). z_scale 0: no z-loss term (lse may then be null).
template <class T>
struct BasicMoeRouterBackwardArgs {
  T* d_logits = nullptr;                  // (N, E)  written (=)
  const T* d_weights = nullptr;           // (N, k)
  const T* weights = nullptr;             // (N, k)  from the forward
  const T* d_aux = nullptr;               // (N / group_tokens, E) or null
  const T* logits = nullptr;              // (N, E)
  const T* scores = nullptr;              // (N, E)  from the forward
  const std::int32_t* experts = nullptr;  // (N, k)  from the forward
  const T* lse = nullptr;                 // (N)     from the forward; null when z_scale is 0
  std::int64_t tokens = 0, num_experts = 0, group_tokens = 0;
  T z_scale = 0;
  MoeRouterConfig cfg{};
};
using MoeRouterBackwardArgs = BasicMoeRouterBackwardArgs<float>;

// The permuted order: expert 0's rows, then expert 1's, ...; within an expert, its tokens in
// token order. With capacity 0 (dropless) every (n, j) is kept and there are N * k rows. With a
// capacity c > 0, an expert chosen by more than c tokens keeps c of them (policy kProbs: the c
// largest weights, ties to the earlier token; kPosition: the first c tokens); the others are
// dropped (rows[n, j] = -1: the token's output lacks that expert's part). pad_to_capacity: expert
// e's rows are [e * c, e * c + counts[e]) and the rest of its c rows are padding (sources -1), so
// there are E * c rows.
//   rows[n, j]  = the permuted row of (n, j), or -1 when dropped                    (=)
//   counts[e]   = the rows expert e keeps (its tokens, without padding)             (=)
//   sources[r]  = n * k + j of permuted row r, or -1 for padding and for every r at or beyond
//                 the row count, up to max_rows                                     (=)
struct MoeDispatchMapArgs {
  std::int32_t* rows = nullptr;           // (N, k)
  std::int32_t* counts = nullptr;         // (E)
  std::int32_t* sources = nullptr;        // (max_rows)
  const std::int32_t* experts = nullptr;  // (N, k)
  const float* weights = nullptr;         // (N, k); read only for a capacity with kProbs
  std::int64_t tokens = 0, num_experts = 0, topk = 1;
  std::int64_t capacity = 0;  // 0: dropless
  MoeDropPolicy policy = MoeDropPolicy::kProbs;
  bool pad_to_capacity = false;
  std::int64_t max_rows = 0;  // sources' length: >= N * k (dropless), >= E * capacity (padded)
};

// x_perm[r] = x[sources[r] / k] (0 where sources[r] < 0), for r < rows_out.
struct MoePermuteArgs {
  float* x_perm = nullptr;                // (rows_out, C)  written (=)
  const float* x = nullptr;               // (N, C)
  const std::int32_t* sources = nullptr;  // (rows_out)
  std::int64_t tokens = 0, hidden = 0, topk = 1, rows_out = 0;
};
// d_x[n] += sum_j d_x_perm[rows[n, j]] over the kept (n, j), in j order.
struct MoePermuteBackwardArgs {
  float* d_x = nullptr;                // (N, C)  accumulated (+=)
  const float* d_x_perm = nullptr;     // (rows_out, C)
  const std::int32_t* rows = nullptr;  // (N, k)
  std::int64_t tokens = 0, hidden = 0, topk = 1, rows_out = 0;
};

// out[n] = sum_j weights[n, j] * y_perm[rows[n, j]] over the kept (n, j), in j order (a token
// whose every choice was dropped gets 0).
struct MoeUnpermuteArgs {
  float* out = nullptr;                // (N, C)  written (=)
  const float* y_perm = nullptr;       // (rows_out, C)
  const float* weights = nullptr;      // (N, k)
  const std::int32_t* rows = nullptr;  // (N, k)
  std::int64_t tokens = 0, hidden = 0, topk = 1, rows_out = 0;
};
// d_y_perm[r] = weights[n, j] * d_out[n] for sources[r] = n * k + j, 0 for padding (=);
// d_weights[n, j] = d_out[n] . y_perm[rows[n, j]], 0 when dropped (=).
struct MoeUnpermuteBackwardArgs {
  float* d_y_perm = nullptr;              // (rows_out, C)
  float* d_weights = nullptr;             // (N, k)
  const float* d_out = nullptr;           // (N, C)
  const float* y_perm = nullptr;          // (rows_out, C)
  const float* weights = nullptr;         // (N, k)
  const std::int32_t* rows = nullptr;     // (N, k)
  const std::int32_t* sources = nullptr;  // (rows_out)
  std::int64_t tokens = 0, hidden = 0, topk = 1, rows_out = 0;
};

// Qwen2-MoE's shared-expert gate: out[n] += sigmoid(logits[n]) * shared[n] (the shared experts'
// output weighed by a per-token sigmoid gate, added to the routed experts' combine).
template <class T>
struct BasicMoeSharedGateArgs {
  T* out = nullptr;           // (N, C)  accumulated (+=)
  const T* shared = nullptr;  // (N, C)
  const T* logits = nullptr;  // (N)     the gate's logits
  std::int64_t tokens = 0, hidden = 0;
};
using MoeSharedGateArgs = BasicMoeSharedGateArgs<float>;
// d_shared[n] = sigmoid(logits[n]) d_out[n] (=); d_logits[n] = sigmoid' (logits[n]) (d_out[n] .
// shared[n]) (=), the dot product in double.
template <class T>
struct BasicMoeSharedGateBackwardArgs {
  T* d_shared = nullptr;      // (N, C)  written (=)
  T* d_logits = nullptr;      // (N)     written (=)
  const T* d_out = nullptr;   // (N, C)
  const T* shared = nullptr;  // (N, C)
  const T* logits = nullptr;  // (N)
  std::int64_t tokens = 0, hidden = 0;
};
using MoeSharedGateBackwardArgs = BasicMoeSharedGateBackwardArgs<float>;

// The typed views. N and E come from logits, k from experts; f32 unless marked i32.
struct MoeRouterViews {
  core::TensorView scores{};       // (N, E)  written (=)
  core::TensorView experts{};      // (N, k)  i32, written (=)
  core::TensorView weights{};      // (N, k)  written (=)
  core::TensorView lse{};          // (N)     written (=), or empty
  core::TensorView logits{};       // (N, E)
  core::TensorView expert_bias{};  // (E) or empty; kSigmoid only
  MoeRouterConfig cfg{};           // cfg.topk must equal experts' second dimension
};
void moe_router(const core::ExecContext& ctx, const MoeRouterViews& v);

struct MoeRouterBackwardViews {
  core::TensorView d_logits{};    // (N, E)  written (=)
  core::TensorView d_weights{};   // (N, k)
  core::TensorView weights{};     // (N, k)  from the forward
  core::TensorView d_aux{};       // (N / group_tokens, E) or empty
  core::TensorView logits{};      // (N, E)
  core::TensorView scores{};      // (N, E)
  core::TensorView experts{};     // (N, k)  i32
  core::TensorView lse{};         // (N), or empty when z_scale is 0
  std::int64_t group_tokens = 0;  // 0: N (one group)
  float z_scale = 0.0f;
  MoeRouterConfig cfg{};
};
void moe_router_backward(const core::ExecContext& ctx, const MoeRouterBackwardViews& v);

struct MoeDispatchMapViews {
  core::TensorView rows{};     // (N, k)      i32, written (=)
  core::TensorView counts{};   // (E)         i32, written (=)
  core::TensorView sources{};  // (max_rows)  i32, written (=)
  core::TensorView experts{};  // (N, k)      i32
  core::TensorView weights{};  // (N, k), or empty unless capacity > 0 with kProbs
  std::int64_t num_experts = 0;
  std::int64_t capacity = 0;
  MoeDropPolicy policy = MoeDropPolicy::kProbs;
  bool pad_to_capacity = false;
};
void moe_dispatch_map(const core::ExecContext& ctx, const MoeDispatchMapViews& v);

// x_perm's first dimension is rows_out (sources holds at least that many).
struct MoePermuteViews {
  core::TensorView x_perm{};   // (rows_out, C)  written (=)
  core::TensorView x{};        // (N, C)
  core::TensorView sources{};  // (>= rows_out) i32
  std::int64_t topk = 1;
};
void moe_permute(const core::ExecContext& ctx, const MoePermuteViews& v);

struct MoePermuteBackwardViews {
  core::TensorView d_x{};       // (N, C)  accumulated (+=)
  core::TensorView d_x_perm{};  // (rows_out, C)
  core::TensorView rows{};      // (N, k)  i32
};
void moe_permute_backward(const core::ExecContext& ctx, const MoePermuteBackwardViews& v);

struct MoeUnpermuteViews {
  core::TensorView out{};      // (N, C)  written (=)
  core::TensorView y_perm{};   // (rows_out, C)
  core::TensorView weights{};  // (N, k)
  core::TensorView rows{};     // (N, k)  i32
};
void moe_unpermute(const core::ExecContext& ctx, const MoeUnpermuteViews& v);

struct MoeUnpermuteBackwardViews {
  core::TensorView d_y_perm{};   // (rows_out, C)  written (=)
  core::TensorView d_weights{};  // (N, k)         written (=)
  core::TensorView d_out{};      // (N, C)
  core::TensorView y_perm{};     // (rows_out, C)
  core::TensorView weights{};    // (N, k)
  core::TensorView rows{};       // (N, k)  i32
  core::TensorView sources{};    // (>= rows_out) i32
};
void moe_unpermute_backward(const core::ExecContext& ctx, const MoeUnpermuteBackwardViews& v);

struct MoeSharedGateViews {
  core::TensorView out{};     // (N, C)  accumulated (+=)
  core::TensorView shared{};  // (N, C)
  core::TensorView logits{};  // (N)
};
void moe_shared_gate(const core::ExecContext& ctx, const MoeSharedGateViews& v);

struct MoeSharedGateBackwardViews {
  core::TensorView d_shared{};  // (N, C)  written (=)
  core::TensorView d_logits{};  // (N)     written (=)
  core::TensorView d_out{};     // (N, C)
  core::TensorView shared{};    // (N, C)
  core::TensorView logits{};    // (N)
};
void moe_shared_gate_backward(const core::ExecContext& ctx, const MoeSharedGateBackwardViews& v);

namespace ref {
// The specification (ref/moe_ref.cc), over the element type T for the router (docs/architecture.md,
// "How to add an op").
template <class T = float>
void moe_router_forward(const BasicMoeRouterForwardArgs<T>& args);
template <class T = float>
void moe_router_backward(const BasicMoeRouterBackwardArgs<T>& args);
void moe_dispatch_map(const MoeDispatchMapArgs& args);
void moe_permute(const MoePermuteArgs& args);
void moe_permute_backward(const MoePermuteBackwardArgs& args);
void moe_unpermute(const MoeUnpermuteArgs& args);
void moe_unpermute_backward(const MoeUnpermuteBackwardArgs& args);
template <class T = float>
void moe_shared_gate_forward(const BasicMoeSharedGateArgs<T>& args);
template <class T = float>
void moe_shared_gate_backward(const BasicMoeSharedGateBackwardArgs<T>& args);
}  // namespace ref

}  // namespace trident::kernels
