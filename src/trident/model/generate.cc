#include "trident/model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "trident/core/error.h"
#include "trident/core/rng.h"
#include "trident/kernels/kv_cache_attention.h"
#include "trident/kernels/memory.h"

namespace trident::model {

namespace k = trident::kernels;

Generator::Generator(const ModelConfig& cfg, const GptParams& params, const core::ExecContext& ctx)
    : cfg_(cfg), params_(params), on_device_(ctx.device.kind != core::DeviceKind::kCpu) {
  cfg_.recompute = Recompute::kNone;
  cfg_.loss_chunk_rows = 0;  // the next token's logits are read
  const std::int64_t C = cfg.hidden_size, P = cfg.max_positions(), L = cfg.num_layers;
  const std::int64_t scratch = k::kv_cache_attention_scratch_floats(P, cfg.num_attention_heads);
  make_activations(cfg_, rt_.shard, 1, 1, /*bf16=*/false, acts_, ctx);
  state_ = core::Arena(2 * core::Arena::footprint(core::DType::kF32, {L * P * C}) +
                           core::Arena::footprint(core::DType::kF32, {scratch}) +
                           core::Arena::footprint(core::DType::kI32, {1}),
                       k::memory_for(ctx));
  float* k_cache = state_.alloc(core::DType::kF32, {L * P * C}).as<float>();
  float* v_cache = state_.alloc(core::DType::kF32, {L * P * C}).as<float>();
  const std::span<float> scores(state_.alloc(core::DType::kF32, {scratch}).as<float>(),
                                static_cast<std::size_t>(scratch));
  token_ = state_.alloc(core::DType::kI32, {1}).as<std::int32_t>();
  for (std::int64_t l = 0; l < L; ++l) {
    caches_.push_back({.k = k_cache + l * P * C,
                       .v = v_cache + l * P * C,
                       .max_positions = P,
                       .scratch = scores});
  }
  if (on_device_) logits_.resize(static_cast<std::size_t>(cfg.padded_vocab_size()));
}

const float* Generator::step(const core::ExecContext& ctx, std::int32_t token) {
  const std::int64_t P = cfg_.max_positions(), Vp = cfg_.padded_vocab_size();
  TRIDENT_CHECK(pos_ < P, "generation reached the model's --max-position-embeddings (", P,
                "): use fewer prompt plus new tokens");
  TRIDENT_CHECK(token >= 0 && token < Vp, "token id ", token, " outside the vocabulary");
  for (layers::KvCache& c : caches_) c.position = pos_;
  k::copy_to_device(ctx, token_, &token, sizeof(token));
  gpt_forward(ctx, cfg_, rt_, params_, {.tokens = token_, .training = false}, acts_,
              {.position = pos_, .caches = caches_});
  ++pos_;
  if (!on_device_) return acts_.logits;
  k::download(ctx, logits_.data(), acts_.logits,
              static_cast<std::int64_t>(logits_.size() * sizeof(float)));
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
