// ParallelLayout: where each rank sits in the (tp, dp, pp) grid. Pure arithmetic, no
// communicator, so it can be tested alone and used by planners and checkpoint resharding.
//
//   rank = tp_rank + tp_size * (dp_rank + dp_size * pp_rank)        (Megatron order "tp-dp-pp")
//
// tp varies fastest, so a tp group is a block of consecutive ranks (one node). Example, 8 ranks,
// tp=2, dp=2, pp=2:  tp groups [0,1] [2,3] [4,5] [6,7]; dp groups [0,2] [1,3] [4,6] [5,7];
// pp groups [0,4] [1,5] [2,6] [3,7]; embedding groups (first and last stage) [0,4] [1,5] [2,6]
// [3,7].
//
// Expert parallelism (mixture of experts) splits the dp axis, as Megatron-Core does with the
// expert tensor-parallel size equal to tp (its "tp-ep-dp-pp" order for the experts): dp rank d
// has ep rank d % ep_size and expert-data-parallel rank d / ep_size. An ep group (the ranks that
// exchange tokens and hold different experts) is ep_size consecutive dp ranks; an expert-dp
// group (the ranks holding the same experts, which sum their gradients) is every ep_size-th dp
// rank. Example, 8 ranks, tp=2, dp=4, ep=2: ep groups [0,2] [1,3] [4,6] [5,7]; expert-dp groups
// [0,4] [1,5] [2,6] [3,7].
//
// Context parallelism (long sequences, docs/long-context.md) also splits the dp axis, in
// Megatron-Core's order "tp-cp-dp-pp": dp rank d has cp rank d % cp_size and data-parallel rank
// d / cp_size. dp_size counts every rank that holds the same dense weights (Megatron's
// data-parallel group with context parallelism: the gradients are summed and ZeRO shards over
// it); the ranks of a cp group read the same samples, each its own chunks of the sequence, and
// data_size() = dp_size / cp_size groups read different samples. Example, 8 ranks, tp=2, dp=4,
// cp=2: cp groups [0,2] [1,3] [4,6] [5,7], data-parallel size 2.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace trident::parallel {

// kEp and kEdp are the two factors of the dp axis for expert parameters (see above).
// kCp: the context-parallel factor of the dp axis (see above).
enum class Axis : std::uint8_t { kTp, kDp, kPp, kEp, kEdp, kCp };
const char* axis_name(Axis axis);  // "tp", "dp", "pp", "ep", "edp", "cp"

struct Coord {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  friend bool operator==(const Coord&, const Coord&) = default;
};
std::ostream& operator<<(std::ostream& os, const Coord& c);  // "tp1 dp0 pp2"

struct ParallelLayout {
  int tp_size = 1;
  int dp_size = 1;
  int pp_size = 1;
  int ep_size = 1;  // --expert-model-parallel-size: divides dp_size
  int cp_size = 1;  // --context-parallel-size: divides dp_size (not with ep_size > 1)

  // The layout of `world_size` ranks with the given tp and pp; dp = world_size / (tp * pp).
  // Throws InvalidArgument when the sizes are not positive or tp * pp does not divide world_size
  // ("world size 6 is not divisible by tp 4 x pp 1").
  static ParallelLayout from_world_size(int world_size, int tp_size, int pp_size);

  int world_size() const { return tp_size * dp_size * pp_size; }
  int edp_size() const { return dp_size / ep_size; }   // expert-data-parallel size
  int data_size() const { return dp_size / cp_size; }  // ranks reading different samples
  int size_of(Axis axis) const;
  // Throws InvalidArgument unless every size is >= 1, ep_size and cp_size divide dp_size and at
  // most one of them is above 1.
  void validate() const;

  int rank_of(const Coord& c) const { return c.tp + tp_size * (c.dp + dp_size * c.pp); }
  Coord coord_of(int rank) const {
    return {
        .tp = rank % tp_size, .dp = (rank / tp_size) % dp_size, .pp = rank / (tp_size * dp_size)};
  }
  int coord_along(const Coord& c, Axis axis) const;
  int ep_rank(const Coord& c) const { return c.dp % ep_size; }
  int edp_rank(const Coord& c) const { return c.dp / ep_size; }
  int cp_rank(const Coord& c) const { return c.dp % cp_size; }
  int data_rank(const Coord& c) const { return c.dp / cp_size; }

  // The ranks that differ from `rank` only along `axis`, in increasing order; the position of a
  // rank in this list is its coordinate along `axis` (and its rank in the group's communicator).
  std::vector<int> group_of(int rank, Axis axis) const;
  // Every group along `axis`, ordered by their first rank; together they partition the world.
  std::vector<std::vector<int>> groups(Axis axis) const;
  // Index of the group along `axis` that `rank` belongs to (0 .. world_size / size_of(axis) - 1),
  // numbered like groups(axis). Used as the split color.
  int group_index(int rank, Axis axis) const;

  // The embedding group of `rank`: the first and last pipeline stage with its tp and dp
  // coordinates ({first} alone when pp_size == 1). Empty when `rank` is in a middle stage.
  // The stages holding the input embedding and the (tied) output layer sum their embedding
  // gradients over this group.
  std::vector<int> embedding_group_of(int rank) const;

  friend bool operator==(const ParallelLayout&, const ParallelLayout&) = default;
};
// "tp=2 dp=2 pp=1" (and " ep=2" / " cp=2" when above 1)
std::ostream& operator<<(std::ostream& os, const ParallelLayout& l);

}  // namespace trident::parallel
