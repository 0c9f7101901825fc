#include "trident/model/layers/embedding.h"

#include "trident/core/error.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/fill.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void embedding_forward(const LayerContext& lc, const EmbeddingConfig& cfg, const EmbeddingParams& p,
                       const std::int32_t* tokens, std::int64_t position, const EmbeddingSaved& s,
                       float* out) {
  TRIDENT_CHECK(p.wpe == nullptr || position + lc.seq_len <= cfg.max_positions, "sequence of ",
                position + lc.seq_len, " tokens is longer than the ", cfg.max_positions,
                " learned positions (--max-position-embeddings); ALiBi models have no such limit");
  float* dst = cfg.norm ? s.raw : out;
  float* partial = lc.region.partial_of(dst, lc.ws.gathered);
  const float* wpe = p.wpe ? p.wpe + position * cfg.hidden : nullptr;
  k::embedding_forward(lc.ctx, {.out = partial,
                                .tokens = tokens,
                                .wte = p.wte,
                                .wpe = lc.tp_rank() == 0 ? wpe : nullptr,  // once
                                .batch = lc.batch,
                                .seq_len = lc.seq_len,
                                .hidden = cfg.hidden,
                                .vocab_start = lc.tp_rank() * cfg.vocab_local,
                                .vocab_local = cfg.vocab_local});
  lc.region.leave(partial, dst);  // each token's row lives on one tp rank
  if (cfg.norm) norm_forward(lc, cfg.norm_cfg, p.norm, s.raw, lc.local_rows(), s.norm);
}

void embedding_backward(const LayerContext& lc, const EmbeddingConfig& cfg,
                        const EmbeddingParams& p, const EmbeddingSaved& s,
                        const std::int32_t* tokens, const float* d_out, const EmbeddingGrads& g) {
  const float* d = d_out;
  if (cfg.norm) {
    float* d_raw = lc.ws.d_ln;  // free here; the LayerNorm accumulates into it
    k::fill(lc.ctx, {.out = d_raw, .value = 0.0f, .n = lc.local_rows() * cfg.hidden});
    norm_backward(lc, cfg.norm_cfg, p.norm, s.norm, s.raw, d, lc.local_rows(), g.norm, d_raw);
    d = d_raw;
  }
  // The forward reduction's backward: every rank scatters the full gradient into its own
  // vocabulary rows; the position embedding's gradient is the same on every rank.
  const float* d_full = lc.region.leave_backward(d, lc.ws.d_full);
  k::embedding_backward(lc.ctx, {.d_wte = g.wte,
                                 .d_wpe = g.wpe,
                                 .d_out = d_full,
                                 .tokens = tokens,
                                 .batch = lc.batch,
                                 .seq_len = lc.seq_len,
                                 .hidden = cfg.hidden,
                                 .vocab_start = lc.tp_rank() * cfg.vocab_local,
                                 .vocab_local = cfg.vocab_local});
}

}  // namespace trident::model::layers
