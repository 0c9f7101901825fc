#include "trident/model/param_table.h"

#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/core/rng.h"
#include "trident/core/view.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/init_normal.h"
#include "trident/model/gpt_weights.h"

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

std::int64_t ParamSpec::ep_offset() const {
  if (ep_size <= 1) return 0;
  std::int64_t whole = 1;
  for (std::int64_t n : global_shape) whole *= n;
  return static_cast<std::int64_t>(ep_rank) * (whole / ep_size);
}

std::int64_t ParamSpec::global_index(std::int64_t i, int tp_rank) const {
  // Within this rank's block of experts (dim 0, outermost), the tensor-parallel split as below.
  if (ep_size > 1) return ep_offset() + tp_global_index(i, tp_rank);
  return tp_global_index(i, tp_rank);
}

std::int64_t ParamSpec::local_index(std::int64_t g, int tp_rank) const {
  if (ep_size > 1) {
    std::int64_t whole = 1;
    for (std::int64_t n : global_shape) whole *= n;
    const std::int64_t block = whole / ep_size, at = g - ep_offset();
    if (at < 0 || at >= block) return -1;
    return tp_local_index(at, tp_rank);
  }
  return tp_local_index(g, tp_rank);
}

std::int64_t ParamSpec::tp_global_index(std::int64_t i, int tp_rank) const {
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

std::int64_t ParamSpec::tp_local_index(std::int64_t g, int tp_rank) const {
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

// Lays out each declared weight after the previous one: its local shape on this tensor-parallel
// rank, its offset (aligned) and its flags.
class TableBuilder final : public layers::WeightVisitor {
 public:
  explicit TableBuilder(ParamTable& t) : t_(t) {}

  void weight(const layers::WeightDecl& d, const layers::WeightSlot& /*slot*/) override {
    if (!t_.holds(d.expert)) return;
    const ModelShard& shard = t_.shard;
    ParamSpec p;
    p.name = d.name;
    p.global_shape = d.shape;
    p.shape = d.shape;
    p.tp_split_dim = shard.tp_size > 1 ? d.tp_split : -1;
    if (p.tp_split_dim == 0 && d.tp_replicas > 1) {
      // Blocks of block_rows: split_rows split over `replicas` ranks, the rest replicated.
      TRIDENT_ASSERT(d.split_rows % d.tp_replicas == 0 && p.shape[0] % d.block_rows == 0 &&
                         p.shape[0] / d.block_rows * d.tp_replicas == shard.tp_size,
                     p.name, ": bad replicated split");
      p.tp_replicas = d.tp_replicas;
      p.split_rows = d.split_rows;
      p.block_rows = d.block_rows;
      p.shape[0] = d.split_rows / d.tp_replicas + d.block_rows - d.split_rows;
    } else if (p.tp_split_dim >= 0) {
      std::int64_t& n = p.shape[static_cast<std::size_t>(p.tp_split_dim)];
      TRIDENT_ASSERT(n % shard.tp_size == 0, p.name, " dim ", p.tp_split_dim, " (", n,
                     ") not divisible by tp ", shard.tp_size);
      n /= shard.tp_size;
    }
    p.expert = d.expert;
    if (d.expert && shard.ep_size > 1) {
      TRIDENT_ASSERT(p.shape[0] % shard.ep_size == 0 && p.tp_split_dim != 0 && d.tp_replicas == 1,
                     p.name, ": ", p.shape[0], " experts do not split over ", shard.ep_size,
                     " expert-parallel ranks");
      p.shape[0] /= shard.ep_size;
      p.ep_size = shard.ep_size;
      p.ep_rank = shard.ep_rank;
    }
    p.shared = d.shared;
    p.tied_embedding = d.tied;
    p.sequence_parallel = shard.sequence_parallel && shard.tp_size > 1 && d.norm;
    p.init = d.init;
    p.weight_decay = d.weight_decay;
    p.layer = d.layer;
    p.numel = 1;
    for (std::int64_t n : p.shape) p.numel *= n;
    p.offset = t_.total_numel;
    t_.total_numel += (p.numel + ParamTable::kAlign - 1) / ParamTable::kAlign * ParamTable::kAlign;
    t_.params.push_back(std::move(p));
  }

 private:
  ParamTable& t_;
};

}  // namespace

ParamTable build_gpt_param_table(const ModelConfig& cfg, const ModelShard& shard, ParamPart part) {
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
  TRIDENT_CHECK(shard.ep_size >= 1 && shard.ep_rank >= 0 && shard.ep_rank < shard.ep_size,
                "bad expert-parallel rank ", shard.ep_rank, " of ", shard.ep_size);
  TRIDENT_CHECK(shard.ep_size == 1 || cfg.num_experts % shard.ep_size == 0, "--num-experts (",
                cfg.num_experts, ") must be divisible by --expert-model-parallel-size (",
                shard.ep_size, "): each expert-parallel rank holds num_experts / ep experts");
  const std::int64_t L = shard.layers(cfg);
  TRIDENT_CHECK(shard.first_layer >= 0 && L >= 0 && shard.first_layer + L <= cfg.num_layers,
                "layers [", shard.first_layer, ", ", shard.first_layer + L,
                ") do not fit a model of ", cfg.num_layers, " layers");
  ParamTable t;
  t.shard = shard;
  t.part = part;
  TableBuilder builder(t);
  declare_gpt(cfg, shard, builder, nullptr, nullptr);
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
        // Split along dim d >= 1: each "row" (an index of the dims before d) holds local_cols =
        // shape[d] x (the dims after d) elements of global_cols (SwiGLU's (2, F, C)
        // up-projection: rows are gate and up, columns F x C; the experts' (E, 2, F, C): rows are
        // each expert's gate and up).
        const bool by_cols = p.tp_split_dim >= 1;
        std::int64_t inner = 1;
        for (std::size_t k = static_cast<std::size_t>(std::max(p.tp_split_dim, 0)) + 1;
             k < p.shape.size(); ++k) {
          inner *= p.shape[k];
        }
        const std::int64_t local_cols = by_cols ? p.shape[p.tp_split_dim] * inner : 1;
        const std::int64_t global_cols = by_cols ? p.global_shape[p.tp_split_dim] * inner : 1;
        kernels::init_normal(ctx,
                             {.out = core::view(dst, {hi - lo}, ctx.device),
                              .begin = lo,
                              .seed = seed,
                              .stream = core::fnv1a64(p.name.c_str()),
                              .stddev = p.init == InitRule::kNormal ? std_normal : std_scaled,
                              .base = (p.tp_split_dim == 0 ? tp_rank * p.numel : 0) + p.ep_offset(),
                              .local_cols = local_cols,
                              .global_cols = global_cols,
                              .col_offset = by_cols ? tp_rank * local_cols : 0});
        break;
      }
    }
  }
}

}  // namespace trident::model
