// FlatLayout: how one rank's parameters sit in its flat FP32 buffers (parameters, gradients, Adam
// moments share it). The rank runs one model chunk per virtual pipeline stage; each chunk's
// ParamTable is laid out at `base`, the chunks end to end. Derived once from the tables:
//   units  - one per transformer layer: the layer's tensors form one contiguous range (gathered
//            and reduced as a whole by ZeRO 2-3);
//   rest   - the non-layer ranges (embeddings, final LayerNorm, tied output copy), merged where
//            adjacent; their compact concatenation is what ZeRO 2-3 keep whole for an iteration;
//   buckets- consecutive layers of a chunk, at most --ddp-bucket-size elements (stages 0-1).
// Pure arithmetic over the tables; no buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trident/model/param_table.h"
#include "trident/parallel/shard_plan.h"

namespace trident::optim {

using parallel::Range;

struct LayoutChunk {
  const model::ParamTable* table = nullptr;  // outlives the layout
  std::int64_t base = 0;                     // element offset of the chunk in the flat buffers
  std::int64_t first_layer = 0;              // global index of the chunk's first layer
};

struct LayerUnit {
  int chunk = 0;
  std::int64_t layer = 0;  // local layer index in the chunk
  Range range;             // flat range of the layer's tensors (alignment padding included)
};

// One parameter's elements inside a flat range: local elements [begin, end) of `spec` (the
// rank's tensor-parallel slice, row-major) live at flat index flat_begin. Global (unsplit)
// element indices follow from spec->global_index(i, tp_rank).
struct ParamPiece {
  int chunk = 0;
  const model::ParamSpec* spec = nullptr;
  std::int64_t begin = 0, end = 0;
  std::int64_t flat_begin = 0;
};

class FlatLayout {
 public:
  FlatLayout() = default;
  // Throws InternalError when a layer's tensors are not contiguous in its table.
  FlatLayout(std::vector<LayoutChunk> chunks, int tp_rank);

  const std::vector<LayoutChunk>& chunks() const { return chunks_; }
  std::int64_t numel() const { return numel_; }  // sum of the tables' total_numel
  int tp_rank() const { return tp_rank_; }
  const std::vector<LayerUnit>& units() const { return units_; }
  const std::vector<Range>& rest() const { return rest_; }
  std::int64_t rest_numel() const { return rest_numel_; }
  std::int64_t max_unit() const { return max_unit_; }  // >= 1

  // The unit of local layer `layer` of `chunk`, or -1 (embedding -1, head = number of layers, a
  // layer without parameters in the tables' part).
  int unit_of(int chunk, std::int64_t layer) const;
  // Offset of flat index i in the compact concatenation of the rest ranges, or -1.
  std::int64_t rest_index(std::int64_t flat) const;
  // Buckets of consecutive layers per chunk, each at most bucket_size elements unless one layer
  // is larger, in the order backward completes them (last chunk's last layers first).
  std::vector<Range> layer_buckets(std::int64_t bucket_size) const;
  // Every parameter's part inside `range` (flat indices), padding excluded, in flat order.
  std::vector<ParamPiece> pieces(Range range) const;
  // Flat range [base + offset, base + offset + numel) of the parameter named `name` in `chunk`.
  Range param_range(int chunk, const std::string& name) const;

 private:
  std::vector<LayoutChunk> chunks_;
  std::int64_t numel_ = 0;
  int tp_rank_ = 0;
  std::vector<LayerUnit> units_;
  std::vector<int> first_unit_;               // per chunk
  std::vector<int> num_units_;                // per chunk
  std::vector<std::vector<int>> layer_unit_;  // per chunk: local layer -> unit, or -1
  std::vector<Range> rest_;
  std::int64_t rest_numel_ = 0;
  std::int64_t max_unit_ = 1;
};

}  // namespace trident::optim
