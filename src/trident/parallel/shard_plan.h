// ZeRO shard plans: which contiguous range of a rank's flat buffer each data-parallel rank owns.
// Pure arithmetic, tested alone (disjoint, covering, aligned, every parameter reassembled).
//
// The flat buffer of n elements is padded to n_padded, a multiple of dp * align, and cut into dp
// equal shards: rank r owns [r * S, (r + 1) * S) with S = n_padded / dp. Shard boundaries ignore
// parameter boundaries (a parameter may straddle ranks, as in DeepSpeed); padding sits at the end.
// Any sub-range of the buffer (a bucket, a layer) splits into per-rank pieces, in rank order, so
// one reduce_scatter_v / all_gather_v over the dp group moves exactly those pieces.
#pragma once

#include <cstdint>
#include <vector>

namespace trident::parallel {

struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

struct ShardPlan {
  std::int64_t numel = 0;         // elements of the flat buffer
  std::int64_t numel_padded = 0;  // a multiple of dp * align
  int dp = 1;
  std::int64_t shard_size = 0;  // numel_padded / dp

  Range shard(int rank) const { return {rank * shard_size, (rank + 1) * shard_size}; }
  // counts[r] = |range ∩ shard(r)|: the pieces of `range` each rank owns, in rank order.
  std::vector<std::int64_t> split(Range range) const;
  // range ∩ shard(rank), possibly empty.
  Range owned(Range range, int rank) const;
};

// Throws InvalidArgument for dp < 1, align < 1 or a negative size.
ShardPlan build_shard_plan(std::int64_t numel, int dp, std::int64_t align);

// Buckets over [0, numel): consecutive ranges whose boundaries are taken from `cuts` (sorted
// positions where a bucket may end, e.g. parameter or layer boundaries), each at most
// bucket_size elements unless a single piece between two cuts is larger. Returned in reverse
// order (the order backward finishes them).
std::vector<Range> build_buckets(const std::vector<std::int64_t>& cuts, std::int64_t numel,
                                 std::int64_t bucket_size);

}  // namespace trident::parallel
