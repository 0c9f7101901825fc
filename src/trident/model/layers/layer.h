// What every layer of model/layers/ shares: the weight view (precision is a property of the view),
// the one matmul entry point `linear`, the per-call context (tensor-parallel region, scratch,
// dropout keys) and the hidden dropout sites.
//
// Layer conventions (docs/architecture.md, "The model as layers"): each layer file has a Params
// struct (views of its weights), a Grads struct (same shapes, every field ACCUMULATES +=), a Saved
// struct (the activations its backward reads, carved from the activation arena by the caller), a
// forward and a backward written side by side, the backward the mirror list of the forward. Rows
// are tokens of the micro-batch (B*T, or this rank's B*T/tp with sequence parallelism: "local").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/core/view.h"
#include "trident/parallel/tp_ops.h"

namespace trident::model::layers {

// A matmul weight: the FP32 master view and, under --bf16, its BF16 copy. When the BF16 copy is
// set, the matmul runs with BF16 operands and FP32 accumulation and output. Layers never choose a
// precision: they hand the view to `linear`.
struct Weight {
  const float* f32 = nullptr;
  const core::bf16* bf16 = nullptr;
};

// Scratch shared by the layers of one micro-batch (from the activation arena; see gpt.h).
struct Workspace {
  float* gathered = nullptr;  // (B*T, C): an all-gathered input (SP), or a row-parallel partial sum
  float* d_full = nullptr;    // (B*T, C): an all-gathered gradient (SP)
  float* d_drop = nullptr;    // (rows, C): the gradient through a dropout
  float* d_ln = nullptr;      // (B*T, C): a layer's input gradient before its tp reduction
  float* d_attn = nullptr;    // (B*T, C/tp)
  float* d_qkv = nullptr;     // (B*T, 3C/tp)
  float* d_fc = nullptr;      // (B*T, F/tp); SwiGLU: (B*T, 2F/tp)
  float* d_act = nullptr;     // (B*T, F/tp) SwiGLU: the gradient of the activation's output
  float* qkv_grouped = nullptr;          // (B*T, Q/tp) rotary / grouped-query: the QKV projection's
                                         // output before the expansion, and its gradient
  float* d_probs = nullptr;              // (B, NH/tp, T, T) unfused attention
  float* probs = nullptr;                // (B, NH/tp, T, T) selective recomputation's probabilities
  core::bf16* bf16_in = nullptr;         // --bf16: a matmul input in BF16 (widest input)
  core::bf16* bf16_dout = nullptr;       // --bf16: a matmul's upstream gradient in BF16
  std::span<std::byte> gemm_scratch{};   // oneDNN's BF16 workspace
  std::span<std::byte> fused_scratch{};  // bias_gelu_backward's per-chunk partial sums
  std::span<std::byte> norm_scratch{};   // residual_layernorm_backward's per-chunk partial sums
  // Mixture of experts' backward scratch (moe.h, MoeBackwardArgs); null without experts.
  float* moe_d_weights = nullptr;  // (B*T, k)
  float* moe_d_logits = nullptr;   // (B*T, E)
  float* moe_d_perm = nullptr;     // (R, C)
  float* moe_d_fc = nullptr;       // (RL, F) or SwiGLU (RL, 2F)
  float* moe_d_act = nullptr;      // (RL, F)
  float* moe_d_aux = nullptr;      // (B, E)
  // Expert parallelism: the all-to-all's exchange buffers, (RL, C) each (MoeConfig).
  float* moe_ep_a = nullptr;
  float* moe_ep_b = nullptr;
  // Shared experts: (local rows, C), and with the gate (local rows, C) and (local rows).
  float* moe_d_shared_in = nullptr;
  float* moe_d_shared_out = nullptr;
  float* moe_d_shared_logits = nullptr;
  // Context parallelism's ring (context_parallel.h): two travelling key/value blocks and two
  // travelling key/value gradients, (B*T, 2C/tp) each (a head's key then value); one block's
  // output (B*T/2, C/tp) and log-sum-exp (B, NH/tp, T/2).
  float* cp_kv[2] = {nullptr, nullptr};
  float* cp_dkv[2] = {nullptr, nullptr};
  float* cp_out_blk = nullptr;
  float* cp_lse_blk = nullptr;
  // DeepSpeed-Ulysses (context_parallel.h): the projection's local qkv (B*T, 3C/tp), the
  // all-to-all's send buffer (B*T, 3C/tp), the whole sequence's output gradient (B*T, C/tp) and
  // qkv gradient (B*T, 3C/tp) for this rank's heads.
  float* sp_local = nullptr;
  float* sp_send = nullptr;
  float* sp_dout = nullptr;
  float* sp_dqkv = nullptr;
};

// Hidden-dropout keys of one micro-batch: masks are keyed by global token rows and the iteration,
// so every layout draws the same masks. p = 0: no dropout (evaluation, generation).
struct DropoutKeys {
  float hidden_p = 0.0f, attention_p = 0.0f;
  std::uint64_t seed = 0;
  std::int64_t iteration = 0;
  std::int64_t first_sample = 0;  // global sample id of the micro-batch's first row
};
enum class DropSite : std::uint64_t { kEmbedding = 1, kAttentionOut = 2, kMlpOut = 3, kProbs = 4 };
// The Philox stream of one dropout site (layer: global index, -1 = embedding) in one iteration.
std::uint64_t drop_stream(std::int64_t iteration, std::int64_t layer, DropSite site);

// The context of one layer call.
struct LayerContext {
  const core::ExecContext& ctx;
  const parallel::TpRegion& region;  // tp group; residual-stream rows (full and local)
  const Workspace& ws;
  std::int64_t batch = 0, seq_len = 0;
  DropoutKeys dropout;
  // Documents inside a sample (--reset-position-ids, --reset-attention-mask): (B*T) position and
  // document id of every token, or null (positions 0..T-1, one document).
  const std::int32_t* positions = nullptr;
  const std::int32_t* docs = nullptr;
  // The gradient of the training loss with respect to a mixture-of-experts layer's auxiliary
  // losses of this micro-batch (Megatron: 1 / the micro-batches of the global batch).
  double aux_loss_scale = 1.0;
  // Expert parallelism: the ep group's tensor channel and its host channel (for the row counts);
  // null or one rank without it.
  comm::Communicator* ep = nullptr;
  comm::Communicator* ep_host = nullptr;
  // Context parallelism (context_parallel.h): the cp group's tensor channel (null or one rank
  // without it; seq_len is then this rank's 2 chunks, T / cp) and the positions 0 .. T-1 on the
  // device (the chunks' position ids).
  comm::Communicator* cp = nullptr;
  const std::int32_t* cp_positions = nullptr;
  // The cp group runs DeepSpeed-Ulysses (an all-to-all from sequence chunks to heads and back)
  // instead of the ring.
  bool ulysses = false;

