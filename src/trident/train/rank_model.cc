#include "trident/train/rank_model.h"

#include <algorithm>

#include "trident/core/error.h"

namespace trident::train {

std::pair<std::int64_t, std::int64_t> virtual_stage_layers(std::int64_t num_layers,
                                                           const PipelineSplit& split, int u) {
  const int V = split.pp_size * split.num_chunks;
  TRIDENT_ASSERT(u >= 0 && u < V, "virtual stage ", u, " of ", V);
  const bool uneven = split.first_stage_layers >= 0 || split.last_stage_layers >= 0;
  if (!uneven) {
    TRIDENT_CHECK(num_layers % V == 0, "--num-layers (", num_layers, ") must be divisible by the ",
                  V, " pipeline stages (", split.pp_size, " stages x ", split.num_chunks,
                  " virtual chunks); or set --decoder-first-pipeline-num-layers / "
                  "--decoder-last-pipeline-num-layers");
    const std::int64_t per = num_layers / V;
    return {u * per, per};
  }
  TRIDENT_CHECK(split.num_chunks == 1,
                "uneven pipeline splits cannot be combined with the "
                "interleaved schedule");
  const int P = split.pp_size;
  TRIDENT_CHECK(P >= 2,
                "--decoder-first/last-pipeline-num-layers need "
                "--pipeline-model-parallel-size >= 2");
  const std::int64_t first = split.first_stage_layers >= 0 ? split.first_stage_layers : -1;
  const std::int64_t last = split.last_stage_layers >= 0 ? split.last_stage_layers : -1;
  std::int64_t rest = num_layers - (first >= 0 ? first : 0) - (last >= 0 ? last : 0);
  const int middle = P - (first >= 0 ? 1 : 0) - (last >= 0 ? 1 : 0);
  TRIDENT_CHECK(rest >= 0 && (middle == 0 ? rest == 0 : rest % middle == 0),
                "uneven pipeline split: ", num_layers, " layers minus first ", first, " and last ",
                last, " leave ", rest, " for ", middle, " other stages, which must divide evenly");
  const std::int64_t per = middle > 0 ? rest / middle : 0;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(P), per);
  if (first >= 0) counts.front() = first;
  if (last >= 0) counts.back() = last;
  std::int64_t start = 0;
  for (int s = 0; s < u; ++s) start += counts[static_cast<std::size_t>(s)];
  TRIDENT_CHECK(counts[static_cast<std::size_t>(u)] > 0 || u == 0 || u == P - 1, "pipeline stage ",
                u, " would hold no layers");
  return {start, counts[static_cast<std::size_t>(u)]};
}

RankModel::RankModel(const model::ModelConfig& cfg, const PipelineSplit& split, int tp_size,
                     int tp_rank, int pp_rank, bool sequence_parallel, const ExpertSplit& experts)
    : cfg_(cfg), tp_rank_(tp_rank) {
  const int P = split.pp_size, v = split.num_chunks;
  for (int c = 0; c < v; ++c) {
    const int u = c * P + pp_rank;
    const auto [first, count] = virtual_stage_layers(cfg.num_layers, split, u);
    ModelChunk chunk;
    chunk.shard.tp_size = tp_size;
    chunk.shard.tp_rank = tp_rank;
    chunk.shard.first_layer = first;
    chunk.shard.num_layers = count;
    chunk.shard.has_embedding = u == 0;
    chunk.shard.has_head = u == P * v - 1;
    chunk.shard.sequence_parallel = sequence_parallel && tp_size > 1;
    chunk.shard.ep_size = experts.ep_size;
    chunk.shard.ep_rank = experts.ep_rank;
    chunk.table = model::build_gpt_param_table(cfg, chunk.shard, experts.part);
    chunk.base = total_numel_;
    total_numel_ += chunk.table.total_numel;
    chunks_.push_back(std::move(chunk));
  }
}

std::int64_t RankModel::num_parameters() const {
  std::int64_t n = 0;
  for (const ModelChunk& c : chunks_) n += c.table.num_parameters();
  return n;
}

void RankModel::init(std::uint64_t seed, float* flat, const core::ExecContext& ctx) const {
  for (const ModelChunk& ch : chunks_)
    model::init_params(cfg_, ch.table, seed, flat + ch.base, tp_rank_, ctx);
}

void RankModel::init_range(std::uint64_t seed, parallel::Range range, float* out,
                           const core::ExecContext& ctx) const {
  for (const ModelChunk& ch : chunks_) {
    const std::int64_t lo = std::max(range.begin, ch.base);
    const std::int64_t hi = std::min(range.end, ch.base + ch.table.total_numel);
    if (lo >= hi) continue;
    model::init_params_range(cfg_, ch.table, seed, lo - ch.base, hi - ch.base,
                             out + (lo - range.begin), tp_rank_, ctx);
  }
}

void RankModel::set_context_parallel(int cp_size, int cp_rank, bool ulysses) {
  for (ModelChunk& ch : chunks_) {
    ch.shard.cp_size = cp_size;
    ch.shard.cp_rank = cp_rank;
    ch.shard.ulysses = ulysses;
  }
}

}  // namespace trident::train
