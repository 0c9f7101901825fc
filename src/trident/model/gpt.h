// GPT-2 / BLOOM: pre-norm decoder blocks, learned absolute positions or ALiBi, tanh-GeLU MLP,
// output layer tied to the word embedding. The model is a list of layers (model/layers/: embedding,
// block = norm + attention + norm + MLP, head = norm + output layer + loss), each with its forward
// and backward side by side; gpt.cc is the transformer: the layer list forward, the same list
// reversed backward. Weights are views into the flat parameter and gradient buffers; activations
// of one micro-batch live in a GptActivations arena.
//
// A rank runs its ModelShard: a pipeline stage's layers (with the embedding on the first stage
// and the final norm, output layer and loss on the last), each weight matrix split across the
// tensor-parallel group as Megatron does (column-parallel QKV and MLP up-projection, row-parallel
// attention output and MLP down-projection, vocab-parallel embedding and cross-entropy). The
// layers call Megatron's conjugate collectives by name (parallel/tp_ops.h).
//
// Legend: B = micro-batch size, T = seq_len, C = hidden, NH = heads, HS = C / NH, F = ffn hidden,
// Vp = padded vocabulary, L = layers, tp = tensor-parallel size (local sizes: NH/tp, F/tp, Vp/tp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/arena.h"
#include "trident/core/exec_context.h"
#include "trident/model/config.h"
#include "trident/model/gpt_weights.h"
#include "trident/model/layers/block.h"
#include "trident/model/layers/embedding.h"
#include "trident/model/layers/lm_head.h"
#include "trident/model/param_table.h"
#include "trident/parallel/tp_ops.h"

