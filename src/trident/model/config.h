// ModelConfig: the architecture of a GPT-2 / BLOOM / Llama style decoder, with Megatron's flag
// names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trident::model {

// --position-embedding-type: learned_absolute (GPT-2), alibi (BLOOM) or rope (Llama).
enum class PositionEmbedding : std::uint8_t { kLearnedAbsolute, kAlibi, kRope };
// --normalization: LayerNorm (GPT-2, BLOOM) or RMSNorm (Llama; no bias, no centring).
enum class Normalization : std::uint8_t { kLayerNorm, kRmsNorm };

// Activation recomputation (Megatron's --recompute-granularity / -method / -num-layers):
// full recomputes a layer's forward in backward, keeping only its output; selective recomputes
// only the attention core (the (T x T) probabilities; a no-op with the fused attention, which
// never keeps them).
enum class Recompute : std::uint8_t { kNone, kSelective, kFull };

// Mixture of experts (Megatron-Core's flags; docs/moe.md).
// --moe-router-score-function.
enum class MoeScoreFunction : std::uint8_t { kSoftmax, kSigmoid };
// --moe-token-drop-policy: which tokens an over-full expert keeps.
enum class MoeDropPolicy : std::uint8_t { kProbs, kPosition };
// --moe-router-load-balancing-type (aux_loss, seq_aux_loss, none).
enum class MoeLoadBalancing : std::uint8_t { kAuxLoss, kSeqAuxLoss, kNone };

struct ModelConfig {
  std::int64_t num_layers = 2;
  std::int64_t hidden_size = 64;
  std::int64_t num_attention_heads = 4;
  std::int64_t ffn_hidden_size = 0;  // 0 -> 4 * hidden_size
  std::int64_t seq_length = 64;
  std::int64_t max_position_embeddings = 0;  // 0 -> seq_length
  std::int64_t vocab_size = 0;               // real tokens of the tokenizer
  std::int64_t make_vocab_size_divisible_by = 128;
  // Hyperparameters are doubles, as the user wrote them (Megatron's Python floats); the kernels
  // take float where they compute in float.
  double init_method_std = 0.02;
  double layernorm_epsilon = 1e-5;
  PositionEmbedding position_embedding = PositionEmbedding::kLearnedAbsolute;
  bool embed_layernorm = false;  // BLOOM: LayerNorm right after the word embedding
  Normalization normalization = Normalization::kLayerNorm;
  // Rotary positions (--position-embedding-type rope): --rotary-base, and Llama-3's frequency
  // scaling (--use-rope-scaling, --rope-scaling-factor; the other three as Megatron and Llama 3.1:
  // transformers' rope_scaling {"rope_type": "llama3", ...}).
  double rotary_base = 10000.0;
  bool rope_scaling = false;
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  std::int64_t rope_original_max_positions = 8192;
  bool swiglu = false;                // --swiglu: gated SiLU MLP (two up-projections)
  std::int64_t num_query_groups = 0;  // --group-query-attention --num-query-groups; 0: heads
  bool untie_embeddings_and_output_weights = false;  // own output layer (not the embedding)
  bool add_bias_linear = true;  // --disable-bias-linear: no bias in any linear layer
  // --add-qkv-bias: the QKV projection keeps its bias even with --disable-bias-linear (Qwen2,
  // Qwen2-MoE; Megatron's add_bias_linear or add_qkv_bias).
  bool add_qkv_bias = false;
  double hidden_dropout = 0.0;  // embedding output and both residual branches
  double attention_dropout = 0.0;
  // Attention kernel: the fused flash-style one (no (T x T) probabilities kept) or the unfused
  // one; ALiBi and attention dropout need the fused kernel.
  bool use_flash_attention = false;
  // Documents packed into one sample (Megatron's get_ltor_masks_and_position_ids), each ended by
  // the token eod_token (the tokenizer's end of document, set by the trainer):
  bool reset_position_ids = false;    // positions restart after each end-of-document token
  bool reset_attention_mask = false;  // no token attends to an earlier document's
  std::int32_t eod_token = -1;
  Recompute recompute = Recompute::kNone;
  bool recompute_block = false;           // method block: the first recompute_num_layers layers
  std::int64_t recompute_num_layers = 1;  // of each stage; uniform: every layer (per layer)
  // --loss-chunk-rows: the output layer and the loss run this many token rows at a time, fused
  // (its backward follows each chunk's loss), so the (tokens x vocab) logits are never all in
  // memory; 0 keeps every row's logits (generation and the golden tests read them).
  std::int64_t loss_chunk_rows = 0;
  // Mixture of experts: --num-experts E (0: dense MLPs) replaces the MLP of every
  // --moe-layer-freq-th layer (0, freq, 2 freq, ...) by E experts of --moe-ffn-hidden-size
  // (0: --ffn-hidden-size), SwiGLU or GeLU as the dense MLP, without biases; a router sends each
  // token to --moe-router-topk of them (model/layers/moe.h). The other layers keep the dense MLP
  // of --ffn-hidden-size.
  std::int64_t num_experts = 0;
  std::int64_t moe_ffn_hidden_size = 0;
  std::int64_t moe_router_topk = 2;
  std::int64_t moe_layer_freq = 1;
  // --moe-layer-freq as Megatron's per-layer pattern ("[1,0,1,0]", "([1]*3+[0]*1)*2"): layer l is
  // a mixture of experts iff moe_layer_pattern[l]; one entry per layer. Empty: moe_layer_freq.
  std::vector<bool> moe_layer_pattern;
  MoeScoreFunction moe_router_score_function = MoeScoreFunction::kSoftmax;
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = 0.0;  // 0: none (1)
  // Group-limited routing (--moe-router-num-groups, --moe-router-group-topk; 0: none): a token's
  // experts come from its group_topk best groups of experts (kernels/moe.h).
  std::int64_t moe_router_num_groups = 0;
  std::int64_t moe_router_group_topk = 0;
  double moe_expert_capacity_factor = 0.0;  // 0: dropless
  MoeDropPolicy moe_token_drop_policy = MoeDropPolicy::kProbs;
  bool moe_pad_expert_input_to_capacity = false;
  MoeLoadBalancing moe_router_load_balancing_type = MoeLoadBalancing::kAuxLoss;
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;
  // Shared experts (Qwen2-MoE, DeepSeek): a dense MLP of this size beside the routed experts in
  // every MoE layer, its output added to theirs (0: none); with the gate (Qwen2-MoE's), weighed by
  // sigmoid(x . g) per token.
  std::int64_t moe_shared_expert_intermediate_size = 0;
  bool moe_shared_expert_gate = false;
  // DeepSeek-V3's auxiliary-loss-free balancing (sigmoid router): a per-expert bias added to the
  // scores for the top-k choice only, moved after every step by the update rate times the sign of
  // (mean tokens per expert - the expert's tokens) over the global batch.
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;

