#include "trident/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "trident/core/error.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"

namespace trident::model {

namespace k = trident::kernels;

namespace {

template <class P, class Locate>
GptTensors<P> views(const ModelConfig& cfg, const ParamTable& table, const Locate& locate) {
  auto at = [&](const std::string& name) -> P { return locate(table.find(name).offset); };
  auto has = [&](const std::string& name) {
    for (const ParamSpec& p : table.params)
      if (p.name == name) return true;
    return false;
  };
  GptTensors<P> t;
  if (has("embedding.word_embeddings.weight")) t.wte = at("embedding.word_embeddings.weight");
  if (has("embedding.position_embeddings.weight")) {
    t.wpe = at("embedding.position_embeddings.weight");
  }
  if (has("embedding.word_embeddings_layernorm.weight")) {
    t.emb_ln_w = at("embedding.word_embeddings_layernorm.weight");
    t.emb_ln_b = at("embedding.word_embeddings_layernorm.bias");
  }
  std::int64_t first = -1, last = -1;
  for (const ParamSpec& p : table.params) {
    if (p.layer < 0) continue;
    if (first < 0) first = p.layer;
    last = p.layer;
  }
  for (std::int64_t l = first; first >= 0 && l <= last; ++l) {
    const std::string p = core::str("layers.", l, ".");
    LayerTensors<P> lt;
    lt.ln1_w = at(p + "input_layernorm.weight");
    lt.ln1_b = at(p + "input_layernorm.bias");
    lt.qkv_w = at(p + "self_attention.query_key_value.weight");
    lt.qkv_b = at(p + "self_attention.query_key_value.bias");
    lt.proj_w = at(p + "self_attention.dense.weight");
    lt.proj_b = at(p + "self_attention.dense.bias");
    lt.ln2_w = at(p + "post_attention_layernorm.weight");
    lt.ln2_b = at(p + "post_attention_layernorm.bias");
    lt.fc_w = at(p + "mlp.dense_h_to_4h.weight");
    lt.fc_b = at(p + "mlp.dense_h_to_4h.bias");
    lt.fc2_w = at(p + "mlp.dense_4h_to_h.weight");
    lt.fc2_b = at(p + "mlp.dense_4h_to_h.bias");
    t.layers.push_back(lt);
  }
  if (has("final_layernorm.weight")) {
    t.lnf_w = at("final_layernorm.weight");
    t.lnf_b = at("final_layernorm.bias");
  }
  (void)cfg;
  return t;
}

int tp_size_of(const ModelRuntime& rt) { return rt.tp ? rt.tp->size() : 1; }
int tp_rank_of(const ModelRuntime& rt) { return rt.tp ? rt.tp->rank() : 0; }

void call(const std::function<void(std::int64_t)>& hook, std::int64_t layer) {
  if (hook) hook(layer);
}

// The activation layout, shared by the size computation and the allocation so they never drift.
template <class Alloc>
void layout_activations(const ModelConfig& cfg, const ModelShard& shard, std::int64_t B,
                        std::int64_t T, bool bf16, Alloc&& alloc, GptActivations* acts) {
  const std::int64_t tp = shard.tp_size;
  const std::int64_t BT = B * T, C = cfg.hidden_size, F = cfg.ffn() / tp;
  const std::int64_t NH = cfg.num_attention_heads / tp, Cl = C / tp;
  const std::int64_t Vl = cfg.padded_vocab_size(tp) / tp;
  const std::int64_t R = shard.sequence_parallel ? BT / tp : BT;  // residual-stream rows
  auto take = [&](std::int64_t n) { return alloc(n); };
  float* encoded = take(R * C);
  if (acts) {
    acts->encoded = encoded;
    acts->stage_rows = R;
  }
  const bool unfused = !cfg.flash_attention();
  const bool selective = cfg.recompute == Recompute::kSelective && unfused;
  auto layer_buffers = [&](bool keep) {
    LayerActivations la{};
    if (keep) {
      la.ln1 = take(R * C);
      la.ln1_mean = take(R);
      la.ln1_rstd = take(R);
      la.qkv = take(BT * 3 * Cl);
      la.probs = unfused && !selective ? take(B * NH * T * T) : nullptr;
      la.lse = unfused ? nullptr : take(B * NH * T);
      la.attn = take(BT * Cl);
      la.resid2 = take(R * C);
      la.ln2 = take(R * C);
      la.ln2_mean = take(R);
      la.ln2_rstd = take(R);
      la.fc = take(BT * F);
      la.gelu = take(BT * F);
    }
    la.out = take(R * C);  // every layer keeps its output: the next layer's input
    return la;
  };
  bool any_full = false;
  for (std::int64_t l = 0; l < shard.layers(cfg); ++l) {
    const bool full = cfg.recomputes(l);
    any_full = any_full || full;
    LayerActivations la = layer_buffers(!full);
    if (acts) acts->layers.push_back(la);
  }
  if (any_full) {
    LayerActivations sc = layer_buffers(true);
    if (acts) acts->scratch = sc;
  }
  float* scratch_probs = selective ? take(B * NH * T * T) : nullptr;
  if (acts) acts->scratch_probs = scratch_probs;
  const bool head = shard.has_head;
  float* lnf = head ? take(R * C) : nullptr;
  float* lnf_mean = head ? take(R) : nullptr;
  float* lnf_rstd = head ? take(R) : nullptr;
  float* logits = head ? take(BT * Vl) : nullptr;
  float* losses = head ? take(BT) : nullptr;
  float* row_stats = head ? take(3 * BT) : nullptr;
  float* gathered = take(BT * C);
  float* d_full = take(BT * C);
  const std::int64_t fused_bytes = k::bias_gelu_backward_scratch_bytes(BT, F);
  float* fused = take((fused_bytes + 7) / 4 + 2);
  float* d_drop = take(BT * C);
  const bool emb_ln = shard.has_embedding && cfg.embed_layernorm;
  float* emb_raw = emb_ln ? take(R * C) : nullptr;
  float* emb_mean = emb_ln ? take(R) : nullptr;
  float* emb_rstd = emb_ln ? take(R) : nullptr;
  float* d_x = take(BT * C);
  float* d_ln = take(BT * C);
  float* d_attn = take(BT * Cl);
  float* d_qkv = take(BT * 3 * Cl);
  float* d_fc = take(BT * F);
  float* d_probs = unfused ? take(B * NH * T * T) : nullptr;
  if (bf16) {
    // The widest matmul input and output of the shard, in bf16 (two per float), and the largest
    // oneDNN workspace any of its matmuls needs.
    const std::int64_t widest_in = std::max(C, F);
    const std::int64_t widest_out = std::max({3 * Cl, C, F, Vl});
    float* in16 = take((BT * widest_in + 1) / 2);
    float* dout16 = take((BT * widest_out + 1) / 2);
    const core::ExecContext ctx;
    std::int64_t ws = 0;
    for (auto [in, out] : {std::pair{C, 3 * Cl}, std::pair{Cl, C}, std::pair{C, F}, std::pair{F, C},
                           std::pair{C, Vl}}) {
      ws = std::max(ws, k::linear_bf16_scratch_bytes(ctx, BT, in, out));
    }
    float* scratch = take((ws + 3) / 4);
    if (acts) {
      acts->bf16_in = reinterpret_cast<core::bf16*>(in16);
      acts->bf16_dout = reinterpret_cast<core::bf16*>(dout16);
      acts->gemm_scratch = {reinterpret_cast<std::byte*>(scratch), static_cast<std::size_t>(ws)};
    }
  }
  if (acts) {
    acts->lnf = lnf;
    acts->lnf_mean = lnf_mean;
    acts->lnf_rstd = lnf_rstd;
    acts->logits = logits;
    acts->losses = losses;
    acts->row_stats = row_stats;
    acts->gathered = gathered;
    acts->d_full = d_full;
    // 8-byte aligned (arena allocations are 64-byte aligned).
    acts->fused_scratch = {reinterpret_cast<std::byte*>(fused),
                           static_cast<std::size_t>(fused_bytes)};
    acts->d_drop = d_drop;
    acts->emb_raw = emb_raw;
    acts->emb_mean = emb_mean;
    acts->emb_rstd = emb_rstd;
    acts->d_x = d_x;
    acts->d_ln = d_ln;
    acts->d_attn = d_attn;
    acts->d_qkv = d_qkv;
    acts->d_fc = d_fc;
    acts->d_probs = d_probs;
  }
}

// Vocab-parallel softmax cross-entropy: this rank holds logit columns [start, start + Vl) of the
// padded vocabulary; columns >= vocab are padding. Three reductions over tp (max, sum of exp,
// target logit) give every rank the loss without gathering the logits.
void vocab_parallel_cross_entropy(const ModelRuntime& rt, std::int64_t rows, std::int64_t vocab,
                                  std::int64_t Vl, const std::int32_t* targets, float d_scale,
                                  LossGrad grad, GptActivations& a) {
  const std::int64_t start = static_cast<std::int64_t>(tp_rank_of(rt)) * Vl;
  const std::int64_t real = std::clamp<std::int64_t>(vocab - start, 0, Vl);  // real local columns
  float* row_max = a.row_stats;
  float* sum_target = a.row_stats + rows;  // (2, rows): sum of exp, then target logit
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* l = a.logits + r * Vl;
    float m = -INFINITY;
    for (std::int64_t j = 0; j < real; ++j) m = std::max(m, l[j]);
    row_max[r] = m;
  }
  rt.tp->all_reduce(row_max, rows, comm::Datatype::kF32, comm::ReduceOp::kMax);
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* l = a.logits + r * Vl;
    double s = 0;
    for (std::int64_t j = 0; j < real; ++j) s += std::exp(static_cast<double>(l[j] - row_max[r]));
    sum_target[r] = static_cast<float>(s);
    const std::int64_t t = targets[r] - start;
    sum_target[rows + r] = (targets[r] >= 0 && t >= 0 && t < real) ? l[t] : 0.0f;
  }
  rt.tp->all_reduce(sum_target, 2 * rows, comm::Datatype::kF32, comm::ReduceOp::kSum);
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const bool ignored = targets[r] < 0;
    TRIDENT_ASSERT(targets[r] < vocab, "target ", targets[r], " is outside the vocabulary");
    const float lse = std::log(sum_target[r]) + row_max[r];
    a.losses[r] = ignored ? 0.0f : lse - sum_target[rows + r];
    if (grad == LossGrad::kNone) continue;
    float* d = a.logits + r * Vl;
    const float inv_sum = 1.0f / sum_target[r];
    for (std::int64_t j = 0; j < Vl; ++j) {
      if (ignored || j >= real) {
        d[j] = 0.0f;
        continue;
      }
      const float p = std::exp(d[j] - row_max[r]) * inv_sum;
      d[j] = d_scale * (p - (start + j == targets[r] ? 1.0f : 0.0f));
    }
  }
}

}  // namespace

