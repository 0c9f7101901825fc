#include "trident/model/param_table.h"

#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/core/rng.h"
#include "trident/core/view.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/init_normal.h"

namespace trident::model {

const ParamSpec& ParamTable::find(const std::string& name) const {
  for (const ParamSpec& p : params)
    if (p.name == name) return p;
  throw core::InvalidArgument(core::str("no parameter named '", name, "'"));
}

std::int64_t ParamTable::num_parameters() const {
  std::int64_t n = 0;
  for (const ParamSpec& p : params) n += p.numel;
  return n;
}

namespace {
// Elements per row of dim 0.
std::int64_t row_elems(const ParamSpec& p) { return p.numel / p.shape[0]; }
}  // namespace

std::int64_t ParamSpec::replicated_begin() const {
  if (tp_replicas <= 1) return numel;
  return split_rows / tp_replicas * row_elems(*this);
}

std::int64_t ParamSpec::global_index(std::int64_t i, int tp_rank) const {
  if (tp_split_dim < 0) return i;
  if (tp_replicas > 1) {
    const std::int64_t inner = row_elems(*this), row = i / inner,
                       local_split = split_rows / tp_replicas;
    const std::int64_t block = tp_rank / tp_replicas, part = tp_rank % tp_replicas;
    const std::int64_t global_row =
        block * block_rows +
        (row < local_split ? part * local_split + row : split_rows + row - local_split);
    return global_row * inner + i % inner;
  }
  if (tp_split_dim == 0) return static_cast<std::int64_t>(tp_rank) * numel + i;
  // Split along dim d: local index (outer o, j along d, inner k) sits at global (o, rank * local_d
  // + j, k). A matrix split along dim 1 has inner = 1; SwiGLU's (2, F, C) up-projection splits F.
  const auto d = static_cast<std::size_t>(tp_split_dim);
  std::int64_t inner = 1;
  for (std::size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  const std::int64_t local_d = shape[d], global_d = global_shape[d];
  const std::int64_t o = i / (local_d * inner), j = i / inner % local_d, k = i % inner;
  return (o * global_d + static_cast<std::int64_t>(tp_rank) * local_d + j) * inner + k;
}

std::int64_t ParamSpec::local_index(std::int64_t g, int tp_rank) const {
  if (tp_split_dim < 0) return g;
  if (tp_replicas > 1) {
    const std::int64_t inner = row_elems(*this), global_row = g / inner;
    const std::int64_t local_split = split_rows / tp_replicas;
    if (global_row / block_rows != tp_rank / tp_replicas) return -1;
    const std::int64_t w = global_row % block_rows;
    std::int64_t row = 0;
    if (w < split_rows) {
      if (w / local_split != tp_rank % tp_replicas) return -1;
      row = w % local_split;
    } else {
      row = local_split + w - split_rows;
    }
    return row * inner + g % inner;
  }
  if (tp_split_dim == 0) return g / numel == tp_rank ? g % numel : -1;
  // Split along dim d (a matrix's columns, or SwiGLU's (2, F, C) along F): global (o, j, k) is
  // rank j / local_d's (o, j % local_d, k).
  const auto d = static_cast<std::size_t>(tp_split_dim);
  std::int64_t inner = 1;
  for (std::size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  const std::int64_t local_d = shape[d], global_d = global_shape[d];
  const std::int64_t o = g / (global_d * inner), j = g / inner % global_d, k = g % inner;
  if (j / local_d != tp_rank) return -1;
  return (o * local_d + j % local_d) * inner + k;
}

namespace {
void add(ParamTable& t, const ModelShard& shard, std::string name,
         std::vector<std::int64_t> global_shape, int split_dim, InitRule init, bool weight_decay,
         int layer, int replicas = 1, std::int64_t split_rows = 0, std::int64_t block_rows = 0) {
  ParamSpec p;
  p.name = std::move(name);
  p.global_shape = global_shape;
  p.shape = std::move(global_shape);
  p.tp_split_dim = shard.tp_size > 1 ? split_dim : -1;
  if (p.tp_split_dim == 0 && replicas > 1) {
    // Blocks of block_rows: split_rows split over `replicas` ranks, the rest replicated.
    TRIDENT_ASSERT(split_rows % replicas == 0 && p.shape[0] % block_rows == 0 &&
                       p.shape[0] / block_rows * replicas == shard.tp_size,
                   p.name, ": bad replicated split");
    p.tp_replicas = replicas;
    p.split_rows = split_rows;
    p.block_rows = block_rows;
    p.shape[0] = split_rows / replicas + block_rows - split_rows;
  } else if (p.tp_split_dim >= 0) {
    std::int64_t& d = p.shape[static_cast<std::size_t>(p.tp_split_dim)];
    TRIDENT_ASSERT(d % shard.tp_size == 0, p.name, " dim ", p.tp_split_dim, " (", d,
                   ") not divisible by tp ", shard.tp_size);
    d /= shard.tp_size;
  }
  p.sequence_parallel =
      shard.sequence_parallel && shard.tp_size > 1 && p.name.find("layernorm") != std::string::npos;
  p.init = init;
  p.weight_decay = weight_decay;
  p.layer = layer;
  p.numel = 1;
  for (std::int64_t d : p.shape) p.numel *= d;
  p.offset = t.total_numel;
  t.total_numel += (p.numel + ParamTable::kAlign - 1) / ParamTable::kAlign * ParamTable::kAlign;
  t.params.push_back(std::move(p));
}
}  // namespace

ParamTable build_gpt_param_table(const ModelConfig& cfg, const ModelShard& shard) {
  cfg.validate();
  const int tp = shard.tp_size;
  TRIDENT_CHECK(tp >= 1 && shard.tp_rank >= 0 && shard.tp_rank < tp, "bad tensor-parallel rank ",
                shard.tp_rank, " of ", tp);
  TRIDENT_CHECK(cfg.num_attention_heads % tp == 0, "--num-attention-heads (",
                cfg.num_attention_heads, ") must be divisible by --tensor-model-parallel-size (",
                tp, ")");
  const std::int64_t G = cfg.query_groups();
  TRIDENT_CHECK(G % tp == 0 || tp % G == 0, "--num-query-groups (", G,
                ") and --tensor-model-parallel-size (", tp,
                ") must divide one another: each tensor-parallel rank holds whole key/value groups "
                "(G / tp of them), or tp / G ranks share one group's key/value heads");
  TRIDENT_CHECK(cfg.ffn() % tp == 0, "--ffn-hidden-size (", cfg.ffn(),
                ") must be divisible by --tensor-model-parallel-size (", tp, ")");
  const std::int64_t L = shard.layers(cfg);
  TRIDENT_CHECK(shard.first_layer >= 0 && L >= 0 && shard.first_layer + L <= cfg.num_layers,
                "layers [", shard.first_layer, ", ", shard.first_layer + L,
                ") do not fit a model of ", cfg.num_layers, " layers");
  const std::int64_t C = cfg.hidden_size, F = cfg.ffn(), Vp = cfg.padded_vocab_size(tp);
  ParamTable t;
  t.tied_output = cfg.tied_output();
  auto add_p = [&](std::string name, std::vector<std::int64_t> shape, int split, InitRule init,
                   bool wd, int layer) {
    add(t, shard, std::move(name), std::move(shape), split, init, wd, layer);
  };
  if (shard.has_embedding) {
    add_p("embedding.word_embeddings.weight", {Vp, C}, 0, InitRule::kNormal, true, -1);
    if (cfg.position_embedding == PositionEmbedding::kLearnedAbsolute) {
      add_p("embedding.position_embeddings.weight", {cfg.max_positions(), C}, -1, InitRule::kNormal,
            true, -1);
    }
    if (cfg.embed_layernorm) {
      add_p("embedding.word_embeddings_layernorm.weight", {C}, -1, InitRule::kOnes, false, -1);
      if (cfg.normalization == Normalization::kLayerNorm) {
        add_p("embedding.word_embeddings_layernorm.bias", {C}, -1, InitRule::kZeros, false, -1);
      }
    }
  }
  const bool ln = cfg.normalization == Normalization::kLayerNorm, bias = cfg.add_bias_linear;
  auto add_norm = [&](const std::string& name, int layer) {
    add_p(name + ".weight", {C}, -1, InitRule::kOnes, false, layer);
    if (ln) add_p(name + ".bias", {C}, -1, InitRule::kZeros, false, layer);
  };
  for (std::int64_t li = shard.first_layer; li < shard.first_layer + L; ++li) {
    const int l = static_cast<int>(li);
    const std::string p = core::str("layers.", l, ".");
    add_norm(p + "input_layernorm", l);
    // Column-parallel (split along the output rows): whole heads per rank, since the rows are
    // interleaved per query group (G, NH/G + 2, HS): the group's query heads, its key and value
    // head (multi-head attention: (NH, 3, HS)).
    // Fewer groups than ranks: tp / G ranks split a group's query heads and each holds the
    // group's key and value heads (replicated).
    const std::int64_t Q = cfg.qkv_rows(), HS = cfg.head_dim();
    const int reps = G < tp ? static_cast<int>(tp / G) : 1;
    const std::int64_t q_rows = cfg.num_attention_heads / G * HS, block = q_rows + 2 * HS;
    add(t, shard, p + "self_attention.query_key_value.weight", {Q, C}, 0, InitRule::kNormal, true,
        l, reps, q_rows, block);
    if (bias) {
      add(t, shard, p + "self_attention.query_key_value.bias", {Q}, 0, InitRule::kZeros, false, l,
          reps, q_rows, block);
    }
    // Row-parallel (split along the input columns); its bias is added once, after the reduction.
    add_p(p + "self_attention.dense.weight", {C, C}, 1, InitRule::kScaledNormal, true, l);
    if (bias) add_p(p + "self_attention.dense.bias", {C}, -1, InitRule::kZeros, false, l);
    add_norm(p + "post_attention_layernorm", l);
    if (cfg.swiglu) {
      // (gate, up) x F x C, split along F: each rank's rows are its gate block then its up block.
      add_p(p + "mlp.dense_h_to_4h.weight", {2, F, C}, 1, InitRule::kNormal, true, l);
      if (bias) add_p(p + "mlp.dense_h_to_4h.bias", {2, F}, 1, InitRule::kZeros, false, l);
    } else {
      add_p(p + "mlp.dense_h_to_4h.weight", {F, C}, 0, InitRule::kNormal, true, l);
      if (bias) add_p(p + "mlp.dense_h_to_4h.bias", {F}, 0, InitRule::kZeros, false, l);
    }
    add_p(p + "mlp.dense_4h_to_h.weight", {C, F}, 1, InitRule::kScaledNormal, true, l);
    if (bias) add_p(p + "mlp.dense_4h_to_h.bias", {C}, -1, InitRule::kZeros, false, l);
  }
  if (shard.has_head) {
    add_norm("final_layernorm", -1);
    if (!cfg.tied_output()) {
      add_p("output_layer.weight", {Vp, C}, 0, InitRule::kNormal, true, -1);
    } else if (!shard.has_embedding) {
      // The output layer is tied to the word embedding; a last stage without the embedding holds
      // a copy, initialized identically (same RNG keys), whose gradient is summed with the
      // first stage's every step.
      add_p("embedding.word_embeddings.weight", {Vp, C}, 0, InitRule::kNormal, true, -1);
      t.params.back().shared = true;
    }
  }
  return t;
}

void init_params(const ModelConfig& cfg, const ParamTable& table, std::uint64_t seed, float* flat,
                 int tp_rank, const core::ExecContext& ctx) {
  init_params_range(cfg, table, seed, 0, table.total_numel, flat, tp_rank, ctx);
}

void init_params_range(const ModelConfig& cfg, const ParamTable& table, std::uint64_t seed,
                       std::int64_t begin, std::int64_t end, float* out, int tp_rank,
                       const core::ExecContext& ctx) {
  TRIDENT_CHECK(0 <= begin && begin <= end && end <= table.total_numel, "init range [", begin, ", ",
                end, ") outside the table's ", table.total_numel, " elements");
  kernels::fill(ctx, {.out = core::view(out, {end - begin}, ctx.device), .value = 0.0f});
  const double std_normal = cfg.init_method_std;
  const double std_scaled =
      cfg.init_method_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers));
  for (const ParamSpec& p : table.params) {
    // Local elements [lo, hi) of p fall inside the range.
    const std::int64_t lo = std::max<std::int64_t>(0, begin - p.offset);
    const std::int64_t hi = std::min(p.numel, end - p.offset);
    if (lo >= hi) continue;
    float* dst = out + (p.offset + lo - begin);  // element lo of p
    switch (p.init) {
      case InitRule::kZeros:
        break;
      case InitRule::kOnes:
        kernels::fill(ctx, {.out = core::view(dst, {hi - lo}, ctx.device), .value = 1.0f});
        break;
      case InitRule::kNormal:
      case InitRule::kScaledNormal: {
        const double stddev = p.init == InitRule::kNormal ? std_normal : std_scaled;
        if (p.tp_replicas > 1) {
          // Two runs of consecutive global indices: this rank's query rows, its key/value rows.
          const std::int64_t rb = p.replicated_begin();
          for (const auto& [a, b] :
               {std::pair{lo, std::min(hi, rb)}, std::pair{std::max(lo, rb), hi}}) {
            if (a >= b) continue;
            kernels::init_normal(ctx, {.out = core::view(dst + (a - lo), {b - a}, ctx.device),
                                       .begin = a,
                                       .seed = seed,
                                       .stream = core::fnv1a64(p.name.c_str()),
                                       .stddev = stddev,
                                       .base = p.global_index(a, tp_rank) - a});
          }
          break;
        }
        // Keyed by the global element index (ParamSpec::global_index, as the kernel's formula).
        // Split along dim 1: each row of dim 0 holds local_cols = numel / shape[0] elements of
        // global_cols (SwiGLU's (2, F, C) up-projection: rows are gate and up, columns F x C).
        const bool by_cols = p.tp_split_dim == 1;
        const std::int64_t local_cols = by_cols ? p.numel / p.shape[0] : 1;
        const std::int64_t global_cols = by_cols ? local_cols / p.shape[1] * p.global_shape[1] : 1;
        kernels::init_normal(ctx, {.out = core::view(dst, {hi - lo}, ctx.device),
                                   .begin = lo,
                                   .seed = seed,
                                   .stream = core::fnv1a64(p.name.c_str()),
                                   .stddev = p.init == InitRule::kNormal ? std_normal : std_scaled,
                                   .base = p.tp_split_dim == 0 ? tp_rank * p.numel : 0,
                                   .local_cols = local_cols,
                                   .global_cols = global_cols,
                                   .col_offset = by_cols ? tp_rank * local_cols : 0});
        break;
      }
    }
  }
}

}  // namespace trident::model
