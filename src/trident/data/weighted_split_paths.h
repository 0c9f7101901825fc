// BigScience's data flags (Megatron-DeepSpeed, bigscience-workshop fork; BLOOM was trained with
// them): --train-weighted-split-paths, --valid-weighted-split-paths, --test-weighted-split-paths
// and their -path forms, which read the same groups from a file. A group is
//   "NAME: W1 START:END PREFIX1, W2 START:END PREFIX2, ..."
// a named blend of datasets, each weighted and cut to the documents [round(START*N), round(END*N))
// of its N documents. Training takes one group; validation and test take several, each evaluated
// and logged under its own name. The datasets, their indices and the blend follow BigScience's
// megatron/data/gpt_dataset.py (build_dataset_group), dataset_utils.py and blendable_dataset.py,
// which differ from megatron-core's: see docs/data-indices.md ("BigScience's split paths").
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trident/data/dataset_split.h"
#include "trident/data/gpt_dataset.h"
#include "trident/data/sample_dataset.h"

namespace trident::data {

// One dataset of a group: "WEIGHT START:END PREFIX".
struct SplitPathsEntry {
  std::string weight_text;  // as written (BigScience keeps it a string until it blends)
  double weight = 0;
  std::string range_text;  // "START:END"
  double start = 0, end = 0;
  std::string prefix;
};

struct SplitPathsGroup {
  std::string name;  // the text before the first ':', as written
  std::vector<SplitPathsEntry> datasets;
};

// parse_data_paths (megatron/arguments.py): each value is a group; the name is the text before its
// first ':', the rest is split at ',' into datasets of exactly three words. `flag` names the
// option in errors. Throws InvalidArgument naming the flag, the group and the entry for: no ':',
// an empty name or one holding '/', a dataset that is not three words, a range that is not two
// numbers, START >= END (BigScience's own check), a range outside [0, 1], a weight that is not a
// finite number > 0, the same name twice (names key the cache files and the log lines), and for
// --train-weighted-split-paths more than one group.
std::vector<SplitPathsGroup> parse_weighted_split_paths(const std::vector<std::string>& values,
                                                        std::string_view flag);

// parse_data_paths_path: the file holds one line "\"GROUP\" \"GROUP\" ...\"" (a final newline is
// optional here; BigScience's files end with one); returns the groups' texts. Throws
// InvalidArgument naming the flag and the file when it is missing, empty, holds more than one
// line, or is not in that form.
std::vector<std::string> read_weighted_split_paths_file(const std::string& path,
                                                        std::string_view flag);

// get_split_by_range_: [round(START * N), round(END * N)) with Python's round-half-to-even.
std::pair<std::int64_t, std::int64_t> split_paths_document_range(const SplitPathsEntry& e,
                                                                 std::int64_t num_documents);

// analyze_data_prefix's normalization: w / sum(w) with Python's left-to-right sum.
std::vector<double> bigscience_normalize_weights(const std::vector<double>& w);
// get_datasets_weights_and_num_samples: int(math.ceil(target * weight * 1.005)).
std::int64_t bigscience_samples_for_dataset(std::int64_t target, double normalized_weight);

// BlendableDataset (BigScience): the datasets of a group blended with build_blending_indices over
// weights normalized once more (numpy.sum), for as many samples as the datasets hold together
// (BigScience's length). Only the first `size` of those are built: a run reads no further, and the
// greedy order does not depend on the length. A sample that asks a dataset past its end (possible
// only past what BigScience's 0.5% surplus covers) is a DataError naming the group.
class BigScienceBlendedDataset : public SampleDataset {
 public:
  BigScienceBlendedDataset(std::string name,
                           std::vector<std::shared_ptr<const GPTDataset>> datasets,
                           std::vector<double> weights, std::int64_t size);
  std::int64_t num_samples() const override { return size_; }
  std::int64_t seq_length() const override { return datasets_.front()->seq_length(); }
  void sample(std::int64_t i, std::span<std::int32_t> out) const override;
  std::string describe() const override;

  const std::vector<std::shared_ptr<const GPTDataset>>& datasets() const { return datasets_; }
  const std::vector<double>& weights() const { return weights_; }  // as blended
  // BigScience's length: the sum of the datasets' lengths (>= num_samples()).
  std::int64_t full_length() const { return full_length_; }
  const std::vector<std::int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<std::int64_t>& dataset_sample_index() const { return dataset_sample_index_; }

 private:
  std::string name_;
  std::vector<std::shared_ptr<const GPTDataset>> datasets_;
  std::vector<double> weights_;
  std::int64_t size_ = 0, full_length_ = 0;
  std::vector<std::int16_t> dataset_index_;
  std::vector<std::int64_t> dataset_sample_index_;
};

struct NamedDataset {
  std::string name;
  std::shared_ptr<const SampleDataset> dataset;
};

struct SplitPathsBuildConfig {
  // The groups' texts per split (from the flags, or read from the -path files); train is required.
  std::array<std::vector<std::string>, kNumSplits> groups;
  std::int64_t seq_length = 0;
  std::int64_t seed = 1234;
  std::array<std::int64_t, kNumSplits> num_samples{};  // per group of that split; 0: not built
  // Empty: the cache files go next to each dataset, named as BigScience names them
  // ("<prefix>_<name>_indexmap_<N>ns_<L>sl_<seed>s_doc_idx.npy", ...), so either side reads the
  // other's. Else into this directory, as "<md5(prefix)[:12]>_<basename>_<name>_indexmap_...".
  std::string data_cache_path;
  CacheMode cache_mode = CacheMode::kBuildIfMissing;
  // A validation or test range that shares documents with the training range of the same dataset
  // is an error unless this is set (then a warning): BigScience does not check.
  bool allow_overlap = false;
};

struct SplitPathsDatasets {
  std::shared_ptr<const SampleDataset> train;
  std::vector<NamedDataset> valid, test;
};

// pretrain_gpt.py's "Option 2": one dataset per group (a single dataset used directly, several
// blended). Throws InvalidArgument for bad groups (above), a missing prefix, a range that selects
// no document, or a training range that overlaps a validation/test range of the same dataset
// (unless allow_overlap); DataError for unreadable data or caches.
SplitPathsDatasets build_split_paths_datasets(const SplitPathsBuildConfig& cfg);

}  // namespace trident::data