GptParamsBf16 gpt_param_views_bf16(const ModelConfig& cfg, const ParamTable& table,
                                   const core::bf16* flat) {
  return views<const core::bf16*>(cfg, table,
                                  [flat](std::int64_t offset) { return flat + offset; });
}

GptParamsBf16 gpt_param_views_bf16(const ModelConfig& cfg, const ParamTable& table,
                                   const std::function<const core::bf16*(std::int64_t)>& locate) {
  return views<const core::bf16*>(cfg, table, locate);
}

GptParams gpt_param_views(const ModelConfig& cfg, const ParamTable& table, const float* flat) {
  return views<const float*>(cfg, table, [flat](std::int64_t offset) { return flat + offset; });
}
GptGrads gpt_grad_views(const ModelConfig& cfg, const ParamTable& table, float* flat) {
  return views<float*>(cfg, table, [flat](std::int64_t offset) { return flat + offset; });
}
GptParams gpt_param_views(const ModelConfig& cfg, const ParamTable& table,
                          const std::function<const float*(std::int64_t offset)>& locate) {
  return views<const float*>(cfg, table, locate);
}
GptGrads gpt_grad_views(const ModelConfig& cfg, const ParamTable& table,
                        const std::function<float*(std::int64_t offset)>& locate) {
  return views<float*>(cfg, table, locate);
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
                      std::int64_t seq_len, bool bf16, GptActivations& acts) {
  acts = GptActivations{};
  acts.batch = batch;
  acts.seq_len = seq_len;
  acts.arena = core::Arena(activation_bytes(cfg, shard, batch, seq_len, bf16));
  layout_activations(
      cfg, shard, batch, seq_len, bf16,
      [&](std::int64_t n) { return acts.arena.alloc(core::DType::kF32, {n}).as<float>(); }, &acts);
}

