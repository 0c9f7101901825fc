// The small GPT set-up the model tests share: a config of 2 layers, hidden 32 and 4 heads, its
// parameters initialised from a seed (with zeroed gradients) and their views, and random token
// ids.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "trident/model/config.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"

namespace trident::model::testing {

// 2 layers, hidden 32, 4 heads, the given sequence length and vocabulary; the rest is
// ModelConfig's defaults.
inline ModelConfig tiny_config(std::int64_t seq_length, std::int64_t vocab_size) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = seq_length;
  c.vocab_size = vocab_size;
  return c;
}

// n ids uniform in [0, bound), the next n draws of rng (successive calls continue its stream).
inline std::vector<std::int32_t> random_ids(std::mt19937& rng, std::int64_t n, std::int64_t bound) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& t : v) t = static_cast<std::int32_t>(rng() % bound);
  return v;
}
// The same from a generator seeded with `seed`.
inline std::vector<std::int32_t> random_ids(std::uint32_t seed, std::int64_t n,
                                            std::int64_t bound) {
  std::mt19937 rng(seed);
  return random_ids(rng, n, bound);
}

// A model's flat FP32 parameters (this shard's table, init_params from `seed`) and gradients
// (zero), with their views.
struct TinyParams {
  ModelConfig cfg;
  ParamTable table;
  std::vector<float> params, grads;

  TinyParams(const ModelConfig& c, std::uint64_t seed, const ModelShard& shard = {})
      : cfg(c),
        table(build_gpt_param_table(c, shard)),
        params(static_cast<std::size_t>(table.total_numel)),
        grads(params.size(), 0.0f) {
    init_params(cfg, table, seed, params.data(), shard.tp_rank);
  }
  GptParams views() const { return gpt_param_views(cfg, table, params.data()); }
  GptGrads grad_views() { return gpt_grad_views(cfg, table, grads.data()); }
};

}  // namespace trident::model::testing
