#include "trident/parallel/shard_plan.h"

#include <algorithm>

#include "trident/core/error.h"

namespace trident::parallel {

ShardPlan build_shard_plan(std::int64_t numel, int dp, std::int64_t align) {
  TRIDENT_CHECK(dp >= 1, "shard plan: data-parallel size must be >= 1, got ", dp);
  TRIDENT_CHECK(align >= 1, "shard plan: alignment must be >= 1, got ", align);
  TRIDENT_CHECK(numel >= 0, "shard plan: negative size ", numel);
  ShardPlan p;
  p.numel = numel;
  p.dp = dp;
  const std::int64_t unit = static_cast<std::int64_t>(dp) * align;
  p.numel_padded = (numel + unit - 1) / unit * unit;
  p.shard_size = p.numel_padded / dp;
  return p;
}

Range ShardPlan::owned(Range range, int rank) const {
  const Range s = shard(rank);
  const std::int64_t lo = std::max(range.begin, s.begin), hi = std::min(range.end, s.end);
  return lo < hi ? Range{lo, hi} : Range{lo, lo};
}

std::vector<std::int64_t> ShardPlan::split(Range range) const {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(dp));
  for (int r = 0; r < dp; ++r) counts[static_cast<std::size_t>(r)] = owned(range, r).size();
  return counts;
}

std::vector<Range> build_buckets(const std::vector<std::int64_t>& cuts, std::int64_t numel,
                                 std::int64_t bucket_size) {
  TRIDENT_CHECK(bucket_size > 0, "--ddp-bucket-size must be positive, got ", bucket_size);
  std::vector<std::int64_t> points = cuts;
  points.push_back(numel);
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  std::vector<Range> buckets;
  std::int64_t start = 0, last_cut = 0;
  for (std::int64_t p : points) {
    if (p <= 0 || p > numel) continue;
    if (p - start > bucket_size && last_cut > start) {
      buckets.push_back({start, last_cut});
      start = last_cut;
    }
    last_cut = p;
  }
  if (start < numel) buckets.push_back({start, numel});
  std::reverse(buckets.begin(), buckets.end());
  return buckets;
}

}  // namespace trident::parallel
