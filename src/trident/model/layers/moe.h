// The mixture-of-experts MLP (Megatron-Core's MoELayer with the token-permutation dispatcher,
// DeepSpeed-MoE's layer): a router picks k of E expert MLPs per token, the tokens are permuted so
// that each expert's are contiguous, each expert runs its MLP on its rows, and the outputs are
// combined, weighted by the router:
//
//   logits = in @ router^T                         (rows, E)
//   scores, experts, weights = top-k router        (kernels/moe.h)
//   x_perm = in permuted by expert (capacity drops: a dropped choice adds nothing)
//   y_perm[expert e's rows] = mlp_e(x_perm[its rows])    (GeLU or SwiGLU, no biases)
//   out[n] = sum_j weights[n, j] * y_perm[row of (n, j)]
//
// plus, for training, the load-balancing loss (Switch / GShard: E / (k N^2) * sum_e
// (sum_n scores[n, e]) * tokens_e, times its coefficient; per sequence with
// MoeConfig::aux_per_sequence) and the router z-loss (mean_n logsumexp(logits[n])^2 times its
// coefficient), whose gradients enter the router's backward.
//
// Expert parallelism (MoeConfig::ep_size > 1, Megatron-Core's all-to-all dispatcher): this rank
// holds experts [ep_rank * E / ep, (ep_rank + 1) * E / ep) and routes only its own tokens; the
// permuted rows (expert-major, so each rank's block is contiguous) go by all-to-all over the ep
// group to the ranks holding their experts, after an all-gather of the per-expert row counts;
// each rank regroups what it received by expert, runs its experts, and the outputs come back by
// the reverse all-to-all (the backward moves the gradients the same two ways). The routing, the
// drops and every per-row result are those of expert parallelism 1.
//
// Every expert's MLP is tensor-parallel as the dense MLP: its F
// split over the tp ranks (column-parallel up-projection, row-parallel down-projection), the router
// replicated (every tp rank routes the full rows alike: with sequence parallelism, the gathered
// rows), the combine's partial sums reduced over tp (SP: reduce-scattered). In the backward the
// routing weights' gradient is summed over tp before the router's backward.
// The per-expert matmuls read each expert's row count on the host (one small device read per
// layer call, as Megatron's dispatcher does).
#pragma once

#include <vector>

#include "trident/kernels/moe.h"
#include "trident/model/layers/layer.h"
#include "trident/model/layers/mlp.h"
#include "trident/model/layers/weights.h"

namespace trident::model::layers {

struct MoeConfig {
  std::int64_t hidden = 0;       // C
  std::int64_t num_experts = 0;  // E
  std::int64_t ffn = 0;          // each expert's F (--moe-ffn-hidden-size)
  Activation activation = Activation::kSwiGlu;
  kernels::MoeRouterConfig router{};
  // --moe-expert-capacity-factor (0: dropless): capacity = ceil(factor * rows * k / E).
  double capacity_factor = 0.0;
  kernels::MoeDropPolicy drop_policy = kernels::MoeDropPolicy::kProbs;
  bool pad_to_capacity = false;
  double aux_loss_coeff = 0.0;    // --moe-aux-loss-coeff
  bool aux_per_sequence = false;  // --moe-router-load-balancing-type seq_aux_loss
  double z_loss_coeff = 0.0;      // --moe-z-loss-coeff
  int ep_size = 1;                // --expert-model-parallel-size: divides num_experts
  // Shared experts (--moe-shared-expert-intermediate-size, 0: none): a dense MLP beside the
  // routed experts, tensor-parallel as the dense MLP, its output added to the combine; with
  // shared_gate (Qwen2-MoE's shared_expert_gate) weighed by sigmoid(in . g) per token.
  std::int64_t shared_ffn = 0;
  bool shared_gate = false;
  // DeepSeek-V3's expert bias ("router.expert_bias" (E), sigmoid router): added to the scores for
  // the choice only. Not trained: it has no gradient; the trainer moves it after each step.
  bool expert_bias = false;

  MlpConfig shared_mlp() const {
    return {.activation = activation, .hidden = hidden, .ffn = shared_ffn, .bias = false};
  }

