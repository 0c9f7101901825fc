// The dataset builder: megatron-core's BlendedMegatronDatasetBuilder._build_blended_dataset_splits
// for GPT datasets, with each of its cases marked below.
#include "trident/data/dataset_builder.h"

#include <filesystem>
#include <map>

#include "trident/core/error.h"
#include "trident/data/blended_dataset.h"

namespace trident::data {

using core::str;

namespace {

const char* split_flag(Split s) {
  switch (s) {
    case Split::kTrain:
      return "--train-data-path";
    case Split::kValid:
      return "--valid-data-path";
    case Split::kTest:
      return "--test-data-path";
  }
  return "?";
}

class Builder {
 public:
  explicit Builder(const DatasetBuildConfig& cfg) : cfg_(cfg) {}

  TrainValidTestDatasets build() {
    if (!cfg_.train_weighted_split_paths.empty() || !cfg_.valid_weighted_split_paths.empty() ||
        !cfg_.test_weighted_split_paths.empty()) {
      return build_split_paths();
    }
    const bool per_split = !cfg_.train_data_path.empty() || !cfg_.valid_data_path.empty() ||
                           !cfg_.test_data_path.empty();
    TRIDENT_CHECK(!(per_split && !cfg_.data_path.empty()),
                  "--data-path cannot be combined with --train-data-path/--valid-data-path/"
                  "--test-data-path; use one or the other");
    TRIDENT_CHECK(per_split || !cfg_.data_path.empty(),
                  "no data: give --data-path or --train-data-path/--valid-data-path/"
                  "--test-data-path");
    TRIDENT_CHECK(cfg_.seq_length > 0, "--seq-length must be positive, got ", cfg_.seq_length);
    TRIDENT_CHECK(cfg_.seed >= 0 && cfg_.seed <= 0xffffffffll,
                  "--seed must be in [0, 2^32) for the dataset shuffles, got ", cfg_.seed);
    TRIDENT_CHECK(cfg_.mid_level_dataset_surplus >= 0,
                  "--mid-level-dataset-surplus must be >= 0, got ", cfg_.mid_level_dataset_surplus);
    for (Split s : kAllSplits) {
      const auto& n = cfg_.num_samples[static_cast<std::size_t>(s)];
      TRIDENT_CHECK(!n || *n >= 0, "number of ", split_name(s), " samples must be >= 0, got ", *n);
    }
    return per_split ? build_per_split() : build_shared();
  }

 private:
  std::optional<std::int64_t> size(Split s) const {
    return cfg_.num_samples[static_cast<std::size_t>(s)];
  }

  std::shared_ptr<const IndexedDataset> open(const std::string& prefix, std::string_view flag) {
    auto it = opened_.find(prefix);
    if (it != opened_.end()) return it->second;
    for (const char* ext : {".idx", ".bin"}) {
      std::error_code ec;
      const std::string path = prefix + ext;
      std::string hint;
      for (const char* bad : {".bin", ".idx"}) {
        const std::string b(bad);
        if (prefix.size() > b.size() &&
            prefix.compare(prefix.size() - b.size(), b.size(), b) == 0) {
          hint = str(" (give the prefix without \"", b, "\")");
        }
      }
      TRIDENT_CHECK(std::filesystem::is_regular_file(path, ec), flag, ": dataset prefix \"", prefix,
                    "\" has no ", path, hint,
                    "; a prefix P names the pair P.bin/P.idx written by `trident preprocess`");
    }
    auto ds = std::make_shared<const IndexedDataset>(prefix);
    opened_.emplace(prefix, ds);
    return ds;
  }

  GPTDatasetConfig gpt_config(const std::string& prefix, Split s,
                              std::optional<std::int64_t> num_samples, bool per_split) const {
    GPTDatasetConfig g;
    g.dataset_path = prefix;
    g.index_split = s;
    g.num_samples = num_samples;
    g.random_seed = cfg_.seed;
    g.sequence_length = cfg_.seq_length;
    if (!per_split) {
      g.split = cfg_.split;
      g.split_matrix = matrix_;
    }
    g.tokenizer = cfg_.tokenizer;
    g.cache_dir = cfg_.data_cache_path.empty()
                      ? (std::filesystem::path(prefix) / "cache" / "GPTDataset_indices").string()
                      : cfg_.data_cache_path;
    g.cache_mode = cfg_.cache_mode;
    g.pad_id = cfg_.pad_id;
    g.drop_last_partial_validation_sequence = cfg_.drop_last_partial_validation_sequence;
    return g;
  }

  // _build_megatron_dataset_splits for one split: the GPTDataset over that split's range.
  std::shared_ptr<const GPTDataset> gpt(const std::string& prefix, std::string_view flag, Split s,
                                        std::optional<std::int64_t> num_samples, bool per_split) {
    auto ds = open(prefix, flag);
    std::int64_t begin = 0, end = ds->num_sequences();
    if (!per_split) {
      std::tie(begin, end) = split_range(*matrix_[static_cast<std::size_t>(s)], end);
    }
    return std::make_shared<const GPTDataset>(ds, begin, end,
                                              gpt_config(prefix, s, num_samples, per_split));
  }

  BlendedDatasetConfig blend_config(Split s) const {
    return BlendedDatasetConfig{.split = s,
                                .cache_dir = cfg_.data_cache_path,
                                .cache_mode = cfg_.cache_mode,
                                .mid_level_dataset_surplus = cfg_.mid_level_dataset_surplus};
  }

