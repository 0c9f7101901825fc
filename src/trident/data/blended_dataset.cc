// Blending indices (megatron-core helpers.cpp rules), BlendedDataset caching and sample lookup.
#include "trident/data/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/timer.h"

namespace trident::data {

using core::DataError;
using core::str;

namespace {
// weight * k rounded to double before the subtraction. megatron-core's helpers.cpp is built
// without FMA; GCC in C++ mode contracts a * b - c into one FMA by default (-ffp-contract=fast)
// under -march=native, which changes how near-ties between datasets break (seen on the
// exhaustive blend test). The volatile store forces the separate rounding.
double rounded_product(double a, double b) {
  volatile double p = a * b;
  return p;
}
}  // namespace

BlendingIndices build_blending_indices(std::span<const double> weights, std::int64_t size) {
  TRIDENT_ASSERT(!weights.empty(), "blending needs at least one dataset");
  const std::size_t n = weights.size();
  BlendingIndices out;
  out.dataset_index.resize(static_cast<std::size_t>(size));
  out.dataset_sample_index.resize(static_cast<std::size_t>(size));
  std::vector<std::int64_t> counts(n, 0);
  for (std::int64_t k = 0; k < size; ++k) {
    const double k_double = std::max(static_cast<double>(k), 1.0);
    std::size_t best = 0;
    double best_error = rounded_product(weights[0], k_double) - static_cast<double>(counts[0]);
    for (std::size_t d = 1; d < n; ++d) {
      const double error = rounded_product(weights[d], k_double) - static_cast<double>(counts[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    out.dataset_index[static_cast<std::size_t>(k)] = static_cast<std::int16_t>(best);
    out.dataset_sample_index[static_cast<std::size_t>(k)] = counts[best]++;
  }
  return out;
}

BlendingIndices build_exhaustive_blending_indices(std::span<const std::int64_t> sizes) {
  const std::size_t n = sizes.size();
  std::int64_t total = 0;
  for (std::int64_t s : sizes) {
    TRIDENT_ASSERT(s > 0, "exhaustive blending needs positive sizes");
    total += s;
  }
  std::vector<double> weights(n);
  for (std::size_t d = 0; d < n; ++d) {
    weights[d] = static_cast<double>(sizes[d]) / static_cast<double>(total);
  }
  BlendingIndices out;
  out.dataset_index.resize(static_cast<std::size_t>(total));
  out.dataset_sample_index.resize(static_cast<std::size_t>(total));
  std::vector<std::int64_t> counts(n, 0);
  std::vector<bool> spent(n, false);
  for (std::int64_t k = 0; k < total; ++k) {
    const double k_double = std::max(static_cast<double>(k), 1.0);
    std::int64_t best = -1;
    double best_error = std::numeric_limits<double>::lowest();
    for (std::size_t d = 0; d < n; ++d) {
      if (spent[d]) continue;
      const double error = rounded_product(weights[d], k_double) - static_cast<double>(counts[d]);
      if (error > best_error) {
        best_error = error;
        best = static_cast<std::int64_t>(d);
      }
    }
    TRIDENT_ASSERT(best >= 0, "exhaustive blending ran out of datasets at sample ", k);
    const auto b = static_cast<std::size_t>(best);
    out.dataset_index[static_cast<std::size_t>(k)] = static_cast<std::int16_t>(best);
    out.dataset_sample_index[static_cast<std::size_t>(k)] = counts[b]++;
    if (counts[b] == sizes[b]) spent[b] = true;
  }
  return out;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const GPTDataset>> datasets,
                               std::vector<double> weights, std::optional<std::int64_t> size,
                               BlendedDatasetConfig cfg)
    : datasets_(std::move(datasets)), weights_(std::move(weights)), cfg_(std::move(cfg)) {
  TRIDENT_CHECK(!datasets_.empty(), "a blend needs at least one dataset");
  TRIDENT_CHECK(datasets_.size() < 32767, "a blend holds at most 32766 datasets, got ",
                datasets_.size());
  TRIDENT_CHECK(weights_.size() == datasets_.size(), "a blend needs one weight per dataset (",
                datasets_.size(), " datasets, ", weights_.size(), " weights)");
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    TRIDENT_CHECK(datasets_[d] != nullptr, "blend dataset ", d, " is null");
    TRIDENT_CHECK(datasets_[d]->config().index_split == cfg_.split, "blend dataset ", d,
                  " is of split ", split_name(datasets_[d]->config().index_split), ", not ",
                  split_name(cfg_.split));
    TRIDENT_CHECK(datasets_[d]->seq_length() == datasets_.front()->seq_length(),
                  "blend datasets differ in sequence length");
    TRIDENT_CHECK(std::isfinite(weights_[d]) && weights_[d] > 0, "blend weight ", d, " (",
                  weights_[d], ") of ", datasets_[d]->config().dataset_path,
                  " must be > 0 (a dataset with no samples in the ", split_name(cfg_.split),
                  " split cannot be blended)");
  }
  if (datasets_.size() == 1) {
    log::warn("data: building a BlendedDataset of a single dataset (", split_name(cfg_.split), ")");
  }
  sized_ = size.has_value();
  if (sized_) {
    TRIDENT_CHECK(*size >= 0, "blend size must be >= 0, got ", *size);
    weights_ = normalize_weights(weights_);
    size_ = *size;
  } else {
    size_ = 0;
    for (double w : weights_) {
      TRIDENT_CHECK(w == std::floor(w),
                    "an exhaustive blend (no size) needs integer sample "
                    "counts as weights, got ",
                    w);
      size_ += static_cast<std::int64_t>(w);
    }
  }

  nlohmann::ordered_json id;
  id["class"] = "BlendedDataset";
  id["datasets"] = nlohmann::ordered_json::array();
  for (const auto& d : datasets_) id["datasets"].push_back(d->unique_identifiers());
  id["split"] = split_name(cfg_.split);
  id["weights"] = nlohmann::ordered_json::array();
  for (double w : weights_) {
    if (sized_) {
      id["weights"].push_back(w);
    } else {
      id["weights"].push_back(static_cast<std::int64_t>(w));  // Python ints (dataset lengths)
    }
  }
  id["size"] = sized_ ? nlohmann::ordered_json(size_) : nlohmann::ordered_json();
  description_ = python_json_dumps(id);
  hash_ = md5_hex(description_);

  core::Timer timer;
  if (!cfg_.cache_dir.empty() && try_load_cache()) {
    source_ = IndexSource::kLoadedFromCache;
    check_not_oversampled();
    log::info("data: BlendedDataset ", split_name(cfg_.split), ": loaded cached indices ",
              cache_file_stem(), "* (", size_, " samples from ", datasets_.size(), " datasets) in ",
              timer.elapsed_s(), " s");
    return;
  }
  if (cfg_.cache_mode == CacheMode::kLoadOnly && !cfg_.cache_dir.empty()) {
    throw DataError(str("no valid cached blending indices at ", cache_file_stem(),
                        "*; rank 0 must build them first (same settings, same "
                        "--data-cache-path)"));
  }
  BlendingIndices idx;
  if (sized_) {
    idx = build_blending_indices(weights_, size_);
  } else {
    std::vector<std::int64_t> counts;
    for (double w : weights_) counts.push_back(static_cast<std::int64_t>(w));
    idx = build_exhaustive_blending_indices(counts);
  }
  dataset_index_ = IndexArray::from_vector(std::move(idx.dataset_index), {size_});
  dataset_sample_index_ = IndexArray::from_vector(std::move(idx.dataset_sample_index), {size_});
  source_ = IndexSource::kBuilt;
  check_not_oversampled();
  const double build_s = timer.elapsed_s();
  if (!cfg_.cache_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg_.cache_dir, ec);
    if (ec) {
      throw DataError(str("cannot create the index cache directory ", cfg_.cache_dir, ": ",
                          ec.message(), "; pass --data-cache-path with a writable directory"));
    }
    const std::string stem = cache_file_stem();
    write_npy(stem + "dataset_index.npy", dataset_index_);
    write_npy(stem + "dataset_sample_index.npy", dataset_sample_index_);
    write_text_file(stem + "description.txt", description_);
  }
  log::info("data: BlendedDataset ", split_name(cfg_.split), ": built indices (", size_,
            " samples from ", datasets_.size(), " datasets) in ", build_s, " s",
            cfg_.cache_dir.empty() ? "" : str("; saved to ", cache_file_stem(), "*"));
}

std::string BlendedDataset::cache_file_stem() const {
  return (std::filesystem::path(cfg_.cache_dir) /
          str(hash_, "-BlendedDataset-", split_name(cfg_.split), "-"))
      .string();
}

bool BlendedDataset::try_load_cache() {
  const std::string stem = cache_file_stem();
  const std::string desc_path = stem + "description.txt";
  const std::string index_path = stem + "dataset_index.npy";
  const std::string sample_path = stem + "dataset_sample_index.npy";
  std::error_code ec;
  for (const auto& p : {desc_path, index_path, sample_path}) {
    if (!std::filesystem::is_regular_file(p, ec)) return false;
  }
  auto stale = [&](const std::string& why) {
    log::warn("data: ignoring cached blending indices ", stem, "*: ", why, "; rebuilding");
    return false;
  };
  const auto text = read_text_file(desc_path);
  if (!text || *text != description_) {
    return stale("its description differs from this blend's (settings changed or file edited)");
  }
  try {
    IndexArray index = IndexArray::map_npy(index_path);
    IndexArray sample = IndexArray::map_npy(sample_path);
    const std::vector<std::int64_t> shape{size_};
    if (index.dtype() != IndexDType::kI16 || index.shape() != shape) {
      return stale(str("dataset_index is not int16 of length ", size_));
    }
    if (sample.dtype() != IndexDType::kI64 || sample.shape() != shape) {
      return stale(str("dataset_sample_index is not int64 of length ", size_));
    }
    for (std::int64_t k = 0; k < size_; ++k) {
      const std::int64_t d = index.at(k);
      if (d < 0 || d >= static_cast<std::int64_t>(datasets_.size())) {
        return stale(str("dataset_index[", k, "] = ", d, " is not a dataset of this blend"));
      }
    }
    dataset_index_ = std::move(index);
    dataset_sample_index_ = std::move(sample);
  } catch (const DataError& e) {
    return stale(e.what());
  }
  return true;
}

void BlendedDataset::check_not_oversampled() const {
  std::vector<std::int64_t> used(datasets_.size(), 0);
  for (std::int64_t k = 0; k < size_; ++k) {
    const auto d = static_cast<std::size_t>(dataset_index_.at(k));
    used[d] = std::max(used[d], dataset_sample_index_.at(k) + 1);
  }
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    if (used[d] > datasets_[d]->num_samples()) {
      throw DataError(str("the ", split_name(cfg_.split), " blend asks ",
                          datasets_[d]->config().dataset_path, " (dataset ", d, ") for ", used[d],
                          " samples but it has ", datasets_[d]->num_samples(),
                          "; raise --mid-level-dataset-surplus (now ",
                          cfg_.mid_level_dataset_surplus, "), e.g. two- or ten-fold"));
    }
  }
}

void BlendedDataset::sample(std::int64_t i, std::span<std::int32_t> out) const {
  TRIDENT_ASSERT(0 <= i && i < size_, "sample ", i, " out of range [0, ", size_, ")");
  const auto d = static_cast<std::size_t>(dataset_index_.at(i));
  datasets_[d]->sample(dataset_sample_index_.at(i), out);
}

std::string BlendedDataset::describe() const {
  std::string parts;
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    parts += str(d == 0 ? "" : ", ", weights_[d], " ", datasets_[d]->config().dataset_path);
  }
  return str("BlendedDataset(", split_name(cfg_.split), ", ", size_, " samples: ", parts, ", hash ",
             hash_, ")");
}

}  // namespace trident::data
