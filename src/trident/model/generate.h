// Autoregressive generation with a KV cache: each new token costs one row through every layer,
// attending to the cached keys and values of all earlier positions. The forward is the model's own
// (gpt_forward with a KvCacheForward): the same layers, one row at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "trident/core/arena.h"
#include "trident/core/exec_context.h"
#include "trident/model/gpt.h"

namespace trident::model {

class Generator {
 public:
  // params (memory of ctx's device) must outlive the generator. Caches hold up to
  // cfg.max_positions() tokens. The activations, the caches and the token live on ctx's device;
  // the logits are read back to the host once per step (the sampling is the host's).
  Generator(const ModelConfig& cfg, const GptParams& params, const core::ExecContext& ctx = {});
  Generator(const Generator&) = delete;  // the caches point into its own buffers
  Generator& operator=(const Generator&) = delete;

  // Feeds `token` at the next position; returns the logits in host memory (padded vocabulary,
  // padding columns included) predicting the token after it, valid until the next step. Throws
  // InvalidArgument past max_positions. ctx is the constructor's.
  const float* step(const core::ExecContext& ctx, std::int32_t token);
  std::int64_t position() const { return pos_; }
  void reset() { pos_ = 0; }

 private:
  ModelConfig cfg_;  // no recomputation, no dropout
  GptParams params_;
  ModelRuntime rt_;  // one rank, the whole model, not training
  std::int64_t pos_ = 0;
  bool on_device_ = false;
  GptActivations acts_;                  // one row
  core::Arena state_;                    // K and V caches (L, max_positions, C), scratch, token
  std::int32_t* token_ = nullptr;        // the fed token, on the device
  std::vector<layers::KvCache> caches_;  // one per layer, into state_
  std::vector<float> logits_;            // the host copy of a device's logits
};

struct SamplingConfig {
  float temperature = 1.0f;  // 0 -> greedy (argmax)
  std::int64_t top_k = 0;    // 0 -> off
  float top_p = 1.0f;        // 1 -> off
  std::uint64_t seed = 1234;
};
// Draws the next token from logits over the real vocabulary [0, vocab); `draw` numbers the call
// so that a (seed, draw) pair always gives the same token.
std::int32_t sample_token(const float* logits, std::int64_t vocab, const SamplingConfig& cfg,
                          std::uint64_t draw);

}  // namespace trident::model
