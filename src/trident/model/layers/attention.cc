#include "trident/model/layers/attention.h"

#include "trident/core/error.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/kv_cache_attention.h"
#include "trident/kernels/rope.h"
#include "trident/model/layers/context_parallel.h"

namespace trident::model::layers {

namespace k = trident::kernels;

void declare_attention(const AttentionConfig& cfg, const WeightScope& s, AttentionParams* p,
                       AttentionGrads* g) {
  const std::int64_t C = cfg.hidden, HS = cfg.head_dim, G = cfg.query_groups;
  const std::int64_t Q = (cfg.heads + 2 * G) * HS;
  // Column-parallel (split along the output rows): whole heads per rank, since the rows are
  // interleaved per query group (G, NH/G + 2, HS): the group's query heads, its key and value head
  // (multi-head attention: (NH, 3, HS)). Fewer groups than ranks: tp / G ranks split a group's
  // query heads and each holds the group's key and value heads (replicated).
  const int tp = s.tp_size();
  const int replicas = G < tp ? static_cast<int>(tp / G) : 1;
  const std::int64_t q_rows = cfg.heads / G * HS, block = q_rows + 2 * HS;
  s({.name = "query_key_value.weight",
     .shape = {Q, C},
     .tp_split = 0,
     .tp_replicas = replicas,
     .split_rows = q_rows,
     .block_rows = block},
    slot(field(p, &AttentionParams::qkv_w), field(g, &AttentionGrads::qkv_w)));
  if (cfg.qkv_bias) {
    s({.name = "query_key_value.bias",
       .shape = {Q},
       .tp_split = 0,
       .init = InitRule::kZeros,
       .weight_decay = false,
       .tp_replicas = replicas,
       .split_rows = q_rows,
       .block_rows = block},
      slot(field(p, &AttentionParams::qkv_b), field(g, &AttentionGrads::qkv_b)));
  }
  // Row-parallel (split along the input columns); its bias is added once, after the reduction.
  s({.name = "dense.weight", .shape = {C, C}, .tp_split = 1, .init = InitRule::kScaledNormal},
    slot(field(p, &AttentionParams::proj_w), field(g, &AttentionGrads::proj_w)));
  if (cfg.bias) {
    s({.name = "dense.bias", .shape = {C}, .init = InitRule::kZeros, .weight_decay = false},
      slot(field(p, &AttentionParams::proj_b), field(g, &AttentionGrads::proj_b)));
  }
}

namespace {

struct Local {
  std::int64_t NH, HS, Cl;
};
Local local_of(const LayerContext& lc, const AttentionConfig& cfg) {
  const std::int64_t tp = lc.region.group().size();
  return {cfg.heads / tp, cfg.head_dim, cfg.hidden / tp};
}

// The attention core's views of this rank's heads: qkv (B, T, NH, 3 HS), its output (B, T, C/tp),
// the per-row log-sum-exp (B, NH, T), the probabilities (B, NH, T, T), the document ids (B, T).
struct CoreShapes {
  core::Shape qkv, out, lse, probs, tokens, heads;
};
CoreShapes core_shapes(const LayerContext& lc, const AttentionConfig& cfg) {
  const auto [NH, HS, Cl] = local_of(lc, cfg);
  const std::int64_t B = lc.batch, T = lc.seq_len;
  return {.qkv = {B, T, NH, 3 * HS},
          .out = {B, T, Cl},
          .lse = {B, NH, T},
          .probs = {B, NH, T, T},
          .tokens = {B, T},
          .heads = {NH}};
}

// The rotary / grouped-query expansion of this rank's rows (rope.h).
k::RopeQkvGeometry rope_geometry(const LayerContext& lc, const AttentionConfig& cfg,
                                 std::int64_t position) {
  const std::int64_t tp = lc.region.group().size();
  // Fewer groups than ranks: this rank's heads share one group (replicated key/value heads).
  const std::int64_t groups = cfg.query_groups >= tp ? cfg.query_groups / tp : 1;
  return {.seq_len = lc.seq_len,
          .position = position,
          .groups = groups,
          .heads_per_group = cfg.heads / tp / groups,
          .head_dim = cfg.head_dim};
}

k::AttentionDropout attention_dropout(const LayerContext& lc, const AttentionConfig& cfg,
                                      std::int64_t layer) {
  const std::int64_t NH = local_of(lc, cfg).NH;
  return {.p = lc.dropout.attention_p,
          .seed = lc.dropout.seed,
          .stream = drop_stream(lc.dropout.iteration, layer, DropSite::kProbs),
          .first_sample = lc.dropout.first_sample,
          .head_offset = lc.tp_rank() * NH,
          .total_heads = cfg.heads};
}

RingAttentionArgs ring_args(const LayerContext& lc, const AttentionConfig& cfg,
                            const AttentionSaved& s, std::int64_t layer) {
  const auto [NH, HS, Cl] = local_of(lc, cfg);
  return {.attn = s.attn,
          .lse = s.lse,
          .qkv = s.qkv,
          .alibi = cfg.alibi,
          .dropout = attention_dropout(lc, cfg, layer),
          .num_heads = NH,
          .head_dim = HS};
}

// Ulysses: the projection's rows are in the workspace; the saved qkv is the whole sequence.
UlyssesArgs ulysses_args(const LayerContext& lc, const AttentionConfig& cfg,
                         const AttentionSaved& s, std::int64_t layer) {
  const auto [NH, HS, Cl] = local_of(lc, cfg);
  return {.local_qkv = lc.ws.sp_local,
          .qkv = s.qkv,
          .out = s.attn_seq,
          .lse = s.lse,
          .attn = s.attn,
          .alibi = cfg.alibi,
          .dropout = attention_dropout(lc, cfg, layer),
          .num_heads = NH,
          .head_dim = HS};
}

// The attention core forward: qkv -> attn (and lse or probs).
void core_forward(const LayerContext& lc, const AttentionConfig& cfg, const AttentionSaved& s,
                  float* probs, std::int64_t layer, const KvCache* cache) {
  const auto [NH, HS, Cl] = local_of(lc, cfg);
  if (cache) {
    const core::Shape cache_rows{cache->max_positions, NH * HS};
    k::kv_cache_attention(lc.ctx, {.out = view_of(lc, s.attn, {lc.rows(), NH * HS}),
                                   .k_cache = view_of(lc, cache->k, cache_rows),
                                   .v_cache = view_of(lc, cache->v, cache_rows),
                                   .qkv = view_of(lc, s.qkv, {lc.rows(), NH, 3 * HS}),
                                   .alibi = view_of(lc, cfg.alibi, {NH}),
                                   .position = cache->position,
                                   .scratch = cache->scratch});
    return;
  }
  const CoreShapes sh = core_shapes(lc, cfg);
  if (lc.context_parallel()) {
    TRIDENT_CHECK(cfg.flash, "context parallelism runs the fused attention core only");
    if (lc.ulysses) return ulysses_attention_forward(lc, ulysses_args(lc, cfg, s, layer));
    return ring_attention_forward(lc, ring_args(lc, cfg, s, layer));
  }
  if (cfg.flash) {
    return k::flash_attention(lc.ctx, {.out = view_of(lc, s.attn, sh.out),
                                       .lse = view_of(lc, s.lse, sh.lse),
                                       .qkv = view_of(lc, s.qkv, sh.qkv),
                                       .alibi = view_of(lc, cfg.alibi, sh.heads),
                                       .doc = view_of(lc, lc.docs, sh.tokens),
                                       .dropout = attention_dropout(lc, cfg, layer)});
  }
  k::attention(lc.ctx, {.out = view_of(lc, s.attn, sh.out),
                        .probs = view_of(lc, probs, sh.probs),
                        .qkv = view_of(lc, s.qkv, sh.qkv),
                        .doc = view_of(lc, lc.docs, sh.tokens)});
}

}  // namespace

void attention_forward(const LayerContext& lc, const AttentionConfig& cfg, const AttentionParams& p,
                       const AttentionForwardArgs& args) {
  const AttentionSaved& s = args.saved;
  float* out = args.out;
  const auto [NH, HS, Cl] = local_of(lc, cfg);
  const std::int64_t BT = lc.rows(), C = cfg.hidden;
  const float* x = lc.region.enter(args.in, lc.ws.gathered);  // f (SP: all-gather)
  const k::RopeQkvGeometry rg = rope_geometry(lc, cfg, args.cache ? args.cache->position : 0);
  // Ulysses: the rows' qkv go to the workspace; the all-to-all fills the saved qkv.
  float* qkv = lc.context_parallel() && lc.ulysses ? lc.ws.sp_local : s.qkv;
  linear(lc, {.out = cfg.expand_qkv ? lc.ws.qkv_grouped : qkv,
              .in = x,
              .weight = p.qkv_w,
              .bias = p.qkv_b,
              .rows = BT,
              .in_features = C,
              .out_features = cfg.expand_qkv ? rg.in_cols() : 3 * Cl});
  if (cfg.expand_qkv) {
    k::rope_qkv(lc.ctx, {.out = view_of(lc, qkv, {BT, rg.out_cols()}),
                         .in = view_of(lc, lc.ws.qkv_grouped, {BT, rg.in_cols()}),
                         .inv_freq = view_of(lc, cfg.inv_freq, {cfg.head_dim / 2}),
                         .positions = view_of(lc, lc.positions, {BT}),
                         .geometry = rg});
  }
  // Selective recomputation keeps no probabilities: they go to the shared scratch.
  core_forward(lc, cfg, s, s.probs ? s.probs : lc.ws.probs, args.layer, args.cache);
  float* partial = lc.region.partial_of(out, lc.ws.gathered);
  linear(lc, {.out = partial,
              .in = s.attn,
              .weight = p.proj_w,
              .bias = lc.tp_rank() == 0 ? p.proj_b : nullptr,  // once, before the reduction
              .rows = BT,
              .in_features = Cl,
              .out_features = C});
  lc.region.leave(partial, out);  // g (SP: reduce-scatter)
}

const float* attention_backward(const LayerContext& lc, const AttentionConfig& cfg,
                                const AttentionParams& p, const AttentionBackwardArgs& args) {
  const AttentionSaved& s = args.saved;
  const AttentionGrads& g = args.grads;
  const std::int64_t layer = args.layer;
  const auto [NH, HS, Cl] = local_of(lc, cfg);
  const std::int64_t BT = lc.rows(), C = cfg.hidden;
  const Workspace& ws = lc.ws;
  if (!cfg.flash && s.probs == nullptr) {
    // Selective recomputation: the probabilities again (the output, identical to the saved one,
    // lands in d_attn, which the projection's backward overwrites next).
    const AttentionSaved again{.qkv = s.qkv, .attn = ws.d_attn};
    core_forward(lc, cfg, again, ws.probs, layer, nullptr);
  }
  const float* d = lc.region.leave_backward(args.d_out, ws.d_full);  // g backward (SP: all-gather)
  linear_backward(lc, {.d_in = ws.d_attn,
                       .d_weight = g.proj_w,
                       .d_bias = g.proj_b,
                       .d_out = d,
                       .in = s.attn,
                       .weight = p.proj_w,
                       .rows = BT,
                       .in_features = Cl,
                       .out_features = C});
  const CoreShapes sh = core_shapes(lc, cfg);
  if (lc.context_parallel() && lc.ulysses) {
    ulysses_attention_backward(
        lc, {.d_qkv = ws.d_qkv, .d_attn = ws.d_attn, .fwd = ulysses_args(lc, cfg, s, layer)});
  } else if (lc.context_parallel()) {
    ring_attention_backward(
        lc, {.d_qkv = ws.d_qkv, .d_attn = ws.d_attn, .fwd = ring_args(lc, cfg, s, layer)});
  } else if (cfg.flash) {
    k::flash_attention_backward(lc.ctx, {.d_qkv = view_of(lc, ws.d_qkv, sh.qkv),
                                         .d_out = view_of(lc, ws.d_attn, sh.out),
                                         .qkv = view_of(lc, s.qkv, sh.qkv),
                                         .out = view_of(lc, s.attn, sh.out),
                                         .lse = view_of(lc, s.lse, sh.lse),
                                         .alibi = view_of(lc, cfg.alibi, sh.heads),
                                         .doc = view_of(lc, lc.docs, sh.tokens),
                                         .dropout = attention_dropout(lc, cfg, layer)});
  } else {
    k::attention_backward(lc.ctx, {.d_qkv = view_of(lc, ws.d_qkv, sh.qkv),
                                   .d_probs = view_of(lc, ws.d_probs, sh.probs),
                                   .d_out = view_of(lc, ws.d_attn, sh.out),
                                   .qkv = view_of(lc, s.qkv, sh.qkv),
                                   .probs = view_of(lc, s.probs ? s.probs : ws.probs, sh.probs)});
  }
  const float* d_proj = ws.d_qkv;
  std::int64_t proj_cols = 3 * Cl;
  if (cfg.expand_qkv) {
    const k::RopeQkvGeometry rg = rope_geometry(lc, cfg, 0);
    k::rope_qkv_backward(lc.ctx, {.d_in = view_of(lc, ws.qkv_grouped, {BT, rg.in_cols()}),
                                  .d_out = view_of(lc, ws.d_qkv, {BT, rg.out_cols()}),
                                  .inv_freq = view_of(lc, cfg.inv_freq, {cfg.head_dim / 2}),
                                  .positions = view_of(lc, lc.positions, {BT}),
                                  .geometry = rg});
    d_proj = ws.qkv_grouped;
    proj_cols = rg.in_cols();
  }
  const float* x = lc.region.enter(args.in, ws.gathered);  // the input again (SP: gathered again)
  linear_backward(lc, {.d_in = ws.d_ln,
                       .d_weight = g.qkv_w,
                       .d_bias = g.qkv_b,
                       .d_out = d_proj,
                       .in = x,
                       .weight = p.qkv_w,
                       .rows = BT,
                       .in_features = C,
                       .out_features = proj_cols});
  return lc.region.enter_backward(ws.d_ln);  // f backward (SP: reduce-scatter)
}

}  // namespace trident::model::layers
