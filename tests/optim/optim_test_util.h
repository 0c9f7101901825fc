// Shared set-up for the optimizer part tests: a tiny GPT table laid out as one rank's flat
// buffer, and integer-valued test gradients (sums over ranks are exact in FP32, so expected
// values are exact).
#pragma once

#include <cstdint>
#include <vector>

#include "trident/model/config.h"
#include "trident/model/param_table.h"
#include "trident/optim/flat_layout.h"

namespace trident::optim::testing {

inline model::ModelConfig tiny_config(std::int64_t layers = 3) {
  model::ModelConfig c;
  c.num_layers = layers;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.vocab_size = 100;
  return c;
}

// One chunk holding the whole model (or `shard`), at base 0.
struct OneChunk {
  model::ModelConfig cfg;
  model::ParamTable table;
  FlatLayout layout;
  explicit OneChunk(const model::ModelConfig& c, const model::ModelShard& shard = {})
      : cfg(c), table(model::build_gpt_param_table(c, shard)) {
    layout = FlatLayout({{&table, 0, shard.first_layer}}, shard.tp_rank);
  }
  OneChunk(const OneChunk&) = delete;
};

// Rank r's gradient of flat element i in micro-batch m: a small integer (exact sums).
inline float grad_value(int rank, int micro, std::int64_t i) {
  return static_cast<float>((rank + 1) * (micro + 1) * (static_cast<int>(i % 7) - 3));
}

}  // namespace trident::optim::testing