namespace {

// Megatron's conjugate communication pairs around a tensor-parallel region. Without sequence
// parallelism the residual stream is replicated on every tp rank; with it, each rank holds a
// contiguous block of the B*T rows.
class TpRegion {
 public:
  TpRegion(const ModelRuntime& rt, std::int64_t rows, std::int64_t cols)
      : tp_(rt.tp && rt.tp->size() > 1 ? rt.tp : nullptr),
        sp_(tp_ != nullptr && rt.shard.sequence_parallel),
        rows_(rows),
        cols_(cols),
        traffic_(rt.tp_traffic) {}
  bool sp() const { return sp_; }
  std::int64_t local_rows() const { return sp_ ? rows_ / tp_->size() : rows_; }

  // Entering (forward): without SP the identity (f); with SP an all-gather of the local rows
  // into `full` (B*T rows). Returns the full-rows input of the column-parallel layer.
  const float* enter(const float* local, float* full) const {
    if (!sp_) return local;
    count(&TpTraffic::all_gathers, 1.0);
    tp_->all_gather(local, full, local_rows() * cols_, comm::Datatype::kF32);
    return full;
  }
  // Leaving (forward): the row-parallel layer left a partial sum over B*T rows in `partial`;
  // without SP all-reduce it in place (g, out == partial); with SP reduce-scatter this rank's rows
  // into `out`.
  void leave(float* partial, float* out) const {
    if (!tp_) return;
    if (!sp_) {
      count(&TpTraffic::all_reduces, 2.0);
      tp_->all_reduce(partial, rows_ * cols_, comm::Datatype::kF32, comm::ReduceOp::kSum);
    } else {
      count(&TpTraffic::reduce_scatters, 1.0);
      tp_->reduce_scatter(partial, out, local_rows() * cols_, comm::Datatype::kF32,
                          comm::ReduceOp::kSum);
    }
  }
  // Backward of leave: the gradient of the full rows (SP: all-gather; else the identity).
  const float* leave_backward(const float* d_local, float* d_full) const {
    return enter(d_local, d_full);
  }
  // Backward of enter: the column-parallel layer left a partial input gradient over B*T rows;
  // without SP all-reduce it in place; with SP reduce-scatter it. Returns the local rows'
  // gradient (inside `partial` in both cases).
  float* enter_backward(float* partial) const {
    if (!tp_) return partial;
    if (!sp_) {
      count(&TpTraffic::all_reduces, 2.0);
      tp_->all_reduce(partial, rows_ * cols_, comm::Datatype::kF32, comm::ReduceOp::kSum);
      return partial;
    }
    count(&TpTraffic::reduce_scatters, 1.0);
    float* mine = partial + static_cast<std::int64_t>(tp_->rank()) * local_rows() * cols_;
    tp_->reduce_scatter(partial, mine, local_rows() * cols_, comm::Datatype::kF32,
                        comm::ReduceOp::kSum);
    return mine;
  }

