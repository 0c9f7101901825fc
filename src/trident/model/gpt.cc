#include "trident/model/gpt.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/view.h"
#include "trident/kernels/document_ids.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/grouped_linear.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/kernels/memory.h"
#include "trident/model/layers/context_parallel.h"

namespace trident::model {

namespace k = trident::kernels;

namespace {

int tp_size_of(const ModelRuntime& rt) { return rt.tp ? rt.tp->size() : 1; }
int tp_rank_of(const ModelRuntime& rt) { return rt.tp ? rt.tp->rank() : 0; }
parallel::TpGroup tp_group_of(const ModelRuntime& rt) {
  return parallel::TpGroup(rt.tp, rt.tp_traffic);
}

// Whether attention runs the rotary / grouped-query expansion of the QKV projection (rope.h):
// its output then lands in a workspace buffer and the expanded copy is what attention keeps.
bool expands_qkv(const ModelConfig& cfg) {
  return cfg.position_embedding == PositionEmbedding::kRope ||
         cfg.query_groups() != cfg.num_attention_heads;
}

// Context parallelism's part of the layout (layers/context_parallel.h): the rows' global
// positions, the positions 0 .. T_total-1, one block's out and lse, and the ring's travelling
// blocks and gradients or Ulysses' exchange buffers. T: this rank's tokens of a sample.
template <class Alloc>
void layout_sequence_split(const ModelConfig& cfg, const ModelShard& shard, std::int64_t B,
                           std::int64_t T, Alloc& take, GptActivations& a) {
  if (shard.cp_size == 1) return;
  TRIDENT_CHECK(!cfg.documents(),
                "context parallelism with --reset-position-ids / "
                "--reset-attention-mask is not supported yet: a document boundary can fall in "
                "any chunk; drop those flags or use --context-parallel-size 1");
  const std::int64_t BT = B * T, Cl = cfg.hidden_size / shard.tp_size;
  const std::int64_t NH = cfg.num_attention_heads / shard.tp_size;
  auto ints = [&](std::int64_t n) { return reinterpret_cast<std::int32_t*>(take(n)); };
  layers::Workspace& ws = a.ws;
  a.positions = ints(BT);
  a.cp_positions = ints(T * shard.cp_size);
  ws.cp_out_blk = take(BT / 2 * Cl);
  ws.cp_lse_blk = take(B * NH * (T / 2));
  if (shard.ulysses) {
    ws.sp_local = take(BT * 3 * Cl);
    ws.sp_send = take(BT * 3 * Cl);
    ws.sp_dout = take(BT * Cl);
    ws.sp_dqkv = take(BT * 3 * Cl);
  } else {
    for (float*& b : ws.cp_kv) b = take(BT * 2 * Cl);
    for (float*& b : ws.cp_dkv) b = take(BT * 2 * Cl);
  }
}

// The largest oneDNN workspace of the BF16 products (rows, in, out); empty ones are skipped.
std::int64_t bf16_scratch_bytes(const std::vector<std::array<std::int64_t, 3>>& products) {
  const core::ExecContext ctx;
  std::int64_t bytes = 0;
  for (const auto& [rows, in, out] : products) {
    if (rows > 0 && in > 0 && out > 0) {
      bytes = std::max(bytes, k::linear_bf16_scratch_bytes(ctx, rows, in, out));
    }
  }
  return bytes;
}

// The activation layout, shared by the size computation and the allocation so they never drift.
template <class Alloc>
void layout_activations(const ModelConfig& cfg, const ModelShard& shard, std::int64_t B,
                        std::int64_t T, bool bf16, Alloc&& take, GptActivations* acts) {
  const std::int64_t tp = shard.tp_size;
  const std::int64_t BT = B * T, C = cfg.hidden_size, F = cfg.ffn() / tp;
  const std::int64_t NH = cfg.num_attention_heads / tp, Cl = C / tp;
  const std::int64_t Ql = cfg.local_qkv_rows(tp), FCl = cfg.fc_rows() / tp;  // projection outputs
  const bool grouped = expands_qkv(cfg);
  const std::int64_t Vl = cfg.padded_vocab_size(tp) / tp;
  const std::int64_t R = shard.sequence_parallel ? BT / tp : BT;  // residual-stream rows
  GptActivations dummy;
  GptActivations& a = acts ? *acts : dummy;
  a.encoded = take(R * C);
  a.stage_rows = R;
  const bool unfused = !cfg.flash_attention();
  const bool ulysses = shard.cp_size > 1 && shard.ulysses;
  const bool selective = cfg.recompute == Recompute::kSelective && unfused;
  auto norm_saved = [&] { return layers::NormSaved{take(R * C), take(R), take(R)}; };
  auto block_saved = [&](bool keep) {
    layers::BlockSaved s{};
    if (keep) {
      s.norm1 = norm_saved();
      s.attention.qkv = take(BT * 3 * Cl);
      s.attention.probs = unfused && !selective ? take(B * NH * T * T) : nullptr;
      s.attention.lse = unfused ? nullptr : take(B * NH * T);
      s.attention.attn = take(BT * Cl);
      s.attention.attn_seq = ulysses ? take(BT * Cl) : nullptr;
      s.resid2 = take(R * C);
      s.norm2 = norm_saved();
      s.mlp.fc = take(BT * FCl);
      s.mlp.gelu = take(BT * F);
    }
    s.out = take(R * C);  // every layer keeps its output: the next layer's input
    return s;
  };
  // A mixture-of-experts layer's saved set (its int32 buffers in float-sized slots), instead of
  // the MLP's.
  const layers::MoeConfig moe = moe_config(cfg, shard.ep_size);
  const std::int64_t E = moe.num_experts, K = moe.router.topk, MR = E > 0 ? moe.max_rows(BT) : 0;
  const std::int64_t RL = E > 0 ? moe.max_local_rows(BT) : 0;  // the rows this rank's experts run
  const bool ep = shard.ep_size > 1;
  const std::int64_t MF = moe.ffn / tp, MFC = cfg.swiglu ? 2 * MF : MF;  // this rank's slice
  const std::int64_t SF = E > 0 ? moe.shared_ffn / tp : 0, SFC = cfg.swiglu ? 2 * SF : SF;
  auto ints = [&](std::int64_t n) { return reinterpret_cast<std::int32_t*>(take(n)); };
  auto moe_saved = [&](layers::BlockSaved& s) {
    s.moe = {.logits = take(BT * E),
             .scores = take(BT * E),
             .experts = ints(BT * K),
             .weights = take(BT * K),
             .lse = take(BT),
             .rows_of = ints(BT * K),
             .sources = ints(MR),
             .counts = ints(E),
             .x_perm = take(MR * C),
             .x_loc = ep ? take(RL * C) : nullptr,
             .fc = take(RL * MFC),
             .act = take(RL * MF),
             .y_perm = take(MR * C),
             .shared = {.fc = SF > 0 ? take(BT * SFC) : nullptr,
                        .gelu = SF > 0 ? take(BT * SF) : nullptr},
             .shared_out = SF > 0 ? take(R * C) : nullptr,
             .shared_logits = moe.shared_gate ? take(R) : nullptr};
  };
  // A kept MoE layer: block_saved's set with the MoE layer's buffers instead of the MLP's.
  auto layer_saved = [&](bool keep, std::int64_t global) {
    if (!keep || !cfg.moe_layer(global)) return block_saved(keep);
    layers::BlockSaved s{};
    s.norm1 = norm_saved();
    s.attention.qkv = take(BT * 3 * Cl);
    s.attention.probs = unfused && !selective ? take(B * NH * T * T) : nullptr;
    s.attention.lse = unfused ? nullptr : take(B * NH * T);
    s.attention.attn = take(BT * Cl);
    s.attention.attn_seq = ulysses ? take(BT * Cl) : nullptr;
    s.resid2 = take(R * C);
    s.norm2 = norm_saved();
    moe_saved(s);
    s.out = take(R * C);
    return s;
  };
  bool any_full = false;
  for (std::int64_t l = 0; l < shard.layers(cfg); ++l) {
    const bool full = cfg.recomputes(l);
    any_full = any_full || full;
    layers::BlockSaved s = layer_saved(!full, shard.first_layer + l);
    if (acts) acts->layers.push_back(s);
  }
  if (any_full) {
    a.scratch = block_saved(true);
    if (E > 0) moe_saved(a.scratch);  // the scratch serves MoE and dense layers alike
  }
  if (E > 0) {
    layers::Workspace& ws = a.ws;
    ws.moe_d_weights = take(BT * K);
    ws.moe_d_logits = take(BT * E);
    ws.moe_d_perm = take(MR * C);
    ws.moe_d_fc = take(RL * MFC);
    ws.moe_d_act = take(RL * MF);
    ws.moe_d_aux = take(B * E);
    ws.moe_ep_a = ep ? take(RL * C) : nullptr;
    ws.moe_ep_b = ep ? take(RL * C) : nullptr;
    ws.moe_d_shared_in = SF > 0 ? take(R * C) : nullptr;
    ws.moe_d_shared_out = moe.shared_gate ? take(R * C) : nullptr;
    ws.moe_d_shared_logits = moe.shared_gate ? take(R) : nullptr;
  }
  layers::Workspace& ws = a.ws;
  ws.probs = selective ? take(B * NH * T * T) : nullptr;
  // The head's logits rows: all of them, or one chunk (the chunked head's d_norm replaces them).
  const std::int64_t head_rows = cfg.loss_chunk_rows > 0 ? std::min(cfg.loss_chunk_rows, BT) : BT;
  if (shard.has_head) {
    a.head.norm = norm_saved();
    a.head.logits = take(head_rows * Vl);
    a.logits = cfg.loss_chunk_rows > 0 ? nullptr : a.head.logits;
    a.head.losses = take(BT);
    a.head.row_stats = take(3 * head_rows);
    a.head.d_norm = cfg.loss_chunk_rows > 0 ? take(BT * C) : nullptr;
  }
  ws.gathered = take(BT * C);
  ws.d_full = take(BT * C);
  const std::int64_t fused_bytes = k::bias_gelu_backward_scratch_bytes(BT, F);
  // 8-byte aligned (arena allocations are 64-byte aligned).
  ws.fused_scratch = {reinterpret_cast<std::byte*>(take((fused_bytes + 7) / 4 + 2)),
                      static_cast<std::size_t>(fused_bytes)};
  const std::int64_t norm_bytes = k::residual_layernorm_backward_scratch_bytes(R, C);
  ws.norm_scratch = {reinterpret_cast<std::byte*>(take((norm_bytes + 7) / 4 + 2)),
                     static_cast<std::size_t>(norm_bytes)};
  ws.d_drop = take(BT * C);
  if (shard.has_embedding && cfg.embed_layernorm) {
    a.embedding.raw = take(R * C);
    a.embedding.norm = {a.encoded, take(R), take(R)};
  }
  a.d_x = take(BT * C);
  ws.d_ln = take(BT * C);
  ws.d_attn = take(BT * Cl);
  ws.d_qkv = take(BT * 3 * Cl);
  ws.d_fc = take(BT * std::max(FCl, SFC));  // the dense MLP's, or the shared experts'
  ws.qkv_grouped = grouped ? take(BT * Ql) : nullptr;
  ws.d_act = cfg.swiglu ? take(BT * std::max(F, SF)) : nullptr;
  ws.d_probs = unfused ? take(B * NH * T * T) : nullptr;
  if (cfg.documents()) {  // int32 per token, in float-sized slots
    a.positions = reinterpret_cast<std::int32_t*>(take(BT));
    a.docs = reinterpret_cast<std::int32_t*>(take(BT));
  }
  layout_sequence_split(cfg, shard, B, T, take, a);
  if (stage_reads_tokens(cfg, shard)) {  // the micro-batch's tokens and labels, staged in
    a.tokens = reinterpret_cast<std::int32_t*>(take(BT));
    a.labels = reinterpret_cast<std::int32_t*>(take(BT));
  }
  // The constant tables the attention reads, on the activations' device (make_activations).
  if (cfg.position_embedding == PositionEmbedding::kAlibi) a.alibi = take(cfg.num_attention_heads);
  if (cfg.position_embedding == PositionEmbedding::kRope) a.inv_freq = take(cfg.head_dim() / 2);
  if (bf16) {
    // The widest matmul input and output of the shard, in bf16 (two per float), and the largest
    // oneDNN workspace any of its matmuls needs. The output layer's (head_rows, Vl) counts only
    // on the head's stage; with experts their grouped matmuls (all RL rows of the local experts
    // at once), the router's and the shared experts' matmuls count too.
    const std::int64_t in_rows = std::max(BT * std::max({C, F, SF}), RL * std::max(C, MF));
    const std::int64_t dout =
        std::max({BT * std::max({3 * Cl, Ql, C, FCl, E, SFC}), RL * std::max(MFC, C),
                  shard.has_head ? head_rows * Vl : 0});
    ws.bf16_in = reinterpret_cast<core::bf16*>(take((in_rows + 1) / 2));
    ws.bf16_dout = reinterpret_cast<core::bf16*>(take((dout + 1) / 2));
    std::vector<std::array<std::int64_t, 3>> products = {
        {BT, C, Ql}, {BT, Cl, C}, {BT, C, FCl}, {BT, F, C}};
    if (E > 0) {
      products.insert(products.end(), {{BT, C, E}, {BT, C, SFC}, {BT, SF, C}, {BT, C, 1}});
    }
    if (shard.has_head) products.push_back({head_rows, C, Vl});
    std::int64_t bytes = bf16_scratch_bytes(products);
    if (E > 0) {  // the experts' grouped matmuls (kernels/grouped_linear.h)
      const core::ExecContext cpu;
      bytes = std::max({bytes, k::grouped_linear_bf16_scratch_bytes(cpu, C, MFC),
                        k::grouped_linear_bf16_scratch_bytes(cpu, MF, C)});
    }
    ws.gemm_scratch = {reinterpret_cast<std::byte*>(take((bytes + 3) / 4)),
                       static_cast<std::size_t>(bytes)};
  }
}

}  // namespace

std::vector<float> rotary_inv_freq(const ModelConfig& cfg) {
  // As transformers (LlamaRotaryEmbedding, _compute_llama3_parameters): in FP32,
  // inv_freq[i] = 1 / base^(2i / HS), then Llama 3's scaling by wavelength.
  const std::int64_t HS = cfg.head_dim();
  std::vector<float> f(static_cast<std::size_t>(HS / 2));
  for (std::size_t i = 0; i < f.size(); ++i) {
    const float e = static_cast<float>(2 * static_cast<std::int64_t>(i)) / static_cast<float>(HS);
    f[i] = 1.0f / std::pow(static_cast<float>(cfg.rotary_base), e);
  }
  if (!cfg.rope_scaling) return f;
  const auto factor = static_cast<float>(cfg.rope_scaling_factor);
  const auto lo = static_cast<float>(cfg.rope_low_freq_factor);
  const auto hi = static_cast<float>(cfg.rope_high_freq_factor);
  const float old_len = static_cast<float>(cfg.rope_original_max_positions);
  const float low_wavelen = old_len / lo, high_wavelen = old_len / hi;
  for (float& x : f) {
    const float wavelen = 2.0f * static_cast<float>(M_PI) / x;
    const float scaled = wavelen > low_wavelen ? x / factor : x;
    const float smooth = (old_len / wavelen - lo) / (hi - lo);
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    x = medium ? (1.0f - smooth) * scaled / factor + smooth * scaled : scaled;
  }
  return f;
}

std::int64_t activation_bytes(const ModelConfig& cfg, const ModelShard& shard, std::int64_t batch,
                              std::int64_t seq_len) {
  return activation_bytes(cfg, shard, batch, seq_len, false);
}

void make_activations(const ModelConfig& cfg, const ModelShard& shard, std::int64_t batch,
                      std::int64_t seq_len, GptActivations& acts) {
  make_activations(cfg, shard, batch, seq_len, false, acts);
}

std::int64_t activation_bytes(const ModelConfig& cfg, const ModelShard& shard, std::int64_t batch,
                              std::int64_t seq_len, bool bf16) {
  std::int64_t bytes = 0;
  layout_activations(
      cfg, shard, batch, seq_len, bf16,
      [&](std::int64_t n) -> float* {
        bytes += core::Arena::footprint(core::DType::kF32, {n});
        return nullptr;
      },
      nullptr);
  return bytes;
}

void make_activations(const ModelConfig& cfg, const ModelShard& shard, std::int64_t batch,
                      std::int64_t seq_len, bool bf16, GptActivations& acts,
                      const core::ExecContext& ctx) {
  acts = GptActivations{};
  acts.batch = batch;
  acts.seq_len = seq_len;
  acts.arena = core::Arena(activation_bytes(cfg, shard, batch, seq_len, bf16), k::memory_for(ctx));
  layout_activations(
      cfg, shard, batch, seq_len, bf16,
      [&](std::int64_t n) { return acts.arena.alloc(core::DType::kF32, {n}).as<float>(); }, &acts);
  // The tables, computed once on the host and copied in (the copy is staged before it returns).
  if (acts.alibi != nullptr) {
    std::vector<float> slopes(static_cast<std::size_t>(cfg.num_attention_heads));
    k::alibi_slopes(cfg.num_attention_heads, slopes.data());
    k::copy_to_device(ctx, acts.alibi, slopes.data(),
                      static_cast<std::int64_t>(slopes.size() * sizeof(float)));
  }
  if (acts.inv_freq != nullptr) {
    const std::vector<float> f = rotary_inv_freq(cfg);
    k::copy_to_device(ctx, acts.inv_freq, f.data(),
                      static_cast<std::int64_t>(f.size() * sizeof(float)));
  }
  if (acts.cp_positions != nullptr) {
    const std::int64_t T = seq_len * shard.cp_size, BT = batch * seq_len;
    std::vector<std::int32_t> all(static_cast<std::size_t>(T)), rows(static_cast<std::size_t>(BT));
    for (std::int64_t t = 0; t < T; ++t) all[static_cast<std::size_t>(t)] = static_cast<int>(t);
    for (std::int64_t r = 0; r < BT; ++r) {
      rows[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(
          layers::cp_row_position(shard.cp_size, shard.cp_rank, batch, seq_len, r));
    }
    k::copy_to_device(ctx, acts.cp_positions, all.data(), T * 4);
    k::copy_to_device(ctx, acts.positions, rows.data(), BT * 4);
  }
}

namespace {

// The layer configurations of the model (gpt_layers) with their constant tables.
struct Architecture : GptLayers {
  std::vector<float> alibi;     // slopes of every head (ALiBi), or empty
  std::vector<float> inv_freq;  // rotary inverse frequencies (head_dim / 2), or empty

  // alibi_table / inv_freq_table: the tables on the activations' device (GptActivations), or null
  // to compute them here on the host.
  Architecture(const ModelConfig& cfg, const ModelShard& shard, int tp_rank,
               const float* alibi_table, const float* inv_freq_table)
      : GptLayers(gpt_layers(cfg, shard)) {
    const float* slopes = alibi_table;
    if (cfg.position_embedding == PositionEmbedding::kAlibi && slopes == nullptr) {
      alibi.resize(static_cast<std::size_t>(cfg.num_attention_heads));
      k::alibi_slopes(cfg.num_attention_heads, alibi.data());
      slopes = alibi.data();
    }
    const float* freqs = inv_freq_table;
    if (cfg.position_embedding == PositionEmbedding::kRope && freqs == nullptr) {
      inv_freq = rotary_inv_freq(cfg);
      freqs = inv_freq.data();
    }
    if (cfg.position_embedding != PositionEmbedding::kAlibi) slopes = nullptr;
    if (cfg.position_embedding != PositionEmbedding::kRope) freqs = nullptr;
    const std::int64_t local_heads = cfg.num_attention_heads / shard.tp_size;
    block.attention.alibi = slopes == nullptr ? nullptr : slopes + tp_rank * local_heads;
    block.attention.expand_qkv = expands_qkv(cfg);
    block.attention.inv_freq = freqs;
  }
};

// One call of the model on one micro-batch: the architecture, the tp region, the layer context
// and the runtime's per-layer weights and hooks.
struct Transformer {
  const ModelConfig& cfg;
  const ModelRuntime& rt;
  const GptParams& p;
  GptActivations& a;
  Architecture arch;
  parallel::TpRegion region;
  layers::LayerContext lc;

  Transformer(const core::ExecContext& ctx, const ModelConfig& cfg_, const ModelRuntime& rt_,
              const GptParams& p_, GptActivations& a_)
      : cfg(cfg_),
        rt(rt_),
        p(p_),
        a(a_),
        arch(cfg_, rt_.shard, tp_rank_of(rt_), a_.alibi, a_.inv_freq),
        region(tp_group_of(rt_), rt_.shard.sequence_parallel, a_.batch * a_.seq_len,
               cfg_.hidden_size),
        lc{.ctx = ctx,
           .region = region,
           .ws = a_.ws,
           .batch = a_.batch,
           .seq_len = a_.seq_len,
           .dropout = {.hidden_p =
                           a_.inputs.training ? static_cast<float>(cfg_.hidden_dropout) : 0.0f,
                       .attention_p =
                           a_.inputs.training ? static_cast<float>(cfg_.attention_dropout) : 0.0f,
                       .seed = rt_.dropout_seed,
                       .iteration = a_.inputs.iteration,
                       .first_sample = a_.inputs.first_sample},
           .positions =
               cfg_.reset_position_ids || a_.cp_positions != nullptr ? a_.positions : nullptr,
           .docs = cfg_.reset_attention_mask ? a_.docs : nullptr,
           .aux_loss_scale = rt_.moe_aux_loss_scale,
           .ep = rt_.ep,
           .ep_host = rt_.ep_host,
           .cp = rt_.cp,
           .cp_positions = a_.cp_positions,
           .ulysses = rt_.shard.ulysses} {
    TRIDENT_ASSERT(tp_size_of(rt) == rt.shard.tp_size, "tp group of ", tp_size_of(rt),
                   " ranks for a shard of ", rt.shard.tp_size);
    TRIDENT_ASSERT((rt.cp == nullptr ? 1 : rt.cp->size()) == rt.shard.cp_size, "cp group of ",
                   rt.cp == nullptr ? 1 : rt.cp->size(), " ranks for a shard of ",
                   rt.shard.cp_size);
    TRIDENT_ASSERT(region.local_rows() == a.stage_rows, "activations laid out for ", a.stage_rows,
                   " rows, not ", region.local_rows());
  }

  std::int64_t layers() const { return static_cast<std::int64_t>(a.layers.size()); }
  std::int64_t global(std::int64_t l) const { return rt.shard.first_layer + l; }
  const float* input_of(std::int64_t l) const {
    return l > 0 ? a.layers[static_cast<std::size_t>(l - 1)].out : a.encoded;
  }
  // Layer l's weights: from the runtime's provider (asked right before the layer runs), else the
  // views.
  LayerWeights resident(std::int64_t l) const { return {&p.layers[static_cast<std::size_t>(l)]}; }
  LayerWeights forward_weights(std::int64_t l) const {
    return rt.layer_weights ? rt.layer_weights->forward(l) : resident(l);
  }
  LayerBackwardWeights backward_weights(std::int64_t l, const GptGrads& g) const {
    return rt.layer_weights
               ? rt.layer_weights->backward(l)
               : LayerBackwardWeights{resident(l), &g.layers[static_cast<std::size_t>(l)]};
  }
  // Where layer l's forward writes: its saved set, or the scratch set (full recomputation keeps
  // only the output).
  layers::BlockSaved saved_for_forward(std::int64_t l) const {
    const layers::BlockSaved& s = a.layers[static_cast<std::size_t>(l)];
    if (!cfg.recomputes(l)) return s;
    layers::BlockSaved sc = a.scratch;
    sc.out = s.out;
    return sc;
  }
};

}  // namespace

void gpt_forward(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const GptParams& p, const ForwardInputs& in, GptActivations& a) {
  gpt_forward(ctx, cfg, rt, p, in, a, KvCacheForward{});
}

bool stage_reads_tokens(const ModelConfig& cfg, const ModelShard& shard) {
  return shard.has_embedding || shard.has_head || cfg.documents();
}

void gpt_forward(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const GptParams& p, const ForwardInputs& in, GptActivations& a,
                 const KvCacheForward& kv) {
  a.inputs = in;
  const std::int32_t* tokens = in.tokens;
  if (cfg.documents()) {
    TRIDENT_CHECK(kv.caches.empty(),
                  "--reset-position-ids / --reset-attention-mask are for training, not generation");
    TRIDENT_CHECK(cfg.eod_token >= 0,
                  "--reset-position-ids / --reset-attention-mask need the "
                  "tokenizer's end-of-document token");
    const core::Shape bt{a.batch, a.seq_len};
    k::document_ids(ctx, {.positions = core::view(a.positions, bt, ctx.device),
                          .docs = core::view(a.docs, bt, ctx.device),
                          .tokens = core::view(tokens, bt, ctx.device),
                          .eod_token = cfg.eod_token});
  }
  const Transformer m(ctx, cfg, rt, p, a);
  const std::int64_t C = cfg.hidden_size;
  TRIDENT_ASSERT(kv.caches.empty() || std::ssize(kv.caches) == m.layers(), "KV caches for ",
                 kv.caches.size(), " layers, the shard has ", m.layers());
  if (rt.shard.has_embedding) {
    layers::embedding_forward(
        m.lc, m.arch.embedding, p.embedding,
        {.out = a.encoded, .tokens = tokens, .position = kv.position, .saved = a.embedding});
    layers::dropout_forward(m.lc, a.encoded, C, -1, layers::DropSite::kEmbedding);
  }
  a.moe_stats.assign(static_cast<std::size_t>(m.layers()), layers::MoeStats{});
  for (std::int64_t l = 0; l < m.layers(); ++l) {
    const auto i = static_cast<std::size_t>(l);
    const layers::KvCache* cache = kv.caches.empty() ? nullptr : &kv.caches[i];
    layers::block_forward(m.lc, m.arch.block, *m.forward_weights(l).params,
                          {.x = m.input_of(l),
                           .layer = m.global(l),
                           .saved = m.saved_for_forward(l),
                           .cache = cache,
                           .moe_stats = cfg.moe_layer(m.global(l)) ? &a.moe_stats[i] : nullptr});
  }
  if (rt.shard.has_head) {
    layers::lm_head_forward(m.lc, m.arch.head, p.head, {.in = a.output(), .saved = a.head});
  }
}

LossSum gpt_loss(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const std::int32_t* targets, float d_scale, LossGrad grad, GptActivations& a) {
  TRIDENT_ASSERT(cfg.loss_chunk_rows == 0,
                 "gpt_loss without the weights on a chunked head (--loss-chunk-rows)");
  return gpt_loss(ctx, cfg, rt, GptParams{}, GptGrads{}, targets, d_scale, grad, a);
}

LossSum gpt_loss(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const GptParams& p, const GptGrads& g, const std::int32_t* targets, float d_scale,
                 LossGrad grad, GptActivations& a) {
  TRIDENT_ASSERT(rt.shard.has_head, "gpt_loss on a pipeline stage without the output layer");
  const Transformer m(ctx, cfg, rt, p, a);
  const bool with_grad = grad == LossGrad::kCompute;
  const layers::TokenLoss l =
      cfg.loss_chunk_rows > 0 ? layers::lm_head_chunked_loss(m.lc, m.arch.head, p.head,
                                                             {.targets = targets,
                                                              .with_grad = with_grad,
                                                              .d_scale = d_scale,
                                                              .device_sum = rt.loss_sum_on_device,
                                                              .saved = a.head,
                                                              .d_out_w = g.head.out_w})
                              : layers::lm_head_loss(m.lc, m.arch.head,
                                                     {.targets = targets,
                                                      .with_grad = with_grad,
                                                      .d_scale = d_scale,
                                                      .device_sum = rt.loss_sum_on_device,
                                                      .saved = a.head});
  return {.sum = l.sum, .count = l.count};
}

void gpt_backward(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                  const GptParams& p, const GptGrads& g, const std::int32_t* tokens,
                  GptActivations& a) {
  const Transformer m(ctx, cfg, rt, p, a);
  if (rt.shard.has_head) {
    layers::lm_head_backward(m.lc, m.arch.head, p.head,
                             {.d_in = a.d_x, .in = a.output(), .saved = a.head, .grads = g.head});
  }
  // d_x holds the gradient of the residual stream at the top (this rank's rows): walk down.
  for (std::int64_t l = m.layers() - 1; l >= 0; --l) {
    const LayerBackwardWeights lw = m.backward_weights(l, g);
    const layers::BlockParams& w = *lw.weights.params;
    layers::BlockSaved s = a.layers[static_cast<std::size_t>(l)];
    if (cfg.recomputes(l)) {  // full recomputation: the same forward (same masks) into scratch
      s = a.scratch;
      layers::block_forward(m.lc, m.arch.block, w,
                            {.x = m.input_of(l), .layer = m.global(l), .saved = s});
    }
    layers::block_backward(
        m.lc, m.arch.block, w,
        {.d_x = a.d_x, .x = m.input_of(l), .layer = m.global(l), .saved = s, .grads = *lw.grads});
    if (rt.layer_weights) rt.layer_weights->backward_done(l);
  }
  if (rt.shard.has_embedding) {
    const float* d =
        layers::dropout_backward(m.lc, a.d_x, cfg.hidden_size, -1, layers::DropSite::kEmbedding);
    layers::embedding_backward(
        m.lc, m.arch.embedding, p.embedding,
        {.d_out = d, .tokens = tokens, .saved = a.embedding, .grads = g.embedding});
  }
}

}  // namespace trident::model
