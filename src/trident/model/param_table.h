// ParamTable: one row per parameter tensor, built from the layers' weight declarations
// (model/layers/weights.h) for one shard. The single source for allocation (offsets into the
// flat parameter and gradient buffers), initialization, weight-decay groups, gradient clipping,
// ZeRO shard plans and checkpoint names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trident/core/exec_context.h"
#include "trident/model/config.h"
#include "trident/model/layers/weights.h"

namespace trident::model {

// What part of the model one rank holds: a tensor-parallel slice of a pipeline stage's layers.
struct ModelShard {
  int tp_size = 1;
  int tp_rank = 0;
  std::int64_t first_layer = 0;
  std::int64_t num_layers = -1;  // -1: every layer from first_layer on
  bool has_embedding = true;     // first pipeline stage: word (and position) embedding
  bool has_head = true;          // last stage: final LayerNorm, output layer (tied), loss
  bool sequence_parallel = false;
  // Expert parallelism: the experts (dim 0 of the expert weights) split into ep_size equal
  // blocks, this rank holding block ep_rank.
  int ep_size = 1;
  int ep_rank = 0;
  // Context parallelism: the sequence in 2 cp_size chunks, this rank holding chunks cp_rank and
  // 2 cp_size - 1 - cp_rank (layers/context_parallel.h). Weights are not split.
  int cp_size = 1;
  int cp_rank = 0;
  bool ulysses = false;  // the cp group runs DeepSpeed-Ulysses' all-to-all instead of the ring

  std::int64_t layers(const ModelConfig& cfg) const {
    return num_layers >= 0 ? num_layers : cfg.num_layers - first_layer;
  }
  friend bool operator==(const ModelShard&, const ModelShard&) = default;
};

struct ParamSpec {
  std::string name;  // Megatron's legacy names, e.g. layers.3.mlp.dense_h_to_4h.weight
  std::vector<std::int64_t> shape;  // shape held by this rank (after the tensor-parallel split)
  std::vector<std::int64_t> global_shape;  // shape of the whole parameter
  int tp_split_dim = -1;                   // dim split across tensor-parallel ranks; -1: replicated
  bool shared = false;             // a second copy of a parameter held elsewhere (the tied word
                                   // embedding on the last pipeline stage): not counted twice in
                                   // the gradient norm
  bool tied_embedding = false;     // the word embedding an output layer is tied to, or the last
                                   // stage's copy: summed over the embedding group each step
  bool sequence_parallel = false;  // a LayerNorm parameter under sequence parallelism: each tp rank
                                   // sees only its rows, so its gradient is summed over tp
  InitRule init = InitRule::kNormal;
  bool weight_decay = true;  // false for biases and LayerNorm parameters
  int layer = -1;            // transformer layer index, -1 for embeddings / final norm
  std::int64_t offset = 0;   // element offset in the flat buffer
  std::int64_t numel = 0;
  // Partly replicated split (grouped-query attention with fewer key/value groups than tp ranks):
  // dim 0 of the whole parameter is blocks of `block_rows` rows (a query group); the first
  // `split_rows` of each block (its query heads) are split among `tp_replicas` consecutive tp
  // ranks, the rest (its key and value heads) are held whole by each of them. Rank t holds block
  // t / tp_replicas: slice t % tp_replicas of the split rows, then the replicated rows. The
  // replicated elements' gradients are summed over those ranks, so the copies stay identical.
  // tp_replicas 1: a plain split.
  int tp_replicas = 1;
  std::int64_t split_rows = 0, block_rows = 0;
  // A mixture-of-experts expert weight (dim 0: the experts): with expert parallelism (ep_size >
  // 1) this rank holds experts [ep_rank, ep_rank + 1) x shape[0] of global_shape[0]; its gradient
  // is summed over the expert-data-parallel group, not the data-parallel one.
  bool expert = false;
  int ep_size = 1, ep_rank = 0;

  // Replicated across tensor-parallel ranks (LayerNorms, row-parallel biases, position
  // embeddings): counted once (on tp rank 0) in the gradient norm.
  bool tp_duplicated() const { return tp_split_dim < 0; }
  // The first local element of the part replicated over tp_replicas ranks (numel when none).
  std::int64_t replicated_begin() const;
  // The global flat index of this rank's first expert (0 without expert parallelism): its block
  // of experts is contiguous in the whole parameter.
  std::int64_t ep_offset() const;
  // The global (unsplit) flat index of local element i on tensor-parallel rank tp_rank.
  std::int64_t global_index(std::int64_t i, int tp_rank) const;
  // The inverse: the local index of global flat index g on tp rank tp_rank, or -1 when that rank
  // does not hold it.
  std::int64_t local_index(std::int64_t g, int tp_rank) const;

 private:
  // The same within the rank's block of experts (the whole parameter without experts).
  std::int64_t tp_global_index(std::int64_t i, int tp_rank) const;
  std::int64_t tp_local_index(std::int64_t g, int tp_rank) const;
};

// Which parameters a table lays out: all of them, or (expert parallelism keeps the experts in
// buffers of their own, reduced over another group) everything but the experts, or the experts.
enum class ParamPart : std::uint8_t { kAll, kDense, kExperts };

struct ParamTable {
  // Offsets are aligned to this many elements (64 bytes of fp32), so every parameter starts on
  // a cache line and ZeRO shard boundaries can be aligned the same way.
  static constexpr std::int64_t kAlign = 16;

  std::vector<ParamSpec> params;
  std::int64_t total_numel = 0;  // flat buffer size, alignment padding included
  ModelShard shard;              // what the table lays out
  ParamPart part = ParamPart::kAll;

  // Whether the table has a row for a declared weight (its part holds it).
  bool holds(bool expert) const {
    return part == ParamPart::kAll || expert == (part == ParamPart::kExperts);
  }

  const ParamSpec& find(const std::string& name) const;  // throws InvalidArgument when absent
  std::int64_t num_parameters() const;                   // without padding
};

// The table of `shard` in forward order (model/gpt_weights.h, declare_gpt): embeddings, layers,
// final norm and output layer (on a last pipeline stage without the embedding, the tied copy of
// the word embedding, marked shared).
// Throws InvalidArgument when the shard does not fit the model (heads, FFN size or padded
// vocabulary not divisible by tp_size, layers out of range).
// `part`: the table of only the dense parameters or only the experts (ParamPart).
ParamTable build_gpt_param_table(const ModelConfig& cfg, const ModelShard& shard = {},
                                 ParamPart part = ParamPart::kAll);

// Fills `flat` (table.total_numel elements) with the initial weights: N(0, std) draws keyed by
// (seed, parameter name, global element index) so that every parallel layout starts from the
// same weights. Padding between parameters is zeroed. tp_rank selects the slice of split tensors.
// `flat` is memory of ctx's device: the kernels draw there (a GPU's shard directly).
void init_params(const ModelConfig& cfg, const ParamTable& table, std::uint64_t seed, float* flat,
                 int tp_rank = 0, const core::ExecContext& ctx = {});
// The same values for elements [begin, end) of the table's flat layout only, written to
// out[0, end - begin): a ZeRO-3 rank initializes its shard without the whole model.
void init_params_range(const ModelConfig& cfg, const ParamTable& table, std::uint64_t seed,
                       std::int64_t begin, std::int64_t end, float* out, int tp_rank = 0,
                       const core::ExecContext& ctx = {});

}  // namespace trident::model
