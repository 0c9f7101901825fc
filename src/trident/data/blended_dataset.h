// BlendedDataset: a weighted mix of GPTDatasets (`--data-path 0.3 A 0.7 B`), in megatron-core's
// order. Sample i is sample dataset_sample_index[i] of dataset dataset_index[i]; the two arrays
// come from Megatron's greedy "largest deficit first" rule and are cached like Megatron's
// (<hash>-BlendedDataset-<split>-{description.txt,dataset_index.npy,dataset_sample_index.npy}).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trident/data/gpt_dataset.h"

namespace trident::data {

// The two blending arrays: which dataset sample k comes from (int16, as megatron-core) and which
// sample of that dataset it is.
struct BlendingIndices {
  std::vector<std::int16_t> dataset_index;         // (size,)
  std::vector<std::int64_t> dataset_sample_index;  // (size,)
};

// helpers.cpp build_blending_indices: for k = 0..size-1 pick the dataset d maximising
// weights[d] * max(k, 1) - count[d] (ties to the lowest d), record (d, count[d]), count[d] += 1.
// `weights` are normalized.
BlendingIndices build_blending_indices(std::span<const double> weights, std::int64_t size);

// helpers.cpp build_exhaustive_blending_indices: the same rule over the datasets not yet
// exhausted, with weights sizes[d] / sum(sizes), until dataset d has given exactly sizes[d]
// samples. Every size must be > 0.
BlendingIndices build_exhaustive_blending_indices(std::span<const std::int64_t> sizes);

struct BlendedDatasetConfig {
  Split split = Split::kTrain;
  // Megatron caches blends only under --data-cache-path; empty = build in memory every run.
  std::string cache_dir;
  CacheMode cache_mode = CacheMode::kBuildIfMissing;
  double mid_level_dataset_surplus = 0.005;  // only quoted in the over-sampling error
};

class BlendedDataset : public SampleDataset {
 public:
  // size set: `weights` are normalized here and `size` samples are blended greedily.
  // size nullopt: `weights` are exact integer sample counts per dataset ("exhaustive" blend).
  // All datasets must be of the same split and sequence length; weights must be > 0. Throws
  // DataError if the blend asks a dataset for more samples than it has (raise the surplus).
  BlendedDataset(std::vector<std::shared_ptr<const GPTDataset>> datasets,
                 std::vector<double> weights, std::optional<std::int64_t> size,
                 BlendedDatasetConfig cfg);

  std::int64_t num_samples() const override { return size_; }
  std::int64_t seq_length() const override { return datasets_.front()->seq_length(); }
  void sample(std::int64_t i, std::span<std::int32_t> out) const override;  // thread-safe
  std::string describe() const override;

  const std::vector<std::shared_ptr<const GPTDataset>>& datasets() const { return datasets_; }
  const std::vector<double>& weights() const { return weights_; }  // normalized when sized
  const std::string& unique_description() const { return description_; }
  const std::string& unique_description_hash() const { return hash_; }
  const IndexArray& dataset_index() const { return dataset_index_; }
  const IndexArray& dataset_sample_index() const { return dataset_sample_index_; }
  IndexSource index_source() const { return source_; }
  std::string cache_file_stem() const;  // "<cache_dir>/<hash>-BlendedDataset-<split>-"

 private:
  bool try_load_cache();
  void check_not_oversampled() const;

  std::vector<std::shared_ptr<const GPTDataset>> datasets_;
  std::vector<double> weights_;
  bool sized_ = true;
  std::int64_t size_ = 0;
  BlendedDatasetConfig cfg_;
  std::string description_, hash_;
  IndexArray dataset_index_, dataset_sample_index_;
  IndexSource source_ = IndexSource::kBuilt;
};

}  // namespace trident::data