  bool documents() const { return reset_position_ids || reset_attention_mask; }
  // Whether global layer `layer`'s MLP is a mixture of experts.
  bool moe_layer(std::int64_t layer) const {
    if (num_experts <= 0) return false;
    if (moe_layer_pattern.empty()) return layer % moe_layer_freq == 0;
    return layer >= 0 && layer < static_cast<std::int64_t>(moe_layer_pattern.size()) &&
           moe_layer_pattern[static_cast<std::size_t>(layer)];
  }
  // Sets --moe-layer-freq from its value: an integer N (moe_layer_freq, the pattern cleared) or,
  // with a '[' in it as Megatron decides, a pattern (parse_moe_layer_pattern). InvalidArgument
  // naming the flag otherwise.
  void set_moe_layer_freq(std::string_view value);
  // The layers --moe-layer-freq makes mixtures of experts as Megatron's list: "[1,0,1,0]".
  std::string moe_layer_pattern_string() const;
  std::int64_t moe_ffn() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn(); }
  // Whether local layer `l` of a shard is fully recomputed.
  bool recomputes(std::int64_t l) const {
    return recompute == Recompute::kFull && (!recompute_block || l < recompute_num_layers);
  }

  bool flash_attention() const {
    return use_flash_attention || position_embedding == PositionEmbedding::kAlibi ||
           attention_dropout > 0.0;
  }

  // Whether the QKV projection has a bias (the other linear layers: add_bias_linear).
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  std::int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  std::int64_t max_positions() const {
    return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
  }
  std::int64_t head_dim() const { return hidden_size / num_attention_heads; }
  std::int64_t query_groups() const {
    return num_query_groups > 0 ? num_query_groups : num_attention_heads;
  }
  // Rows of the fused QKV weight: every query head plus a key and a value head per group.
  std::int64_t qkv_rows() const { return (num_attention_heads + 2 * query_groups()) * head_dim(); }
  // Key/value groups one of tp ranks holds: G / tp, or 1 when there are fewer groups than ranks
  // (then tp / G ranks share each group's key and value heads, replicated).
  std::int64_t local_query_groups(std::int64_t tp) const {
    return query_groups() >= tp ? query_groups() / tp : 1;
  }
  // Rows of one tp rank's slice of the fused QKV weight.
  std::int64_t local_qkv_rows(std::int64_t tp) const {
    return (num_attention_heads / tp + 2 * local_query_groups(tp)) * head_dim();
  }
  // Columns of the MLP's up-projection output (SwiGLU: gate and up).
  std::int64_t fc_rows() const { return swiglu ? 2 * ffn() : ffn(); }
  bool tied_output() const { return !untie_embeddings_and_output_weights; }
  // Megatron's rule: vocab padded up to a multiple of make_vocab_size_divisible_by * tp_size.
  std::int64_t padded_vocab_size(std::int64_t tp_size = 1) const;
  // --loss-chunk-rows -1 (auto): rows per chunk for this vocabulary.
  std::int64_t auto_loss_chunk_rows() const;
  // Throws InvalidArgument naming the flag for inconsistent sizes.
  void validate() const;
  // Model FLOPs of one training iteration over `tokens` tokens (forward + backward, no
  // recomputation), Megatron's formula (training.py, mid-2024 form for MHA):
  //   72 * tokens * L * h^2 * (1 + s/(6h) + V/(12 L h))  [with f = 4h; the general f is used]
  double flops_per_iteration(std::int64_t tokens) const;
  // Parameter count (padded vocab, a tied output layer counted once).
  std::int64_t num_parameters() const;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Megatron's --moe-layer-freq pattern, a Python expression of lists of 0 / 1 ("[1,0,1,0]",
// "([1]*3+[0]*1)*2"): list literals of 0 and 1, + concatenation, * repetition by a non-negative
// integer (either side), parentheses, spaces; nothing else (no eval). At most 4096 entries.
// Throws InvalidArgument naming the flag and the position of what is wrong.
std::vector<bool> parse_moe_layer_pattern(std::string_view text);
// "[1,0,1,0]".
std::string moe_layer_pattern_string(const std::vector<bool>& pattern);

}  // namespace trident::model
