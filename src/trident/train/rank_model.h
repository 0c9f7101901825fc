// RankModel: the part of the model one rank holds, for any TP x PP x DP layout. A rank runs one
// model chunk per virtual pipeline stage it owns (one, unless the schedule is interleaved); each
// chunk is a ModelShard with its own ParamTable, and the chunks' tables are laid end to end in
// the rank's flat FP32 buffers (parameters, gradients, Adam moments).
#pragma once

#include <cstdint>
#include <vector>

#include "trident/core/arena.h"
#include "trident/model/config.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"
#include "trident/parallel/shard_plan.h"

namespace trident::train {

struct PipelineSplit {
  int pp_size = 1;
  int num_chunks = 1;                    // virtual stages per rank (interleaved schedule)
  std::int64_t first_stage_layers = -1;  // --decoder-first-pipeline-num-layers (-1: even split)
  std::int64_t last_stage_layers = -1;   // --decoder-last-pipeline-num-layers
};

// Layers [first, first + count) of virtual stage `u` (0 .. pp_size * num_chunks - 1). Throws
// InvalidArgument for a split that does not fit (layers not divisible, an empty stage...).
std::pair<std::int64_t, std::int64_t> virtual_stage_layers(std::int64_t num_layers,
                                                           const PipelineSplit& split, int u);

struct ModelChunk {
  model::ModelShard shard;
  model::ParamTable table;  // offsets relative to `base`
  std::int64_t base = 0;    // element offset of this chunk in the rank's flat buffers
};

// Expert parallelism: the chunks hold experts block ep_rank of ep_size (model::ModelShard);
// `part` keeps only the dense parameters or only the experts in the tables.
struct ExpertSplit {
  int ep_size = 1, ep_rank = 0;
  model::ParamPart part = model::ParamPart::kAll;
};

class RankModel {
 public:
  RankModel(const model::ModelConfig& cfg, const PipelineSplit& split, int tp_size, int tp_rank,
            int pp_rank, bool sequence_parallel = false, const ExpertSplit& experts = {});

  // Context parallelism: every chunk's shard holds chunks cp_rank and 2 cp_size - 1 - cp_rank of
  // each sequence (its weights are not split), its attention a ring or Ulysses' all-to-all.
  void set_context_parallel(int cp_size, int cp_rank, bool ulysses = false);

  const model::ModelConfig& config() const { return cfg_; }
  const std::vector<ModelChunk>& chunks() const { return chunks_; }
  std::int64_t total_numel() const { return total_numel_; }
  std::int64_t num_parameters() const;  // this rank's, without padding
  int tp_rank() const { return tp_rank_; }

  // Layout-independent initialization of every chunk into flat.
  void init(std::uint64_t seed, float* flat, const core::ExecContext& ctx = {}) const;
  // The same values for flat elements [range.begin, range.end) only, written to out[0, size).
  void init_range(std::uint64_t seed, parallel::Range range, float* out,
                  const core::ExecContext& ctx = {}) const;

 private:
  model::ModelConfig cfg_;
  std::vector<ModelChunk> chunks_;
  std::int64_t total_numel_ = 0;
  int tp_rank_ = 0;
};

}  // namespace trident::train
