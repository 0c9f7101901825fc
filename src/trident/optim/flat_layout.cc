#include "trident/optim/flat_layout.h"

#include <algorithm>

#include "trident/core/error.h"

namespace trident::optim {

namespace {

std::int64_t aligned(std::int64_t n) {
  return (n + model::ParamTable::kAlign - 1) / model::ParamTable::kAlign *
         model::ParamTable::kAlign;
}

}  // namespace

FlatLayout::FlatLayout(std::vector<LayoutChunk> chunks, int tp_rank)
    : chunks_(std::move(chunks)), tp_rank_(tp_rank) {
  for (int c = 0; c < static_cast<int>(chunks_.size()); ++c) {
    const LayoutChunk& ch = chunks_[static_cast<std::size_t>(c)];
    TRIDENT_ASSERT(ch.table != nullptr, "chunk ", c, " has no table");
    TRIDENT_ASSERT(ch.base == numel_, "chunk ", c, " at ", ch.base, ", expected ", numel_);
    numel_ += ch.table->total_numel;
    const int first_unit = static_cast<int>(units_.size());
    first_unit_.push_back(first_unit);
    layer_unit_.emplace_back();
    for (const model::ParamSpec& p : ch.table->params) {
      const Range r{ch.base + p.offset, ch.base + p.offset + aligned(p.numel)};
      if (p.layer < 0) {
        if (!rest_.empty() && rest_.back().end == r.begin) {
          rest_.back().end = r.end;
        } else {
          rest_.push_back(r);
        }
        continue;
      }
      // A table of one part (model::ParamPart) may hold no parameter of some layers: those
      // layers have no unit (unit_of gives -1).
      const std::int64_t local = p.layer - ch.first_layer;
      if (static_cast<int>(units_.size()) == first_unit || units_.back().layer != local) {
        TRIDENT_ASSERT(static_cast<int>(units_.size()) == first_unit || units_.back().layer < local,
                       "layer ", p.layer, " parameters are not contiguous");
        auto& map = layer_unit_[static_cast<std::size_t>(c)];
        if (static_cast<std::int64_t>(map.size()) <= local) {
          map.resize(static_cast<std::size_t>(local + 1), -1);
        }
        map[static_cast<std::size_t>(local)] = static_cast<int>(units_.size());
        units_.push_back({c, local, r});
      } else {
        LayerUnit& u = units_.back();
        TRIDENT_ASSERT(u.range.end == r.begin, "layer ", p.layer, " parameters are not contiguous");
        u.range.end = r.end;
      }
    }
    num_units_.push_back(static_cast<int>(units_.size()) - first_unit);
  }
  for (const Range& r : rest_) rest_numel_ += r.size();
  for (const LayerUnit& u : units_) max_unit_ = std::max(max_unit_, u.range.size());
}

int FlatLayout::unit_of(int chunk, std::int64_t layer) const {
  if (chunk < 0 || chunk >= static_cast<int>(first_unit_.size())) return -1;
  const auto& map = layer_unit_[static_cast<std::size_t>(chunk)];
  if (layer < 0 || layer >= static_cast<std::int64_t>(map.size())) return -1;
  return map[static_cast<std::size_t>(layer)];
}

std::int64_t FlatLayout::rest_index(std::int64_t flat) const {
  std::int64_t c = 0;
  for (const Range& r : rest_) {
    if (flat >= r.begin && flat < r.end) return c + (flat - r.begin);
    c += r.size();
  }
  return -1;
}

std::vector<Range> FlatLayout::layer_buckets(std::int64_t bucket_size) const {
  std::vector<Range> buckets;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    if (num_units_[c] == 0) continue;
    const auto first = units_.begin() + first_unit_[c];
    const auto last = first + num_units_[c];
    const std::int64_t lo = first->range.begin, hi = (last - 1)->range.end;
    std::vector<std::int64_t> cuts;
    for (auto u = first; u != last; ++u) cuts.push_back(u->range.end - lo);
    for (const Range& b : parallel::build_buckets(cuts, hi - lo, bucket_size)) {
      buckets.push_back({lo + b.begin, lo + b.end});
    }
  }
  return buckets;
}

std::vector<ParamPiece> FlatLayout::pieces(Range range) const {
  std::vector<ParamPiece> out;
  for (int c = 0; c < static_cast<int>(chunks_.size()); ++c) {
    const LayoutChunk& ch = chunks_[static_cast<std::size_t>(c)];
    for (const model::ParamSpec& p : ch.table->params) {
      const std::int64_t lo = std::max(range.begin, ch.base + p.offset);
      const std::int64_t hi = std::min(range.end, ch.base + p.offset + p.numel);
      if (lo >= hi) continue;
      out.push_back({c, &p, lo - ch.base - p.offset, hi - ch.base - p.offset, lo});
    }
  }
  return out;
}

Range FlatLayout::param_range(int chunk, const std::string& name) const {
  const LayoutChunk& ch = chunks_.at(static_cast<std::size_t>(chunk));
  const model::ParamSpec& p = ch.table->find(name);
  return {ch.base + p.offset, ch.base + p.offset + p.numel};
}

}  // namespace trident::optim