 private:
  // One collective over the full (rows x cols) buffer: ring bytes = factor (T-1)/T x 4 bytes each.
  void count(std::int64_t TpTraffic::*what, double factor) const {
    if (!traffic_) return;
    ++(traffic_->*what);
    const double t = tp_->size();
    traffic_->bytes += factor * (t - 1) / t * static_cast<double>(rows_ * cols_) * 4.0;
  }

  comm::Communicator* tp_;
  bool sp_;
  std::int64_t rows_, cols_;
  TpTraffic* traffic_;
};

enum class DropSite : std::uint64_t { kEmbedding = 1, kAttentionOut = 2, kMlpOut = 3, kProbs = 4 };

// The Philox stream of one dropout site in one iteration; the element index inside it is global
// (see dropout_rows), so masks do not depend on the parallel layout.
std::uint64_t drop_stream(std::int64_t iteration, std::int64_t layer, DropSite site) {
  return (static_cast<std::uint64_t>(iteration) << 24) ^
         (static_cast<std::uint64_t>(layer + 1) << 4) ^ static_cast<std::uint64_t>(site);
}

// dst = src * keep / (1 - p) over `rows` residual-stream rows whose first row is flattened token
// `row0` of the micro-batch (B*T rows); element (r, c) has global index
// ((first_sample * T + row0 + r) * cols + c). dst may alias src.
void dropout_rows(float* dst, const float* src, std::int64_t rows, std::int64_t cols,
                  std::int64_t global_row0, float p, std::uint64_t seed, std::uint64_t stream) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint64_t base = static_cast<std::uint64_t>((global_row0 + r) * cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      const bool keep = k::dropout_keep(seed, stream, base + static_cast<std::uint64_t>(c), p);
      dst[r * cols + c] = keep ? src[r * cols + c] * scale : 0.0f;
    }
  }
}

// The model's matmuls: FP32 (dnnl_sgemm), or with --bf16 BF16 operands (inputs converted here,
// weights from the BF16 copies) with FP32 accumulation and output.
struct Matmuls {
  const core::ExecContext& ctx;
  GptActivations& a;

  void forward(const k::LinearForwardArgs& args, const core::bf16* w16) const {
    if (w16 == nullptr) return k::linear_forward(ctx, args);
    k::convert_f32_to_bf16(ctx, a.bf16_in, args.in, args.rows * args.in_features);
    k::linear_forward_bf16(ctx, {.out = args.out,
                                 .in = a.bf16_in,
                                 .weight = w16,
                                 .bias = args.bias,
                                 .rows = args.rows,
                                 .in_features = args.in_features,
                                 .out_features = args.out_features,
                                 .scratch = a.gemm_scratch});
  }
  void backward(const k::LinearBackwardArgs& args, const core::bf16* w16) const {
    if (w16 == nullptr) return k::linear_backward(ctx, args);
    k::convert_f32_to_bf16(ctx, a.bf16_in, args.in, args.rows * args.in_features);
    k::convert_f32_to_bf16(ctx, a.bf16_dout, args.d_out, args.rows * args.out_features);
    k::linear_backward_bf16(ctx, {.d_in = args.d_in,
                                  .d_weight = args.d_weight,
                                  .d_bias = args.d_bias,
                                  .d_out = args.d_out,
                                  .d_out_bf16 = a.bf16_dout,
                                  .in = a.bf16_in,
                                  .weight = w16,
                                  .rows = args.rows,
                                  .in_features = args.in_features,
                                  .out_features = args.out_features,
                                  .scratch = a.gemm_scratch});
  }
};

// One transformer layer's forward, shared by gpt_forward and by recomputation in gpt_backward.
struct LayerForward {
  const core::ExecContext& ctx;
  const ModelConfig& cfg;
  const ModelRuntime& rt;
  GptActivations& a;
  const TpRegion& region;
  const float* alibi;  // this rank's ALiBi slopes, or null
  std::int64_t B, T, BT, C, F, NH, Cl, HS, R, row0;
  int tp_rank;

  // Row-parallel biases (and the position embedding) are added by tp rank 0 only, before the
  // reduction, so that the sum holds them once.
  const float* once(const float* bias) const { return tp_rank == 0 ? bias : nullptr; }
  // Where a row-parallel layer writes its partial sum: in place without SP, else the scratch.
  float* partial_of(float* out) const { return region.sp() ? a.gathered : out; }
  // Hidden dropout on this rank's residual-stream rows (global row = first_sample * T + row0 + r).
  void drop(float* x, std::int64_t layer, DropSite site) const {
    if (!rt.training || cfg.hidden_dropout <= 0.0f) return;
    dropout_rows(x, x, R, C, a.first_sample * T + row0, cfg.hidden_dropout, rt.dropout_seed,
                 drop_stream(a.iteration, layer, site));
  }
  k::AttentionDropout attention_dropout(std::int64_t layer) const {
    return {.p = rt.training ? cfg.attention_dropout : 0.0f,
            .seed = rt.dropout_seed,
            .stream = drop_stream(a.iteration, layer, DropSite::kProbs),
            .first_sample = a.first_sample,
            .head_offset = tp_rank * NH,
            .total_heads = cfg.num_attention_heads};
  }

