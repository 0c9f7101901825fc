#include "trident/model/config.h"

#include "trident/core/error.h"

namespace trident::model {

std::int64_t ModelConfig::padded_vocab_size(std::int64_t tp_size) const {
  const std::int64_t multiple = make_vocab_size_divisible_by * tp_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

std::int64_t ModelConfig::auto_loss_chunk_rows() const {
  // A power of two near 64 MiB of FP32 logits over the whole padded vocabulary (the same rows in
  // every tp layout): 256 rows for GPT-2's 50304, clamped to [16, 4096]. Smaller chunks stream
  // the output weight once more per chunk (forward, input gradient) and read-modify-write its
  // gradient once more: 128-row chunks ran the head's forward GEMM ~25% slower here.
  const std::int64_t target = (std::int64_t{64} << 20) / (4 * padded_vocab_size());
  std::int64_t rows = 16;
  while (rows < 4096 && 2 * rows <= target) rows *= 2;
  return rows;
}

void ModelConfig::validate() const {
  TRIDENT_CHECK(num_layers > 0, "--num-layers must be positive, got ", num_layers);
  TRIDENT_CHECK(hidden_size > 0, "--hidden-size must be positive, got ", hidden_size);
  TRIDENT_CHECK(num_attention_heads > 0, "--num-attention-heads must be positive, got ",
                num_attention_heads);
  TRIDENT_CHECK(hidden_size % num_attention_heads == 0, "--hidden-size (", hidden_size,
                ") must be divisible by --num-attention-heads (", num_attention_heads, ")");
  TRIDENT_CHECK(ffn() > 0, "--ffn-hidden-size must be positive, got ", ffn_hidden_size);
  TRIDENT_CHECK(seq_length > 0, "--seq-length must be positive, got ", seq_length);
  TRIDENT_CHECK(position_embedding == PositionEmbedding::kAlibi || max_positions() >= seq_length,
                "--max-position-embeddings (", max_positions(), ") must be >= --seq-length (",
                seq_length, ")");
  TRIDENT_CHECK(vocab_size > 0, "vocabulary size must be positive (check the tokenizer files)");
  TRIDENT_CHECK(make_vocab_size_divisible_by > 0,
                "--make-vocab-size-divisible-by must be positive");
  TRIDENT_CHECK(init_method_std > 0, "--init-method-std must be positive, got ", init_method_std);
  TRIDENT_CHECK(num_query_groups >= 0 && num_attention_heads % query_groups() == 0,
                "--num-query-groups (", num_query_groups, ") must divide --num-attention-heads (",
                num_attention_heads, ")");
  TRIDENT_CHECK(position_embedding != PositionEmbedding::kRope || head_dim() % 2 == 0,
                "--position-embedding-type rope needs an even head dimension (--hidden-size / "
                "--num-attention-heads = ",
                head_dim(), ")");
  TRIDENT_CHECK(rotary_base > 0, "--rotary-base must be positive, got ", rotary_base);
  TRIDENT_CHECK(!rope_scaling || (rope_scaling_factor > 0 && rope_low_freq_factor > 0 &&
                                  rope_high_freq_factor > rope_low_freq_factor &&
                                  rope_original_max_positions > 0),
                "--rope-scaling-factor must be positive (and the low/high frequency factors "
                "positive, low < high)");
  TRIDENT_CHECK(add_bias_linear || swiglu,
                "--disable-bias-linear is supported with --swiglu only (the GeLU MLP's bias is "
                "fused into its activation); add --swiglu or drop --disable-bias-linear");
  TRIDENT_CHECK(hidden_dropout >= 0 && hidden_dropout < 1,
                "--hidden-dropout must be in [0, 1), got ", hidden_dropout);
  TRIDENT_CHECK(attention_dropout >= 0 && attention_dropout < 1,
                "--attention-dropout must be in [0, 1), got ", attention_dropout);
  TRIDENT_CHECK(num_experts >= 0, "--num-experts must be >= 0 (0: dense), got ", num_experts);
  if (num_experts == 0) return;
  TRIDENT_CHECK(moe_router_topk >= 1 && moe_router_topk <= num_experts, "--moe-router-topk (",
                moe_router_topk, ") must be in [1, --num-experts = ", num_experts, "]");
  TRIDENT_CHECK(moe_layer_freq >= 1, "--moe-layer-freq must be >= 1, got ", moe_layer_freq);
  TRIDENT_CHECK(moe_ffn_hidden_size >= 0, "--moe-ffn-hidden-size must be positive, got ",
                moe_ffn_hidden_size);
  TRIDENT_CHECK(
      !add_bias_linear,
      "--num-experts: the experts have no biases (as Mixtral, Qwen-MoE and DeepSeek); add "
      "--disable-bias-linear (with --swiglu)");
  TRIDENT_CHECK(moe_expert_capacity_factor >= 0, "--moe-expert-capacity-factor must be >= 0, got ",
                moe_expert_capacity_factor);
  TRIDENT_CHECK(!moe_pad_expert_input_to_capacity || moe_expert_capacity_factor > 0,
                "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  TRIDENT_CHECK(!moe_router_pre_softmax || moe_router_score_function == MoeScoreFunction::kSoftmax,
                "--moe-router-pre-softmax applies to --moe-router-score-function softmax only");
  TRIDENT_CHECK(moe_router_topk_scaling_factor >= 0,
                "--moe-router-topk-scaling-factor must be positive, got ",
                moe_router_topk_scaling_factor);
  TRIDENT_CHECK(moe_shared_expert_intermediate_size >= 0,
                "--moe-shared-expert-intermediate-size must be >= 0, got ",
                moe_shared_expert_intermediate_size);
  TRIDENT_CHECK(
      !moe_router_enable_expert_bias || moe_router_score_function == MoeScoreFunction::kSigmoid,
      "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (the "
      "bias shifts the sigmoid scores for the choice, as DeepSeek-V3's router)");
  TRIDENT_CHECK(moe_router_bias_update_rate >= 0,
                "--moe-router-bias-update-rate must be >= 0, got ", moe_router_bias_update_rate);
  TRIDENT_CHECK(!moe_shared_expert_gate || moe_shared_expert_intermediate_size > 0,
                "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size");
  TRIDENT_CHECK(moe_aux_loss_coeff >= 0 && moe_z_loss_coeff >= 0,
                "--moe-aux-loss-coeff and --moe-z-loss-coeff must be >= 0");
  TRIDENT_CHECK(moe_aux_loss_coeff == 0 ||
                    moe_router_load_balancing_type == MoeLoadBalancing::kNone ||
                    moe_router_score_function == MoeScoreFunction::kSoftmax,
                "--moe-aux-loss-coeff with --moe-router-score-function sigmoid is not implemented "
                "(DeepSeek-V3's sigmoid router balances with the expert bias); use "
                "--moe-aux-loss-coeff 0 or the softmax router");
}

double ModelConfig::flops_per_iteration(std::int64_t tokens) const {
  // Per token and layer, forward: QKV 6h^2, attention output 2h^2, MLP 4hf, scores + values 4sh;
  // logits 2hV. Training = 3x forward (backward is twice the forward).
  const double h = static_cast<double>(hidden_size), f = static_cast<double>(ffn());
  const double s = static_cast<double>(seq_length), L = static_cast<double>(num_layers);
  const double V = static_cast<double>(padded_vocab_size());
  // GQA shrinks the key/value projections, SwiGLU adds a third MLP matrix.
  const double qkv = 2.0 * h * static_cast<double>(qkv_rows()), mlp = (swiglu ? 6.0 : 4.0) * h * f;
  // A mixture-of-experts layer: the router, and k experts' MLPs per token.
  const double moe_f = static_cast<double>(moe_ffn()), k = static_cast<double>(moe_router_topk);
  const double shared_f = static_cast<double>(moe_shared_expert_intermediate_size);
  const double moe_mlp = 2.0 * h * static_cast<double>(num_experts) +
                         (k * moe_f + shared_f) * (swiglu ? 6.0 : 4.0) * h +
                         (moe_shared_expert_gate ? 2.0 * h : 0.0);
  double mlps = 0;
  for (std::int64_t l = 0; l < num_layers; ++l) mlps += moe_layer(l) ? moe_mlp : mlp;
  const double per_token = L * (qkv + 2.0 * h * h + 4.0 * s * h) + mlps + 2.0 * h * V;
  return 3.0 * per_token * static_cast<double>(tokens);
}

std::int64_t ModelConfig::num_parameters() const {
  const std::int64_t h = hidden_size, f = ffn(), q = qkv_rows(), fc = fc_rows();
  const std::int64_t norm = normalization == Normalization::kRmsNorm ? h : 2 * h;
  const std::int64_t b = add_bias_linear ? 1 : 0, qb = qkv_bias() ? 1 : 0;
  const std::int64_t attention = 2 * norm + (q * h + qb * q) + (h * h + b * h);
  const std::int64_t mlp = (fc * h + b * fc) + (h * f + b * h);
  const std::int64_t moe_f = moe_ffn(), moe_fc = swiglu ? 2 * moe_f : moe_f;
  const std::int64_t shared_f = moe_shared_expert_intermediate_size;
  const std::int64_t shared = (swiglu ? 3 : 2) * shared_f * h + (moe_shared_expert_gate ? h : 0);
  const std::int64_t bias = moe_router_enable_expert_bias ? num_experts : 0;
  const std::int64_t moe = num_experts * h + num_experts * (moe_fc * h + h * moe_f) + shared + bias;
  std::int64_t layers = 0;
  for (std::int64_t l = 0; l < num_layers; ++l) layers += attention + (moe_layer(l) ? moe : mlp);
  const std::int64_t pos =
      position_embedding == PositionEmbedding::kLearnedAbsolute ? max_positions() * h : 0;
  const std::int64_t out = tied_output() ? 0 : padded_vocab_size() * h;
  return padded_vocab_size() * h + pos + layers + norm + out + (embed_layernorm ? norm : 0);
}

}  // namespace trident::model