  std::int64_t rows() const { return region.rows(); }  // B*T
  std::int64_t local_rows() const { return region.local_rows(); }
  int tp_rank() const { return region.group().rank(); }
  bool context_parallel() const { return cp != nullptr && cp->size() > 1; }
  std::int64_t total_len() const { return context_parallel() ? seq_len * cp->size() : seq_len; }
};

// A layer buffer as a kernel argument: a typed view on the context's device, or an empty view for
// null (an optional argument; a required one fails in the kernel's check, naming the view).
template <class T>
core::TensorView view_of(const LayerContext& lc, const T* p, core::Shape shape) {
  return p != nullptr ? core::view(p, shape, lc.ctx.device) : core::TensorView{};
}

// out = in @ weight^T + bias: the matmul of every layer. FP32, or BF16 operands when the weight
// carries its BF16 copy (in is converted on the way in, unless in_bf16 already holds it: the
// fused kernels write that copy themselves).
struct LinearArgs {
  float* out = nullptr;                 // (rows, out_features) written (=)
  const float* in = nullptr;            // (rows, in_features)
  const core::bf16* in_bf16 = nullptr;  // in, already in BF16 (BF16 weights only), or null
  Weight weight;                        // (out_features, in_features)
  const float* bias = nullptr;          // (out_features) or null
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};
void linear(const LayerContext& lc, const LinearArgs& args);
// d_in = d_out @ weight (=, may be null), d_weight += d_out^T @ in, d_bias += column sums.
struct LinearBackwardArgs {
  float* d_in = nullptr;
  float* d_weight = nullptr;
  float* d_bias = nullptr;
  const float* d_out = nullptr;  // (rows, out_features)
  const float* in = nullptr;     // (rows, in_features)
  Weight weight;
  std::int64_t rows = 0, in_features = 0, out_features = 0;
};
void linear_backward(const LayerContext& lc, const LinearBackwardArgs& args);

// Hidden dropout at `site` of global layer `layer` on this rank's residual-stream rows (x, local
// rows x cols), in place; the backward draws the same mask into ws.d_drop and returns it (or d
// itself without dropout).
void dropout_forward(const LayerContext& lc, float* x, std::int64_t cols, std::int64_t layer,
                     DropSite site);
const float* dropout_backward(const LayerContext& lc, const float* d, std::int64_t cols,
                              std::int64_t layer, DropSite site);

}  // namespace trident::model::layers