namespace trident::model {

// The rotary inverse frequencies (head_dim / 2) of a --position-embedding-type rope model, with
// Llama 3's scaling under --use-rope-scaling; computed in FP32 as transformers does.
std::vector<float> rotary_inv_freq(const ModelConfig& cfg);

// Tensor-parallel traffic of the model's own collectives (parallel/tp_ops.h), the loss's
// reductions included.
using TpTraffic = parallel::TpTraffic;

// The weights one transformer layer runs with (under --bf16 its matmul weights carry their BF16
// copies), and where its gradients accumulate (+=).
struct LayerWeights {
  const layers::BlockParams* params = nullptr;
};
struct LayerBackwardWeights {
  LayerWeights weights;
  const layers::BlockGrads* grads = nullptr;
};

// Where the layers get each transformer layer's weights and gradient buffers when they are not
// fixed views (ZeRO-3 gathers a layer into a staging slot just before it runs, ZeRO 2-3 hand out
// a zeroed gradient slot per backward, ZeRO 0-1 start bucket reductions as layers finish). The
// model asks right before it runs layer `layer` (local index, 0..L-1) and uses the answer for that
// run only; the provider is told when the layer's backward is done. The pipeline executor tells
// it when a backward of the chunk begins (the one channel from the executor to the weights).
class LayerWeightsProvider {
 public:
  virtual ~LayerWeightsProvider() = default;
  // Before each backward of the chunk; `last_of_iteration`: its last backward of the iteration
  // (the data-parallel reduction starts its buckets then).
  virtual void begin_backward(bool last_of_iteration) = 0;
  virtual LayerWeights forward(std::int64_t layer) = 0;
  virtual LayerBackwardWeights backward(std::int64_t layer) = 0;
  // The layer's gradients of this backward are complete.
  virtual void backward_done(std::int64_t layer) = 0;
};

// How the model talks to its tensor-parallel group, and where its layers' weights come from.
struct ModelRuntime {
  ModelShard shard;
  comm::Communicator* tp = nullptr;  // null or size 1: no tensor parallelism
  // --bf16: the pipeline lays out its activations with the BF16 scratch the matmuls convert
  // their inputs into. The weights' BF16 copies come with GptParams (layers::Weight): a matmul
  // whose weight has one takes BF16 operands with FP32 accumulation and output.
  bool bf16 = false;
  TpTraffic* tp_traffic = nullptr;  // counts the model's tensor-parallel collectives when set
  std::uint64_t dropout_seed = 0;
  // Null: every layer runs with the GptParams / GptGrads views it is given.
  // Set: the transformer layers take their weights and gradient buffers from the provider; the
  // embedding and head still use the views.
  LayerWeightsProvider* layer_weights = nullptr;
  // Set: gpt_loss adds the micro-batch's token losses to this sum in ctx's device memory and
  // returns {0, 0} (the caller reads the sum once per iteration: one host sync, not one per
  // micro-batch). Null: gpt_loss reads the sum back.
  kernels::TokenLossSum* loss_sum_on_device = nullptr;
  // The gradient of the training loss with respect to each micro-batch's mixture-of-experts
  // auxiliary losses (load balancing, z-loss): Megatron averages them over the micro-batches of
  // the global batch, so 1 / (micro-batches per rank x data-parallel ranks).
  double moe_aux_loss_scale = 1.0;
  // Expert parallelism (shard.ep_size > 1): the ep group's tensor channel and its host channel.
  comm::Communicator* ep = nullptr;
  comm::Communicator* ep_host = nullptr;
  // Context parallelism (shard.cp_size > 1): the cp group's tensor channel (the attention ring).
  comm::Communicator* cp = nullptr;
};

// What one call of the forward is given besides the weights: the micro-batch and the keys of
// its dropout masks (the global sample id of its first row and the iteration, so every layout
// draws the same masks).
struct ForwardInputs {
  const std::int32_t* tokens = nullptr;  // (B*T) on ctx's device (stage_reads_tokens stages)
  std::int64_t first_sample = 0;
  std::int64_t iteration = 0;
  bool training = true;  // dropout only while training
};

// A rank's resident weights and gradients, per chunk (the optimizer's buffers hold them). Entries
// of tensors that are not resident (the layers' weights at ZeRO stage 3, their gradients at
// stages 2-3) are null: the layers get those from the chunk's LayerWeightsProvider.
struct ModelViews {
  std::vector<GptParams> params;  // --bf16: with the matmuls' BF16 weight copies
  std::vector<GptGrads> grads;
};

// Saved activations of one layer for one micro-batch; row = one token (B*T rows, or this rank's
// B*T/tp rows of the residual stream with sequence parallelism).
using LayerActivations = layers::BlockSaved;

// Everything one micro-batch needs, forward and backward, carved from one arena.
// With sequence parallelism the residual stream (encoded, norms, resid2, out) holds only this
// tp rank's rows: the flattened (B*T) token rows are split into tp contiguous blocks.
struct GptActivations {
  std::int64_t batch = 0, seq_len = 0;
  std::int64_t stage_rows = 0;  // rows of the residual stream held here (B*T, or B*T/tp with SP)
  // What the last gpt_forward was given (gpt_loss and gpt_backward, recomputation included,
  // replay its dropout keys).
  ForwardInputs inputs;
  core::Arena arena;
  layers::EmbeddingSaved embedding{};  // first stage, --embed-layernorm
  float* encoded = nullptr;  // (B*T, C): the embedding output, or the stage's received input
  std::vector<LayerActivations> layers;
  LayerActivations scratch{};  // one layer's worth, for recomputed layers (full recomputation)
  layers::LmHeadSaved head{};  // last stage
  float* logits = nullptr;     // head.logits: (B*T, Vp/tp); d_logits after gpt_loss with gradients
                               // (null with cfg.loss_chunk_rows > 0: never all materialised)
  layers::Workspace ws{};      // scratch shared by the layers
  // Documents inside the samples (ModelConfig::documents()): per token (B*T), its position and
  // its document's index in the sample, derived from the tokens by every stage's forward
  // (kernels/document_ids.h); null without documents.
  // Under context parallelism (shard.cp_size > 1) positions holds the rows' global positions
  // (layers/context_parallel.h) and cp_positions the positions 0 .. T_total-1.
  std::int32_t* positions = nullptr;
  std::int32_t* docs = nullptr;
  std::int32_t* cp_positions = nullptr;
  float* d_x = nullptr;  // (B*T, C) gradient of the residual stream; on a stage without the
                         // embedding, the gradient of its input after gpt_backward
  // The micro-batch's tokens and labels (B*T) on the activations' device, on the stages that read
  // them (stage_reads_tokens); the caller copies them in. Null elsewhere.
  std::int32_t* tokens = nullptr;
  std::int32_t* labels = nullptr;
  // Constant tables on the activations' device, written by make_activations: the ALiBi slope of
  // every head (NH), the rotary inverse frequencies (head_dim / 2); null when not used.
  float* alibi = nullptr;
  float* inv_freq = nullptr;
  // The routing of each mixture-of-experts layer of the shard in the last forward (local layer
  // order; empty entries for dense layers): tokens per expert, drops, the auxiliary losses.
  std::vector<layers::MoeStats> moe_stats;

