// build_train_valid_test_datasets: from --data-path (one distribution split by --split) or from
// --train/valid/test-data-path (one blend per split) to the three SampleDatasets the trainer
// reads, following megatron-core's BlendedMegatronDatasetBuilder case by case (single prefix,
// weighted blend with the 0.5% surplus, unweighted blend weighted by dataset length).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trident/data/dataset_split.h"
#include "trident/data/gpt_dataset.h"
#include "trident/data/sample_dataset.h"
#include "trident/data/weighted_split_paths.h"

namespace trident::data {

struct DatasetBuildConfig {
  // --data-path: "prefix", "prefixA prefixB ...", or "wA prefixA wB prefixB ...". Split by `split`.
  std::vector<std::string> data_path;
  // --train-data-path / --valid-data-path / --test-data-path (same syntax, one blend per split;
  // an empty list means no dataset for that split). Not combinable with data_path.
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  // BigScience's --train/valid/test-weighted-split-paths: the groups' texts (the -path files
  // already read). Excludes data_path, split (when given) and the per-split paths; see
  // weighted_split_paths.h.
  std::vector<std::string> train_weighted_split_paths, valid_weighted_split_paths,
      test_weighted_split_paths;
  bool allow_split_paths_overlap = false;  // --allow-split-paths-overlap
  std::string split = kDefaultSplit;       // --split (only with data_path)
  std::int64_t seq_length = 0;             // --seq-length
  std::int64_t seed = 1234;                // --seed
  // Samples wanted per split, computed by the caller (train: train_iters * global_batch;
  // valid: (train_iters // eval_interval + 1) * eval_iters * global_batch; test: eval_iters *
  // global_batch). nullopt = one epoch of that split.
  std::array<std::optional<std::int64_t>, kNumSplits> num_samples{};
  // --data-cache-path. Empty: GPTDataset indices go to "<prefix>/cache/GPTDataset_indices" (as
  // Megatron) and blends are not cached.
  std::string data_cache_path;
  CacheMode cache_mode = CacheMode::kBuildIfMissing;
  double mid_level_dataset_surplus = 0.005;  // --mid-level-dataset-surplus
  // The tokenizer's unique identifiers (Megatron's tokenizer.unique_identifiers), part of every
  // description and so of the cache file names; null when unknown.
  nlohmann::ordered_json tokenizer = nullptr;
  std::int32_t pad_id = -1;  // pads short samples (Megatron: -1 unless the tokenizer has a pad)
  std::int32_t eod_id = -1;  // end-of-document id, for the trainer's masks (not used by indices)
  bool drop_last_partial_validation_sequence = true;
};

struct TrainValidTestDatasets {
  std::shared_ptr<const SampleDataset> train, valid, test;  // null: no data for that split
  // With BigScience's split paths: the named validation and test groups, each evaluated and
  // logged on its own (valid and test are then null).
  std::vector<NamedDataset> valid_groups, test_groups;
  bool split_paths() const { return !valid_groups.empty() || !test_groups.empty(); }
  const std::shared_ptr<const SampleDataset>& get(Split s) const {
    return s == Split::kTrain ? train : s == Split::kValid ? valid : test;
  }
};

// Builds (or loads from the cache) every split's dataset. Throws InvalidArgument for bad flags
// (unparsable weights or split, both --data-path and per-split paths, a missing prefix, weights
// without sample counts) and DataError for unreadable data or cache directories. Run it on rank 0
// first and, after a barrier, on the other ranks with cache_mode = kLoadOnly, as Megatron does.
TrainValidTestDatasets build_train_valid_test_datasets(const DatasetBuildConfig& cfg);

}  // namespace trident::data