  // Layer l (local index) from input x into the activations s (s.out is the output).
  void run(std::size_t l, const LayerTensors<const float*>& w, LayerActivations& s,
           const float* x) const {
    const float eps = cfg.layernorm_epsilon;
    const Matmuls mm{ctx, a};
    const LayerTensors<const core::bf16*>* w16 =
        rt.params_bf16 ? &rt.params_bf16->layers[l] : nullptr;
    const std::int64_t layer = rt.shard.first_layer + static_cast<std::int64_t>(l);
    k::layernorm_forward(ctx, {.out = s.ln1,
                               .mean = s.ln1_mean,
                               .rstd = s.ln1_rstd,
                               .in = x,
                               .weight = w.ln1_w,
                               .bias = w.ln1_b,
                               .rows = R,
                               .cols = C,
                               .eps = eps});
    const float* ln1 = region.enter(s.ln1, a.gathered);  // f (SP: all-gather)
    mm.forward({.out = s.qkv,
                .in = ln1,
                .weight = w.qkv_w,
                .bias = w.qkv_b,
                .rows = BT,
                .in_features = C,
                .out_features = 3 * Cl},
               w16 ? w16->qkv_w : nullptr);
    if (cfg.flash_attention()) {
      k::flash_attention_forward(ctx, {.out = s.attn,
                                       .lse = s.lse,
                                       .qkv = s.qkv,
                                       .alibi = alibi,
                                       .dropout = attention_dropout(layer),
                                       .batch = B,
                                       .seq_len = T,
                                       .num_heads = NH,
                                       .head_dim = HS});
    } else {
      // Selective recomputation keeps no probabilities: they go to the shared scratch.
      float* probs = s.probs ? s.probs : a.scratch_probs;
      k::attention_forward(ctx, {.out = s.attn,
                                 .probs = probs,
                                 .qkv = s.qkv,
                                 .batch = B,
                                 .seq_len = T,
                                 .num_heads = NH,
                                 .head_dim = HS});
    }
    float* proj = partial_of(s.resid2);
    mm.forward({.out = proj,
                .in = s.attn,
                .weight = w.proj_w,
                .bias = once(w.proj_b),
                .rows = BT,
                .in_features = Cl,
                .out_features = C},
               w16 ? w16->proj_w : nullptr);
    region.leave(proj, s.resid2);  // g (SP: reduce-scatter)
    drop(s.resid2, layer, DropSite::kAttentionOut);
    k::add_forward(ctx, s.resid2, s.resid2, x, R * C);
    k::layernorm_forward(ctx, {.out = s.ln2,
                               .mean = s.ln2_mean,
                               .rstd = s.ln2_rstd,
                               .in = s.resid2,
                               .weight = w.ln2_w,
                               .bias = w.ln2_b,
                               .rows = R,
                               .cols = C,
                               .eps = eps});
    const float* ln2 = region.enter(s.ln2, a.gathered);  // f
    // MLP up-projection without its bias: the fused bias-GeLU adds it (Megatron's bias_gelu).
    mm.forward({.out = s.fc,
                .in = ln2,
                .weight = w.fc_w,
                .bias = nullptr,
                .rows = BT,
                .in_features = C,
                .out_features = F},
               w16 ? w16->fc_w : nullptr);
    k::bias_gelu_forward(ctx, {.out = s.gelu, .in = s.fc, .bias = w.fc_b, .rows = BT, .cols = F});
    float* fc2 = partial_of(s.out);
    mm.forward({.out = fc2,
                .in = s.gelu,
                .weight = w.fc2_w,
                .bias = once(w.fc2_b),
                .rows = BT,
                .in_features = F,
                .out_features = C},
               w16 ? w16->fc2_w : nullptr);
    region.leave(fc2, s.out);  // g
    drop(s.out, layer, DropSite::kMlpOut);
    k::add_forward(ctx, s.out, s.out, s.resid2, R * C);
  }
};

std::vector<float> alibi_slopes_of(const ModelConfig& cfg) {
  std::vector<float> slopes;
  if (cfg.position_embedding == PositionEmbedding::kAlibi) {
    slopes.resize(static_cast<std::size_t>(cfg.num_attention_heads));
    k::alibi_slopes(cfg.num_attention_heads, slopes.data());
  }
  return slopes;
}

}  // namespace