  // The stage's output (the last layer's residual stream, or `encoded` without layers).
  const float* output() const { return layers.empty() ? encoded : layers.back().out; }
};

// Bytes of GptActivations for (batch, seq_len); computed before anything is allocated.
std::int64_t activation_bytes(const ModelConfig& cfg, const ModelShard& shard, std::int64_t batch,
                              std::int64_t seq_len);
void make_activations(const ModelConfig& cfg, const ModelShard& shard, std::int64_t batch,
                      std::int64_t seq_len, GptActivations& acts);
// BF16 mode adds the scratch above (bf16 = true). The arena is memory of ctx's device
// (kernels::memory_for), and the constant tables are written there.
std::int64_t activation_bytes(const ModelConfig& cfg, const ModelShard& shard, std::int64_t batch,
                              std::int64_t seq_len, bool bf16);
void make_activations(const ModelConfig& cfg, const ModelShard& shard, std::int64_t batch,
                      std::int64_t seq_len, bool bf16, GptActivations& acts,
                      const core::ExecContext& ctx = {});

// Forward of the shard. First stage: embeds tokens (B*T); otherwise reads acts.encoded (the
// previous stage's output, written there by the caller). Last stage: computes acts.logits (with
// cfg.loss_chunk_rows > 0 only the final norm: the logits come chunk by chunk in gpt_loss).
// With documents (--reset-position-ids / --reset-attention-mask) every stage reads the tokens
// (their end-of-document tokens), see stage_reads_tokens.
void gpt_forward(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const GptParams& params, const ForwardInputs& in, GptActivations& acts);

// Whether a stage's forward and backward read the micro-batch's tokens: the first stage (the
// embedding), the last (the loss's labels come with them), and every stage with documents.
bool stage_reads_tokens(const ModelConfig& cfg, const ModelShard& shard);

// Generation (generate.h): the same forward over new tokens of one sample (B = 1) at positions
// [position, position + T), attending to and appending to one KV cache per layer.
struct KvCacheForward {
  std::int64_t position = 0;
  std::span<const layers::KvCache> caches;  // one per layer of the shard
};
void gpt_forward(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const GptParams& params, const ForwardInputs& in, GptActivations& acts,
                 const KvCacheForward& kv);

struct LossSum {
  double sum = 0;          // sum of per-token losses over counted tokens
  std::int64_t count = 0;  // tokens with a non-negative target
};
enum class LossGrad : std::uint8_t { kNone, kCompute };
// Last stage: softmax cross-entropy of acts.logits against targets (B*T; negative = ignored),
// vocab-parallel across the tp group (max, sum-exp and target-logit reductions; the full logits
// are never gathered). With LossGrad::kCompute the logits buffer is overwritten with
// d_scale * dloss/dlogits.
LossSum gpt_loss(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const std::int32_t* targets, float d_scale, LossGrad grad, GptActivations& acts);
// The same, for either head (cfg.loss_chunk_rows): the chunked head runs the output layer here,
// chunk by chunk, and with LossGrad::kCompute its backward too (the output weight's gradient
// accumulates into grads now, not in gpt_backward).
LossSum gpt_loss(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const GptParams& params, const GptGrads& grads, const std::int32_t* targets,
                 float d_scale, LossGrad grad, GptActivations& acts);

// Backward of the shard. Last stage: starts from acts.logits (holding d_logits); otherwise from
// acts.d_x (the next stage's input gradient, written there by the caller). Every parameter
// gradient accumulates (+=). First stage: ends in the embedding gradients; otherwise leaves the
// gradient of the stage's input in acts.d_x.
void gpt_backward(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                  const GptParams& params, const GptGrads& grads, const std::int32_t* tokens,
                  GptActivations& acts);

}  // namespace trident::model
