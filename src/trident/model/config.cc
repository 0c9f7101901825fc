#include "trident/model/config.h"

#include <algorithm>
#include <charconv>
#include <variant>

#include "trident/core/error.h"

namespace trident::model {

namespace {

constexpr std::size_t kMaxPatternLayers = 4096;  // as many layers as a checkpoint may have

// A recursive-descent reader of Megatron's pattern expressions (its argparse type evaluates them
// with Python's eval):
//   expr    := term ('+' term)*
//   term    := primary ('*' primary)*
//   primary := '[' [bit (',' bit)*] ']' | '(' expr ')' | integer
// A value is a list of 0 / 1 or an integer; list * n and n * list repeat, list + list
// concatenates, n * m multiplies (as Python); any other mix is refused.
class PatternParser {
 public:
  explicit PatternParser(std::string_view text) : text_(text) {}

  std::vector<bool> parse() {
    Value v = expr();
    skip();
    if (pos_ < text_.size()) fail("unexpected '", text_[pos_], "'");
    if (!std::holds_alternative<std::vector<bool>>(v)) {
      fail_at(text_.size(), "the expression is an integer, not a list of 0 and 1");
    }
    return std::get<std::vector<bool>>(std::move(v));
  }

 private:
  using Value = std::variant<std::vector<bool>, std::int64_t>;