void gpt_forward(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const GptParams& p, const std::int32_t* tokens, GptActivations& a) {
  const int tp = tp_size_of(rt), tp_rank = tp_rank_of(rt);
  TRIDENT_ASSERT(tp == rt.shard.tp_size, "tp group of ", tp, " ranks for a shard of ",
                 rt.shard.tp_size);
  const std::int64_t B = a.batch, T = a.seq_len, BT = B * T;
  const std::int64_t C = cfg.hidden_size, F = cfg.ffn() / tp, NH = cfg.num_attention_heads / tp;
  const std::int64_t Cl = C / tp, HS = cfg.head_dim();
  const std::int64_t Vl = cfg.padded_vocab_size(tp) / tp;
  const float eps = cfg.layernorm_epsilon;
  const TpRegion region(rt, BT, C);
  const std::int64_t R = region.local_rows();
  TRIDENT_ASSERT(R == a.stage_rows, "activations laid out for ", a.stage_rows, " rows, not ", R);
  const std::vector<float> slopes = alibi_slopes_of(cfg);
  const LayerForward layer{ctx,    cfg,
                           rt,     a,
                           region, slopes.empty() ? nullptr : slopes.data() + tp_rank * NH,
                           B,      T,
                           BT,     C,
                           F,      NH,
                           Cl,     HS,
                           R,      region.sp() ? tp_rank * R : 0,
                           tp_rank};

  if (rt.shard.has_embedding) {
    TRIDENT_CHECK(
        cfg.position_embedding != PositionEmbedding::kLearnedAbsolute || T <= cfg.max_positions(),
        "sequence of ", T, " tokens is longer than the ", cfg.max_positions(),
        " learned positions (--max-position-embeddings); ALiBi models have no such limit");
    call(rt.before_forward, -1);
    float* dst = cfg.embed_layernorm ? a.emb_raw : a.encoded;
    float* emb = layer.partial_of(dst);
    k::embedding_forward(ctx, {.out = emb,
                               .tokens = tokens,
                               .wte = p.wte,
                               .wpe = layer.once(p.wpe),
                               .batch = B,
                               .seq_len = T,
                               .hidden = C,
                               .vocab_start = tp_rank * Vl,
                               .vocab_local = Vl});
    region.leave(emb, dst);  // each token's row lives on one tp rank
    if (cfg.embed_layernorm) {
      k::layernorm_forward(ctx, {.out = a.encoded,
                                 .mean = a.emb_mean,
                                 .rstd = a.emb_rstd,
                                 .in = a.emb_raw,
                                 .weight = p.emb_ln_w,
                                 .bias = p.emb_ln_b,
                                 .rows = R,
                                 .cols = C,
                                 .eps = eps});
    }
    layer.drop(a.encoded, -1, DropSite::kEmbedding);
  }
  const float* x = a.encoded;
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    call(rt.before_forward, static_cast<std::int64_t>(l));
    LayerActivations& s = a.layers[l];
    if (cfg.recomputes(static_cast<std::int64_t>(l))) {
      // Full recomputation: run in the scratch set, keep only the output.
      LayerActivations sc = a.scratch;
      sc.out = s.out;
      layer.run(l, p.layers[l], sc, x);
    } else {
      layer.run(l, p.layers[l], s, x);
    }
    x = s.out;
  }
  if (rt.shard.has_head) {
    call(rt.before_forward, static_cast<std::int64_t>(a.layers.size()));
    k::layernorm_forward(ctx, {.out = a.lnf,
                               .mean = a.lnf_mean,
                               .rstd = a.lnf_rstd,
                               .in = x,
                               .weight = p.lnf_w,
                               .bias = p.lnf_b,
                               .rows = R,
                               .cols = C,
                               .eps = eps});
    // f. Output layer tied to the word embedding: logits = lnf @ wte^T, each tp rank computing
    // its slice of the vocabulary for every row.
    const float* lnf = region.enter(a.lnf, a.gathered);
    const Matmuls mm{ctx, a};
    mm.forward({.out = a.logits,
                .in = lnf,
                .weight = p.wte,
                .bias = nullptr,
                .rows = BT,
                .in_features = C,
                .out_features = Vl},
               rt.params_bf16 ? rt.params_bf16->wte : nullptr);
  }
}

LossSum gpt_loss(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                 const std::int32_t* targets, float d_scale, LossGrad grad, GptActivations& a) {
  TRIDENT_ASSERT(rt.shard.has_head, "gpt_loss on a pipeline stage without the output layer");
  const std::int64_t BT = a.batch * a.seq_len;
  const int tp = tp_size_of(rt);
  if (tp == 1) {
    k::cross_entropy_forward_backward(ctx,
                                      {.losses = a.losses,
                                       .d_logits = grad == LossGrad::kCompute ? a.logits : nullptr,
                                       .logits = a.logits,
                                       .targets = targets,
                                       .d_scale = d_scale,
                                       .rows = BT,
                                       .vocab = cfg.vocab_size,
                                       .vocab_padded = cfg.padded_vocab_size()});
  } else {
    vocab_parallel_cross_entropy(rt, BT, cfg.vocab_size, cfg.padded_vocab_size(tp) / tp, targets,
                                 d_scale, grad, a);
  }
  LossSum out;
  for (std::int64_t i = 0; i < BT; ++i) {
    if (targets[i] < 0) continue;
    out.sum += a.losses[i];
    ++out.count;
  }
  return out;
}

