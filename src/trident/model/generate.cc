#include "trident/model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "trident/core/error.h"
#include "trident/core/rng.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/matmul.h"

namespace trident::model {

namespace k = trident::kernels;

Generator::Generator(const ModelConfig& cfg, const GptParams& params) : cfg_(cfg), params_(params) {
  const std::int64_t C = cfg.hidden_size, P = cfg.max_positions();
  const auto sz = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  k_cache_.assign(sz(cfg.num_layers * P * C), 0.0f);
  v_cache_.assign(k_cache_.size(), 0.0f);
  x_.resize(sz(C));
  ln_.resize(sz(C));
  qkv_.resize(sz(3 * C));
  attn_.resize(sz(C));
  tmp_.resize(sz(C));
  fc_.resize(sz(cfg.ffn()));
  logits_.resize(sz(cfg.padded_vocab_size()));
  mean_.resize(1);
  rstd_.resize(1);
  scores_.resize(sz(P));
  slopes_.assign(sz(cfg.num_attention_heads), 0.0f);
  if (cfg.position_embedding == PositionEmbedding::kAlibi) {
    k::alibi_slopes(cfg.num_attention_heads, slopes_.data());
  }
}

const float* Generator::step(const core::ExecContext& ctx, std::int32_t token) {
  const std::int64_t C = cfg_.hidden_size, F = cfg_.ffn(), NH = cfg_.num_attention_heads;
  const std::int64_t HS = C / NH, P = cfg_.max_positions(), Vp = cfg_.padded_vocab_size();
  TRIDENT_CHECK(pos_ < P, "generation reached the model's --max-position-embeddings (", P,
                "): use fewer prompt plus new tokens");
  TRIDENT_CHECK(token >= 0 && token < Vp, "token id ", token, " outside the vocabulary");
  const float eps = cfg_.layernorm_epsilon;
  for (std::int64_t c = 0; c < C; ++c) {
    x_[static_cast<std::size_t>(c)] =
        params_.wte[token * C + c] + (params_.wpe ? params_.wpe[pos_ * C + c] : 0.0f);
  }
  if (params_.emb_ln_w) {  // BLOOM's embedding LayerNorm
    k::layernorm_forward(ctx, {.out = ln_.data(),
                               .mean = mean_.data(),
                               .rstd = rstd_.data(),
                               .in = x_.data(),
                               .weight = params_.emb_ln_w,
                               .bias = params_.emb_ln_b,
                               .rows = 1,
                               .cols = C,
                               .eps = eps});
    std::copy(ln_.begin(), ln_.end(), x_.begin());
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  for (std::int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerTensors<const float*>& w = params_.layers[static_cast<std::size_t>(l)];
    float* kc = k_cache_.data() + l * P * C;
    float* vc = v_cache_.data() + l * P * C;
    k::layernorm_forward(ctx, {.out = ln_.data(),
                               .mean = mean_.data(),
                               .rstd = rstd_.data(),
                               .in = x_.data(),
                               .weight = w.ln1_w,
                               .bias = w.ln1_b,
                               .rows = 1,
                               .cols = C,
                               .eps = eps});
    k::linear_forward(ctx, {.out = qkv_.data(),
                            .in = ln_.data(),
                            .weight = w.qkv_w,
                            .bias = w.qkv_b,
                            .rows = 1,
                            .in_features = C,
                            .out_features = 3 * C});
    for (std::int64_t h = 0; h < NH; ++h) {
      const float* q = qkv_.data() + h * 3 * HS;
      std::copy_n(q + HS, HS, kc + pos_ * C + h * HS);
      std::copy_n(q + 2 * HS, HS, vc + pos_ * C + h * HS);
      float max_score = -INFINITY;
      for (std::int64_t t = 0; t <= pos_; ++t) {
        float s = 0;
        for (std::int64_t d = 0; d < HS; ++d) s += q[d] * kc[t * C + h * HS + d];
        s = s * scale + slopes_[static_cast<std::size_t>(h)] * static_cast<float>(t);  // ALiBi
        scores_[static_cast<std::size_t>(t)] = s;
        max_score = std::max(max_score, s);
      }
      float denom = 0;
      for (std::int64_t t = 0; t <= pos_; ++t) {
        float& s = scores_[static_cast<std::size_t>(t)];
        s = std::exp(s - max_score);
        denom += s;
      }
      float* out = attn_.data() + h * HS;
      std::fill_n(out, HS, 0.0f);
      for (std::int64_t t = 0; t <= pos_; ++t) {
        const float p = scores_[static_cast<std::size_t>(t)] / denom;
        for (std::int64_t d = 0; d < HS; ++d) out[d] += p * vc[t * C + h * HS + d];
      }
    }
    k::linear_forward(ctx, {.out = tmp_.data(),
                            .in = attn_.data(),
                            .weight = w.proj_w,
                            .bias = w.proj_b,
                            .rows = 1,
                            .in_features = C,
                            .out_features = C});
    k::add_forward(ctx, x_.data(), x_.data(), tmp_.data(), C);
    k::layernorm_forward(ctx, {.out = ln_.data(),
                               .mean = mean_.data(),
                               .rstd = rstd_.data(),
                               .in = x_.data(),
                               .weight = w.ln2_w,
                               .bias = w.ln2_b,
                               .rows = 1,
                               .cols = C,
                               .eps = eps});
    k::linear_forward(ctx, {.out = fc_.data(),
                            .in = ln_.data(),
                            .weight = w.fc_w,
                            .bias = w.fc_b,
                            .rows = 1,
                            .in_features = C,
                            .out_features = F});
    k::gelu_forward(ctx, fc_.data(), fc_.data(), F);
    k::linear_forward(ctx, {.out = tmp_.data(),
                            .in = fc_.data(),
                            .weight = w.fc2_w,
                            .bias = w.fc2_b,
                            .rows = 1,
                            .in_features = F,
                            .out_features = C});
    k::add_forward(ctx, x_.data(), x_.data(), tmp_.data(), C);
  }
  k::layernorm_forward(ctx, {.out = ln_.data(),
                             .mean = mean_.data(),
                             .rstd = rstd_.data(),
                             .in = x_.data(),
                             .weight = params_.lnf_w,
                             .bias = params_.lnf_b,
                             .rows = 1,
                             .cols = C,
                             .eps = eps});
  k::linear_forward(ctx, {.out = logits_.data(),
                          .in = ln_.data(),
                          .weight = params_.wte,
                          .bias = nullptr,
                          .rows = 1,
                          .in_features = C,
                          .out_features = Vp});
  ++pos_;
  return logits_.data();
}

std::int32_t sample_token(const float* logits, std::int64_t vocab, const SamplingConfig& cfg,
                          std::uint64_t draw) {
  TRIDENT_CHECK(cfg.temperature >= 0, "--temperature must be >= 0, got ", cfg.temperature);
  TRIDENT_CHECK(cfg.top_p > 0 && cfg.top_p <= 1, "--top-p must be in (0, 1], got ", cfg.top_p);
  TRIDENT_CHECK(cfg.top_k >= 0, "--top-k must be >= 0, got ", cfg.top_k);
  if (cfg.temperature == 0.0f) {
    return static_cast<std::int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::int64_t keep = vocab;
  if (cfg.top_k > 0) keep = std::min(keep, cfg.top_k);
  std::vector<double> probs(static_cast<std::size_t>(keep));
  const double max_logit = logits[order[0]];
  double total = 0;
  for (std::int64_t i = 0; i < keep; ++i) {
    probs[static_cast<std::size_t>(i)] =
        std::exp((logits[order[static_cast<std::size_t>(i)]] - max_logit) / cfg.temperature);
    total += probs[static_cast<std::size_t>(i)];
  }
  if (cfg.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double acc = 0;
    std::int64_t cut = keep;
    for (std::int64_t i = 0; i < keep; ++i) {
      acc += probs[static_cast<std::size_t>(i)] / total;
      if (acc >= cfg.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  const double u = core::philox_uniform(cfg.seed, 0x5a3b1e, draw) * total;
  double acc = 0;
  for (std::int64_t i = 0; i < keep; ++i) {
    acc += probs[static_cast<std::size_t>(i)];
    if (u <= acc) return order[static_cast<std::size_t>(i)];
  }
  return order[static_cast<std::size_t>(keep - 1)];
}

}  // namespace trident::model
