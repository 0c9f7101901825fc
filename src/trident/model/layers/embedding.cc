#include "trident/model/layers/embedding.h"

#include "trident/core/error.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/fill.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void declare_embedding(const EmbeddingConfig& cfg, const WeightScope& s, EmbeddingParams* p,
                       EmbeddingGrads* g) {
  s({.name = "word_embeddings.weight",
     .shape = {cfg.vocab_local * s.tp_size(), cfg.hidden},
     .tp_split = 0,
     .tied = cfg.tied_output},
    slot(field(p, &EmbeddingParams::wte), field(g, &EmbeddingGrads::wte)));
  if (cfg.learned_positions) {
    s({.name = "position_embeddings.weight", .shape = {cfg.max_positions, cfg.hidden}},
      slot(field(p, &EmbeddingParams::wpe), field(g, &EmbeddingGrads::wpe)));
  }
  if (cfg.norm) {
    declare_norm(cfg.norm_cfg, s.sub("word_embeddings_layernorm."),
                 field(p, &EmbeddingParams::norm), field(g, &EmbeddingGrads::norm));
  }
}

void embedding_forward(const LayerContext& lc, const EmbeddingConfig& cfg, const EmbeddingParams& p,
                       const EmbeddingForwardArgs& args) {
  const EmbeddingSaved& s = args.saved;
  const std::int64_t position = args.position;
  TRIDENT_CHECK(p.wpe == nullptr || position + lc.seq_len <= cfg.max_positions, "sequence of ",
                position + lc.seq_len, " tokens is longer than the ", cfg.max_positions,
                " learned positions (--max-position-embeddings); ALiBi models have no such limit");
  float* dst = cfg.norm ? s.raw : args.out;
  float* partial = lc.region.partial_of(dst, lc.ws.gathered);
  // The position rows from `position` on (generation with a KV cache), added on one rank only.
  const float* wpe = p.wpe && lc.tp_rank() == 0 ? p.wpe + position * cfg.hidden : nullptr;
  const core::Shape tokens{lc.batch, lc.seq_len}, rows{lc.batch, lc.seq_len, cfg.hidden};
  k::embedding(lc.ctx, {.out = view_of(lc, partial, rows),
                        .tokens = view_of(lc, args.tokens, tokens),
                        .wte = view_of(lc, p.wte.f32, {cfg.vocab_local, cfg.hidden}),
                        .wpe = view_of(lc, wpe, {cfg.max_positions - position, cfg.hidden}),
                        .positions = view_of(lc, lc.positions, tokens),
                        .vocab_start = lc.tp_rank() * cfg.vocab_local});
  lc.region.leave(partial, dst);  // each token's row lives on one tp rank
  if (cfg.norm) {
    norm_forward(lc, cfg.norm_cfg, p.norm, {.in = s.raw, .rows = lc.local_rows(), .saved = s.norm});
  }
}

void embedding_backward(const LayerContext& lc, const EmbeddingConfig& cfg,
                        const EmbeddingParams& p, const EmbeddingBackwardArgs& args) {
  const EmbeddingSaved& s = args.saved;
  const EmbeddingGrads& g = args.grads;
  const float* d = args.d_out;
  if (cfg.norm) {
    float* d_raw = lc.ws.d_ln;  // free here; the LayerNorm accumulates into it
    k::fill(lc.ctx, {.out = view_of(lc, d_raw, {lc.local_rows(), cfg.hidden}), .value = 0.0f});
    norm_backward(lc, cfg.norm_cfg, p.norm,
                  {.d_in = d_raw,
                   .d_out = d,
                   .in = s.raw,
                   .rows = lc.local_rows(),
                   .saved = s.norm,
                   .grads = g.norm});
    d = d_raw;
  }
  // The forward reduction's backward: every rank scatters the full gradient into its own
  // vocabulary rows; the position embedding's gradient is the same on every rank.
  const float* d_full = lc.region.leave_backward(d, lc.ws.d_full);
  const core::Shape tokens{lc.batch, lc.seq_len};
  k::embedding_backward(lc.ctx, {.d_wte = view_of(lc, g.wte, {cfg.vocab_local, cfg.hidden}),
                                 .d_wpe = view_of(lc, g.wpe, {cfg.max_positions, cfg.hidden}),
                                 .d_out = view_of(lc, d_full, {lc.batch, lc.seq_len, cfg.hidden}),
                                 .tokens = view_of(lc, args.tokens, tokens),
                                 .positions = view_of(lc, lc.positions, tokens),
                                 .vocab_start = lc.tp_rank() * cfg.vocab_local});
}

}  // namespace trident::model::layers