  template <class... A>
  [[noreturn]] void fail_at(std::size_t at, const A&... what) const {
    // The value as given (its first 80 characters when longer).
    const std::string shown =
        text_.size() > 80 ? core::str(text_.substr(0, 80), "...") : std::string(text_);
    throw core::InvalidArgument(core::str("--moe-layer-freq '", shown, "': ", what...,
                                          " at character ", at + 1,
                                          " (a pattern is lists of 0 and 1 with + and * by "
                                          "integers, e.g. \"([1]*3+[0]*1)*2\")"));
  }
  template <class... A>
  [[noreturn]] void fail(const A&... what) const {
    fail_at(pos_, what...);
  }
  void skip() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::int64_t integer() {
    skip();
    if (pos_ == text_.size()) fail("the expression ends early");
    if (text_[pos_] < '0' || text_[pos_] > '9') fail("unexpected '", text_[pos_], "'");
    std::int64_t n = 0;
    const char* begin = text_.data() + pos_;
    const auto [end, ec] = std::from_chars(begin, text_.data() + text_.size(), n);
    if (ec != std::errc() || n > static_cast<std::int64_t>(kMaxPatternLayers)) {
      fail("the integer is too large (at most ", kMaxPatternLayers, ")");
    }
    pos_ += static_cast<std::size_t>(end - begin);
    return n;
  }
  Value expr() {
    Value v = term();
    for (;;) {
      const std::size_t at = (skip(), pos_);
      if (!eat('+')) return v;
      Value r = term();
      auto* a = std::get_if<std::vector<bool>>(&v);
      auto* b = std::get_if<std::vector<bool>>(&r);
      if (a == nullptr || b == nullptr) fail_at(at, "'+' joins two lists only");
      a->insert(a->end(), b->begin(), b->end());
      if (a->size() > kMaxPatternLayers) fail_at(at, "more than ", kMaxPatternLayers, " layers");
    }
  }
  Value term() {
    Value v = primary();
    for (;;) {
      const std::size_t at = (skip(), pos_);
      if (!eat('*')) return v;
      Value r = primary();
      auto* a = std::get_if<std::vector<bool>>(&v);
      auto* b = std::get_if<std::vector<bool>>(&r);
      if (a != nullptr && b != nullptr) fail_at(at, "'*' of two lists");
      if (a == nullptr && b == nullptr) {  // n * m
        const std::int64_t n = std::get<std::int64_t>(v) * std::get<std::int64_t>(r);
        if (n > static_cast<std::int64_t>(kMaxPatternLayers)) {
          fail_at(at, "the integer is too large (at most ", kMaxPatternLayers, ")");
        }
        v = n;
        continue;
      }
      const std::vector<bool> list = a != nullptr ? *a : *b;
      const std::int64_t n = a != nullptr ? std::get<std::int64_t>(r) : std::get<std::int64_t>(v);
      if (!list.empty() && static_cast<std::size_t>(n) > kMaxPatternLayers / list.size()) {
        fail_at(at, "more than ", kMaxPatternLayers, " layers");
      }
      std::vector<bool> out;
      for (std::int64_t i = 0; i < n; ++i) out.insert(out.end(), list.begin(), list.end());
      v = std::move(out);
    }
  }
  Value primary() {
    skip();
    if (eat('(')) {
      // A bound on the recursion (a hostile value would exhaust the stack).
      if (++depth_ > 64) fail_at(pos_ - 1, "parentheses nested more than 64 deep");
      Value v = expr();
      --depth_;
      if (!eat(')')) {
        if (pos_ == text_.size()) fail("the expression ends early (a '(' is not closed)");
        fail("expected ')', found '", text_[pos_], "'");
      }
      return v;
    }
    if (eat('[')) {
      std::vector<bool> list;
      if (eat(']')) return list;
      for (;;) {
        const std::size_t at = (skip(), pos_);
        const std::int64_t bit = integer();
        if (bit != 0 && bit != 1)
          fail_at(at, "a layer's entry is 0 (dense) or 1 (experts), not ", bit);
        list.push_back(bit == 1);
        if (list.size() > kMaxPatternLayers)
          fail_at(at, "more than ", kMaxPatternLayers, " layers");
        if (eat(']')) return list;
        if (!eat(',')) {
          if (pos_ == text_.size()) fail("the expression ends early (a '[' is not closed)");
          fail("expected ',' or ']', found '", text_[pos_], "'");
        }
      }
    }
    return integer();
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

std::vector<bool> parse_moe_layer_pattern(std::string_view text) {
  return PatternParser(text).parse();
}

std::string moe_layer_pattern_string(const std::vector<bool>& pattern) {
  std::string s = "[";
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (i > 0) s += ',';
    s += pattern[i] ? '1' : '0';
  }
  return s + "]";
}

void ModelConfig::set_moe_layer_freq(std::string_view value) {
  if (value.find('[') != std::string_view::npos) {
    moe_layer_pattern = parse_moe_layer_pattern(value);
    moe_layer_freq = 1;
    return;
  }
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
    throw core::InvalidArgument(
        core::str("--moe-layer-freq '", value,
                  "': an integer N (an expert layer every N-th layer, starting at layer 0) or a "
                  "pattern of 0 and 1 per layer such as \"[1,0,1,0]\" or \"([1]*3+[0]*1)*2\""));
  }
  moe_layer_freq = n;
  moe_layer_pattern.clear();
}

std::string ModelConfig::moe_layer_pattern_string() const {
  std::vector<bool> p(static_cast<std::size_t>(std::max<std::int64_t>(num_layers, 0)));
  for (std::size_t l = 0; l < p.size(); ++l) p[l] = moe_layer(static_cast<std::int64_t>(l));
  return model::moe_layer_pattern_string(p);
}

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
  TRIDENT_CHECK(moe_layer_pattern.empty() ||
                    static_cast<std::int64_t>(moe_layer_pattern.size()) == num_layers,
                "--moe-layer-freq ", model::moe_layer_pattern_string(moe_layer_pattern), " has ",
                moe_layer_pattern.size(),
                " entries; the pattern needs one per layer: --num-layers ", num_layers);
  bool any_moe = false;
  for (std::int64_t l = 0; l < num_layers; ++l) any_moe = any_moe || moe_layer(l);
  TRIDENT_CHECK(any_moe, "--moe-layer-freq ", moe_layer_pattern_string(),
                " makes no layer a mixture of experts; use --num-experts 0 for a dense model");
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
