// ParallelLayout: group enumeration and validation (the rank formula itself is inline).
#include "trident/parallel/layout.h"

#include "trident/core/error.h"

namespace trident::parallel {

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::kTp:
      return "tp";
    case Axis::kDp:
      return "dp";
    case Axis::kPp:
      return "pp";
    case Axis::kEp:
      return "ep";
    case Axis::kEdp:
      return "edp";
    case Axis::kCp:
      return "cp";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, const Coord& c) {
  return os << "tp" << c.tp << " dp" << c.dp << " pp" << c.pp;
}

std::ostream& operator<<(std::ostream& os, const ParallelLayout& l) {
  os << "tp=" << l.tp_size << " dp=" << l.dp_size << " pp=" << l.pp_size;
  if (l.ep_size != 1) os << " ep=" << l.ep_size;
  if (l.cp_size != 1) os << " cp=" << l.cp_size;
  return os;
}

ParallelLayout ParallelLayout::from_world_size(int world_size, int tp_size, int pp_size) {
  TRIDENT_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  TRIDENT_CHECK(tp_size >= 1, "tensor-model-parallel size must be >= 1, got ", tp_size);
  TRIDENT_CHECK(pp_size >= 1, "pipeline-model-parallel size must be >= 1, got ", pp_size);
  TRIDENT_CHECK(world_size % (tp_size * pp_size) == 0, "world size ", world_size,
                " is not divisible by tp ", tp_size, " x pp ", pp_size,
                ": choose --tensor-model-parallel-size and --pipeline-model-parallel-size whose "
                "product divides the number of ranks");
  return {.tp_size = tp_size, .dp_size = world_size / (tp_size * pp_size), .pp_size = pp_size};
}

void ParallelLayout::validate() const {
  TRIDENT_CHECK(tp_size >= 1 && dp_size >= 1 && pp_size >= 1 && ep_size >= 1 && cp_size >= 1,
                "parallel sizes must be >= 1, got ", *this);
  TRIDENT_CHECK(dp_size % cp_size == 0, "context-parallel size ", cp_size, " does not divide the ",
                dp_size,
                " ranks left after tp x pp: --context-parallel-size must divide world size / (tp "
                "x pp) (the data-parallel size is world size / (tp x pp x cp))");
  TRIDENT_CHECK(ep_size == 1 || cp_size == 1, "expert parallelism (ep ", ep_size,
                ") with context parallelism (cp ", cp_size,
                ") is not supported yet: choose one of --expert-model-parallel-size and "
                "--context-parallel-size");
  TRIDENT_CHECK(dp_size % ep_size == 0, "expert-model-parallel size ", ep_size,
                " does not divide the data-parallel size ", dp_size,
                ": the experts are split over data-parallel ranks (Megatron-Core's layout), so "
                "--expert-model-parallel-size must divide world size / (tp x pp)");
}

int ParallelLayout::size_of(Axis axis) const {
  switch (axis) {
    case Axis::kTp:
      return tp_size;
    case Axis::kDp:
      return dp_size;
    case Axis::kPp:
      return pp_size;
    case Axis::kEp:
      return ep_size;
    case Axis::kEdp:
      return edp_size();
    case Axis::kCp:
      return cp_size;
  }
  return 0;
}

int ParallelLayout::coord_along(const Coord& c, Axis axis) const {
  switch (axis) {
    case Axis::kTp:
      return c.tp;
    case Axis::kDp:
      return c.dp;
    case Axis::kPp:
      return c.pp;
    case Axis::kEp:
      return ep_rank(c);
    case Axis::kEdp:
      return edp_rank(c);
    case Axis::kCp:
      return cp_rank(c);
  }
  return 0;
}

std::vector<int> ParallelLayout::group_of(int rank, Axis axis) const {
  TRIDENT_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " outside the world of ",
                world_size(), " (", *this, ")");
  Coord c = coord_of(rank);
  const int ep = ep_rank(c), edp = edp_rank(c), data = data_rank(c);
  std::vector<int> ranks;
  const int n = size_of(axis);
  ranks.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    switch (axis) {
      case Axis::kTp:
        c.tp = i;
        break;
      case Axis::kDp:
        c.dp = i;
        break;
      case Axis::kPp:
        c.pp = i;
        break;
      case Axis::kEp:
        c.dp = edp * ep_size + i;
        break;
      case Axis::kEdp:
        c.dp = i * ep_size + ep;
        break;
      case Axis::kCp:
        c.dp = data * cp_size + i;
        break;
    }
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

int ParallelLayout::group_index(int rank, Axis axis) const {
  const Coord c = coord_of(rank);
  switch (axis) {
    case Axis::kTp:
      return c.dp + dp_size * c.pp;
    case Axis::kDp:
      return c.tp + tp_size * c.pp;
    case Axis::kPp:
      return c.tp + tp_size * c.dp;
    case Axis::kEp:  // numbered by (pp, edp, tp), the order of the groups' first ranks
      return c.tp + tp_size * (edp_rank(c) + edp_size() * c.pp);
    case Axis::kEdp:  // by (pp, ep, tp)
      return c.tp + tp_size * (ep_rank(c) + ep_size * c.pp);
    case Axis::kCp:  // by (pp, data, tp)
      return c.tp + tp_size * (data_rank(c) + data_size() * c.pp);
  }
  return 0;
}

std::vector<std::vector<int>> ParallelLayout::groups(Axis axis) const {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(world_size() / size_of(axis)));
  for (int r = 0; r < world_size(); ++r) {
    std::vector<int>& g = out[static_cast<std::size_t>(group_index(r, axis))];
    if (g.empty()) g = group_of(r, axis);
  }
  return out;
}

std::vector<int> ParallelLayout::embedding_group_of(int rank) const {
  TRIDENT_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " outside the world of ",
                world_size(), " (", *this, ")");
  const Coord c = coord_of(rank);
  if (c.pp != 0 && c.pp != pp_size - 1) return {};
  const int first = rank_of({.tp = c.tp, .dp = c.dp, .pp = 0});
  const int last = rank_of({.tp = c.tp, .dp = c.dp, .pp = pp_size - 1});
  if (first == last) return {first};
  return {first, last};
}

}  // namespace trident::parallel