  std::int64_t local_experts() const { return num_experts / ep_size; }
  // The rows the permuted buffers hold for `rows` tokens: every choice (dropless), at most the
  // capacity per expert, or exactly that (padded).
  std::int64_t capacity(std::int64_t rows) const;
  std::int64_t max_rows(std::int64_t rows) const;
  // The rows this rank's experts may receive when every ep rank routes `rows` tokens (max_rows
  // without expert parallelism): each token picks a local expert at most min(k, E / ep) times.
  std::int64_t max_local_rows(std::int64_t rows) const;
};

struct MoeParams {
  Weight router;     // (E, C)
  Weight fc_w;       // (E, F, C); SwiGLU: (E, 2, F, C), each expert's gate block then its up block
  Weight fc2_w;      // (E, C, F)
  MlpParams shared;  // the shared experts' MLP (shared_ffn > 0)
  const float* shared_gate = nullptr;  // (1, C) with shared_gate
  const float* expert_bias = nullptr;  // (E) with expert_bias
};
struct MoeGrads {
  float *router = nullptr, *fc_w = nullptr, *fc2_w = nullptr;
  MlpGrads shared;
  float* shared_gate = nullptr;
};
// "router.weight" (E, C), "experts.dense_h_to_4h.weight" and "experts.dense_4h_to_h.weight"
// (expert e's matrices at index e of the first dimension, split over the expert-parallel ranks),
// and with shared experts "shared_experts.dense_h_to_4h.weight" / "dense_4h_to_h.weight" (the
// dense MLP's) and "shared_experts.gate_weight" (1, C).
void declare_moe(const MoeConfig& cfg, const WeightScope& s, MoeParams* p, MoeGrads* g);

// The activations the backward reads (rows = this call's tokens, R = cfg.max_rows(rows)); int32
// buffers in their own type.
struct MoeSaved {
  float* logits = nullptr;          // (rows, E)
  float* scores = nullptr;          // (rows, E)
  std::int32_t* experts = nullptr;  // (rows, k)
  float* weights = nullptr;         // (rows, k)
  float* lse = nullptr;             // (rows)
  std::int32_t* rows_of = nullptr;  // (rows, k) the permuted row of each choice, -1 dropped
  std::int32_t* sources = nullptr;  // (R)
  std::int32_t* counts = nullptr;   // (E) on the device
  float* x_perm = nullptr;          // (R, C)
  // RL = cfg.max_local_rows(rows): the rows this rank's experts run on (R without expert
  // parallelism, where x_loc is x_perm and may be null).
  float* x_loc = nullptr;   // (RL, C) expert parallelism: the received rows, by local expert
  float* fc = nullptr;      // (RL, F); SwiGLU (RL, 2F)
  float* act = nullptr;     // (RL, F)
  float* y_perm = nullptr;  // (R, C)
  // Shared experts: their MLP's saved set, their output (local rows, C) and the gate's logits
  // (local rows).
  MlpSaved shared;
  float* shared_out = nullptr;
  float* shared_logits = nullptr;
};

// What the router did in one call (host values, for the loss and the log).
struct MoeStats {
  std::vector<std::int32_t> tokens_per_expert;  // kept rows per expert
  std::int64_t dropped = 0;                     // choices dropped by the capacity
  double aux_loss = 0.0;                        // the load-balancing loss, with its coefficient
  double z_loss = 0.0;                          // the router z-loss, with its coefficient
};

struct MoeForwardArgs {
  float* out = nullptr;       // (rows, C) written
  const float* in = nullptr;  // (rows, C)
  MoeSaved saved;
  MoeStats* stats = nullptr;  // filled when not null
};
void moe_forward(const LayerContext& lc, const MoeConfig& cfg, const MoeParams& p,
                 const MoeForwardArgs& args);

// Returns the gradient of `in` (rows, C, in the workspace's d_ln); grads +=. aux_grad_scale is the
// gradient of the training loss with respect to the auxiliary losses (1 when they are added to
// the loss as they are; the trainer's normalisation otherwise).
struct MoeBackwardArgs {
  const float* d_out = nullptr;  // (rows, C)
  const float* in = nullptr;     // the forward's input
  MoeSaved saved;
  MoeGrads grads;
  double aux_grad_scale = 1.0;
  // Scratch: (rows, k), (rows, E), (R, C), (RL, F or 2F), (RL, F), (E or E x sequences) floats.
  float* d_weights = nullptr;
  float* d_logits = nullptr;
  float* d_perm = nullptr;
  float* d_fc = nullptr;
  float* d_act = nullptr;
  float* d_aux = nullptr;
  // Shared experts: (local rows, C) for their input gradient, (local rows, C) and (local rows)
  // for the gate's backward.
  float* d_shared_in = nullptr;
  float* d_shared_out = nullptr;
  float* d_shared_logits = nullptr;
};
const float* moe_backward(const LayerContext& lc, const MoeConfig& cfg, const MoeParams& p,
                          const MoeBackwardArgs& args);

}  // namespace trident::model::layers