  // The blend of one split: mid-level GPTDatasets plus the top-level BlendedDataset.
  std::shared_ptr<const SampleDataset> blend(const Blend& b, std::string_view flag, Split s,
                                             bool per_split) {
    const std::optional<std::int64_t> target = size(s);
    std::vector<std::shared_ptr<const GPTDataset>> mids;
    if (b.weights) {
      // Case 3(a): weighted; each dataset is asked for ceil(ceil(target * w) * (1 + surplus)).
      TRIDENT_CHECK(target.has_value(), flag, ": a weighted blend needs the number of ",
                    split_name(s), " samples (weights without sizes are not supported)");
      const std::vector<double> w = normalize_weights(*b.weights);
      std::int64_t blended_size = 0;
      for (std::size_t d = 0; d < b.prefixes.size(); ++d) {
        blended_size += blend_samples_for_dataset(*target, w[d], 0.0);
        mids.push_back(gpt(b.prefixes[d], flag, s,
                           blend_samples_for_dataset(*target, w[d], cfg_.mid_level_dataset_surplus),
                           per_split));
      }
      return std::make_shared<const BlendedDataset>(mids, w, blended_size, blend_config(s));
    }
    // Cases 3(c)/(d): no weights; one epoch of each dataset, weighted by its length.
    std::vector<double> lengths;
    std::int64_t total = 0;
    for (const auto& p : b.prefixes) {
      mids.push_back(gpt(p, flag, s, std::nullopt, per_split));
      lengths.push_back(static_cast<double>(mids.back()->num_samples()));
      total += mids.back()->num_samples();
    }
    std::optional<std::int64_t> blended_size;
    if (target) blended_size = std::min(*target, total);
    return std::make_shared<const BlendedDataset>(mids, lengths, blended_size, blend_config(s));
  }

  // All splits from one distribution: --data-path with --split.
  TrainValidTestDatasets build_shared() {
    const Blend b = parse_blend(cfg_.data_path, "--data-path");
    matrix_ = split_matrix_from_vector(parse_split(cfg_.split));
    TrainValidTestDatasets out;
    for (Split s : kAllSplits) {
      if (!matrix_[static_cast<std::size_t>(s)]) continue;  // empty split: no dataset
      // A split the run never reads (e.g. the test split with --eval-iters 0) is not built, so a
      // tiny corpus whose test split rounds to nothing still trains.
      if (size(s).has_value() && *size(s) == 0) continue;
      std::shared_ptr<const SampleDataset> ds;
      if (b.prefixes.size() == 1 && !b.weights) {
        ds = gpt(b.prefixes[0], "--data-path", s, size(s), false);  // case 2: single prefix
      } else {
        ds = blend(b, "--data-path", s, false);
      }
      (s == Split::kTrain ? out.train : s == Split::kValid ? out.valid : out.test) = ds;
    }
    return out;
  }

  // One blend per split: --train-data-path etc. (no --split; each covers its whole datasets).
  TrainValidTestDatasets build_per_split() {
    TrainValidTestDatasets out;
    for (Split s : kAllSplits) {
      const auto& entries = s == Split::kTrain   ? cfg_.train_data_path
                            : s == Split::kValid ? cfg_.valid_data_path
                                                 : cfg_.test_data_path;
      if (entries.empty()) continue;
      if (size(s).has_value() && *size(s) == 0) continue;  // never read: not built
      const Blend b = parse_blend(entries, split_flag(s));
      std::shared_ptr<const SampleDataset> ds;
      if (b.prefixes.size() == 1) {
        // A single prefix is used directly, with or without a weight.
        ds = gpt(b.prefixes[0], split_flag(s), s, size(s), true);
      } else {
        ds = blend(b, split_flag(s), s, true);
      }
      (s == Split::kTrain ? out.train : s == Split::kValid ? out.valid : out.test) = ds;
    }
    return out;
  }

  // BigScience's option 2: one dataset per named group.
  TrainValidTestDatasets build_split_paths() {
    TRIDENT_CHECK(cfg_.data_path.empty() && cfg_.train_data_path.empty() &&
                      cfg_.valid_data_path.empty() && cfg_.test_data_path.empty(),
                  "--data-path/--train-data-path/--valid-data-path/--test-data-path cannot be "
                  "combined with --train/valid/test-weighted-split-paths (BigScience: \"Mode 1 and "
                  "Mode 2 are mutually exclusive\"); use one or the other");
    SplitPathsBuildConfig sp;
    sp.groups = {cfg_.train_weighted_split_paths, cfg_.valid_weighted_split_paths,
                 cfg_.test_weighted_split_paths};
    sp.seq_length = cfg_.seq_length;
    sp.seed = cfg_.seed;
    for (Split s : kAllSplits) {
      const std::optional<std::int64_t> n = size(s);
      TRIDENT_CHECK(n.has_value(), "--", split_name(s),
                    "-weighted-split-paths needs the number of ", split_name(s), " samples");
      sp.num_samples[static_cast<std::size_t>(s)] = *n;
    }
    sp.data_cache_path = cfg_.data_cache_path;
    sp.cache_mode = cfg_.cache_mode;
    sp.allow_overlap = cfg_.allow_split_paths_overlap;
    SplitPathsDatasets ds = build_split_paths_datasets(sp);
    TrainValidTestDatasets out;
    out.train = std::move(ds.train);
    out.valid_groups = std::move(ds.valid);
    out.test_groups = std::move(ds.test);
    return out;
  }

  const DatasetBuildConfig& cfg_;
  SplitMatrix matrix_{};
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened_;
};

}  // namespace

TrainValidTestDatasets build_train_valid_test_datasets(const DatasetBuildConfig& cfg) {
  return Builder(cfg).build();
}

}  // namespace trident::data