void gpt_backward(const core::ExecContext& ctx, const ModelConfig& cfg, const ModelRuntime& rt,
                  const GptParams& p, const GptGrads& g, const std::int32_t* tokens,
                  GptActivations& a) {
  const int tp = tp_size_of(rt), tp_rank = tp_rank_of(rt);
  const std::int64_t B = a.batch, T = a.seq_len, BT = B * T;
  const std::int64_t C = cfg.hidden_size, F = cfg.ffn() / tp, NH = cfg.num_attention_heads / tp;
  const std::int64_t Cl = C / tp, HS = cfg.head_dim();
  const std::int64_t Vl = cfg.padded_vocab_size(tp) / tp;
  const std::int64_t L = static_cast<std::int64_t>(a.layers.size());
  const TpRegion region(rt, BT, C);
  const std::int64_t R = region.local_rows();
  const std::int64_t row0 = region.sp() ? tp_rank * R : 0;
  const bool hidden_drop = rt.training && cfg.hidden_dropout > 0.0f;
  // The gradient through a dropout: the same mask as the forward, regenerated.
  auto drop_backward = [&](const float* d, std::int64_t layer, DropSite site) -> const float* {
    if (!hidden_drop) return d;
    dropout_rows(a.d_drop, d, R, C, a.first_sample * T + row0, cfg.hidden_dropout, rt.dropout_seed,
                 drop_stream(a.iteration, layer, site));
    return a.d_drop;
  };
  const std::vector<float> slopes = alibi_slopes_of(cfg);
  const float* alibi = slopes.empty() ? nullptr : slopes.data() + tp_rank * NH;
  const LayerForward recompute{ctx, cfg, rt, a,  region, alibi, B,    T,      BT,
                               C,   F,   NH, Cl, HS,     R,     row0, tp_rank};
  const Matmuls mm{ctx, a};

  if (rt.shard.has_head) {
    call(rt.before_backward, L);
    // Tied output layer: d_lnf = d_logits @ wte, d_wte += d_logits^T @ lnf (full rows; SP
    // gathers lnf again rather than keeping a full copy).
    const float* lnf = region.enter(a.lnf, a.gathered);
    mm.backward({.d_in = a.d_ln,
                 .d_weight = g.wte,
                 .d_bias = nullptr,
                 .d_out = a.logits,
                 .in = lnf,
                 .weight = p.wte,
                 .rows = BT,
                 .in_features = C,
                 .out_features = Vl},
                rt.params_bf16 ? rt.params_bf16->wte : nullptr);
    const float* d_lnf = region.enter_backward(a.d_ln);  // each rank holds a partial d_lnf
    std::memset(a.d_x, 0, static_cast<std::size_t>(R * C) * sizeof(float));
    k::layernorm_backward(ctx, {.d_in = a.d_x,
                                .d_weight = g.lnf_w,
                                .d_bias = g.lnf_b,
                                .d_out = d_lnf,
                                .in = a.output(),
                                .weight = p.lnf_w,
                                .mean = a.lnf_mean,
                                .rstd = a.lnf_rstd,
                                .rows = R,
                                .cols = C});
    call(rt.after_backward, L);
  }
  // d_x now holds the gradient of the residual stream at the top (this rank's rows); walk the
  // layers down.
  for (std::int64_t l = L - 1; l >= 0; --l) {
    call(rt.before_backward, l);
    const LayerTensors<const float*>& w = p.layers[static_cast<std::size_t>(l)];
    const LayerTensors<float*>& gw = g.layers[static_cast<std::size_t>(l)];
    const float* x = l > 0 ? a.layers[static_cast<std::size_t>(l - 1)].out : a.encoded;
    LayerActivations scratch = a.scratch;
    if (cfg.recomputes(l)) {
      // Full recomputation: the same forward (same dropout masks) into the scratch set.
      recompute.run(static_cast<std::size_t>(l), w, scratch, x);
    }
    const LayerActivations& s = cfg.recomputes(l) ? scratch : a.layers[static_cast<std::size_t>(l)];
    if (!cfg.flash_attention() && s.probs == nullptr) {
      // Selective recomputation: the attention probabilities again (the output, identical to the
      // saved one, lands in d_attn, which the projection's backward overwrites next).
      k::attention_forward(ctx, {.out = a.d_attn,
                                 .probs = a.scratch_probs,
                                 .qkv = s.qkv,
                                 .batch = B,
                                 .seq_len = T,
                                 .num_heads = NH,
                                 .head_dim = HS});
    }
    const std::int64_t layer = rt.shard.first_layer + l;
    // MLP: out = resid2 + drop(g(fc2(gelu(fc(f(ln2(resid2))))))); the residual passes d_x
    // through. The row-parallel bias gradient is the column sum over every row, the same on each
    // rank.
    const float* d_out =
        region.leave_backward(drop_backward(a.d_x, layer, DropSite::kMlpOut), a.d_full);
    const LayerTensors<const core::bf16*>* w16 =
        rt.params_bf16 ? &rt.params_bf16->layers[static_cast<std::size_t>(l)] : nullptr;
    mm.backward({.d_in = a.d_fc,
                 .d_weight = gw.fc2_w,
                 .d_bias = gw.fc2_b,
                 .d_out = d_out,
                 .in = s.gelu,
                 .weight = w.fc2_w,
                 .rows = BT,
                 .in_features = F,
                 .out_features = C},
                w16 ? w16->fc2_w : nullptr);
    k::bias_gelu_backward(ctx, {.d_in = a.d_fc,
                                .d_bias = gw.fc_b,
                                .d_out = a.d_fc,
                                .in = s.fc,
                                .bias = w.fc_b,
                                .rows = BT,
                                .cols = F,
                                .scratch = a.fused_scratch});
    const float* ln2 = region.enter(s.ln2, a.gathered);
    mm.backward({.d_in = a.d_ln,
                 .d_weight = gw.fc_w,
                 .d_bias = nullptr,  // summed by bias_gelu_backward
                 .d_out = a.d_fc,
                 .in = ln2,
                 .weight = w.fc_w,
                 .rows = BT,
                 .in_features = C,
                 .out_features = F},
                w16 ? w16->fc_w : nullptr);
    const float* d_ln2 = region.enter_backward(a.d_ln);  // f backward
    k::layernorm_backward(ctx, {.d_in = a.d_x,
                                .d_weight = gw.ln2_w,
                                .d_bias = gw.ln2_b,
                                .d_out = d_ln2,
                                .in = s.resid2,
                                .weight = w.ln2_w,
                                .mean = s.ln2_mean,
                                .rstd = s.ln2_rstd,
                                .rows = R,
                                .cols = C});
    // Attention: resid2 = x + drop(g(proj(attn(qkv(f(ln1(x))))))).
    d_out = region.leave_backward(drop_backward(a.d_x, layer, DropSite::kAttentionOut), a.d_full);
    mm.backward({.d_in = a.d_attn,
                 .d_weight = gw.proj_w,
                 .d_bias = gw.proj_b,
                 .d_out = d_out,
                 .in = s.attn,
                 .weight = w.proj_w,
                 .rows = BT,
                 .in_features = Cl,
                 .out_features = C},
                w16 ? w16->proj_w : nullptr);
    if (cfg.flash_attention()) {
      k::flash_attention_backward(
          ctx, {.d_qkv = a.d_qkv,
                .d_out = a.d_attn,
                .qkv = s.qkv,
                .out = s.attn,
                .lse = s.lse,
                .alibi = alibi,
                .dropout = {.p = rt.training ? cfg.attention_dropout : 0.0f,
                            .seed = rt.dropout_seed,
                            .stream = drop_stream(a.iteration, layer, DropSite::kProbs),
                            .first_sample = a.first_sample,
                            .head_offset = tp_rank * NH,
                            .total_heads = cfg.num_attention_heads},
                .batch = B,
                .seq_len = T,
                .num_heads = NH,
                .head_dim = HS});
    } else {
      k::attention_backward(ctx, {.d_qkv = a.d_qkv,
                                  .d_probs = a.d_probs,
                                  .d_out = a.d_attn,
                                  .qkv = s.qkv,
                                  .probs = s.probs ? s.probs : a.scratch_probs,
                                  .batch = B,
                                  .seq_len = T,
                                  .num_heads = NH,
                                  .head_dim = HS});
    }
    const float* ln1 = region.enter(s.ln1, a.gathered);
    mm.backward({.d_in = a.d_ln,
                 .d_weight = gw.qkv_w,
                 .d_bias = gw.qkv_b,
                 .d_out = a.d_qkv,
                 .in = ln1,
                 .weight = w.qkv_w,
                 .rows = BT,
                 .in_features = C,
                 .out_features = 3 * Cl},
                w16 ? w16->qkv_w : nullptr);
    const float* d_ln1 = region.enter_backward(a.d_ln);  // f backward
    k::layernorm_backward(ctx, {.d_in = a.d_x,
                                .d_weight = gw.ln1_w,
                                .d_bias = gw.ln1_b,
                                .d_out = d_ln1,
                                .in = x,
                                .weight = w.ln1_w,
                                .mean = s.ln1_mean,
                                .rstd = s.ln1_rstd,
                                .rows = R,
                                .cols = C});
    call(rt.after_backward, l);
  }
  if (rt.shard.has_embedding) {
    call(rt.before_backward, -1);
    // Embedding dropout, then the embedding LayerNorm (BLOOM), backwards.
    const float* d_enc = drop_backward(a.d_x, -1, DropSite::kEmbedding);
    if (cfg.embed_layernorm) {
      float* d_raw = a.d_ln;  // free here; the LayerNorm accumulates into it
      std::memset(d_raw, 0, static_cast<std::size_t>(R * C) * sizeof(float));
      k::layernorm_backward(ctx, {.d_in = d_raw,
                                  .d_weight = g.emb_ln_w,
                                  .d_bias = g.emb_ln_b,
                                  .d_out = d_enc,
                                  .in = a.emb_raw,
                                  .weight = p.emb_ln_w,
                                  .mean = a.emb_mean,
                                  .rstd = a.emb_rstd,
                                  .rows = R,
                                  .cols = C});
      d_enc = d_raw;
    }
    // The forward reduction's backward: every rank scatters the full gradient into its own
    // vocabulary rows; the position embedding's gradient is the same on every rank.
    const float* d_emb = region.leave_backward(d_enc, a.d_full);
    k::embedding_backward(ctx, {.d_wte = g.wte,
                                .d_wpe = g.wpe,
                                .d_out = d_emb,
                                .tokens = tokens,
                                .batch = B,
                                .seq_len = T,
                                .hidden = C,
                                .vocab_start = tp_rank * Vl,
                                .vocab_local = Vl});
    call(rt.after_backward, -1);
  }
}

}  // namespace trident::model
