// GPTDataset index building, caching and sample reading; the Megatron rules each step reproduces
// are stated in gpt_dataset.h and docs/data-indices.md.
#include "trident/data/gpt_dataset.h"

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
// Megatron's add_extra_token_to_sequence (always on here): a sample holds seq_length + 1 tokens.
constexpr std::int64_t kExtra = 1;
}  // namespace

EpochPlan plan_epochs(std::int64_t tokens_per_epoch, std::int64_t seq_length,
                      std::optional<std::int64_t> num_samples, double last_epoch_cutoff) {
  TRIDENT_ASSERT(tokens_per_epoch > 0 && seq_length > 0, "plan_epochs needs positive sizes");
  EpochPlan plan;
  if (!num_samples) return plan;
  const std::int64_t requested = *num_samples * seq_length + kExtra;
  plan.num_epochs =
      std::max<std::int64_t>(1, (requested + tokens_per_epoch - 1) / tokens_per_epoch);
  if (plan.num_epochs == 1) return plan;
  const std::int64_t sans_final = ((plan.num_epochs - 1) * tokens_per_epoch - kExtra) / seq_length;
  const std::int64_t from_final = *num_samples - sans_final;
  const std::int64_t per_epoch = (tokens_per_epoch - kExtra) / seq_length;
  TRIDENT_ASSERT(from_final >= 0 && from_final <= per_epoch + 1,
                 "samples from the final epoch out of range: ", from_final);
  // int(0.80 * per_epoch): the double product truncated toward zero, as Python's int() does.
  const auto threshold =
      static_cast<std::int64_t>(last_epoch_cutoff * static_cast<double>(per_epoch));
  plan.separate_final_epoch = from_final < threshold;
  plan.num_samples_sans_final_epoch = sans_final;
  return plan;
}

std::vector<std::int32_t> build_document_index(std::int64_t begin, std::int64_t end,
                                               std::int64_t num_epochs, bool separate_final_epoch,
                                               Mt19937& rng) {
  auto epochs = [&](std::int64_t e) {
    std::vector<std::int32_t> idx;
    idx.reserve(static_cast<std::size_t>(e * (end - begin)));
    for (std::int64_t k = 0; k < e; ++k) {
      for (std::int64_t s = begin; s < end; ++s) idx.push_back(static_cast<std::int32_t>(s));
    }
    rng.shuffle(std::span<std::int32_t>(idx));
    return idx;
  };
  if (!separate_final_epoch || num_epochs == 1) return epochs(num_epochs);
  std::vector<std::int32_t> first = epochs(num_epochs - 1);
  const std::vector<std::int32_t> last = epochs(1);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

std::int64_t sample_index_num_samples(std::int64_t seq_length, std::int64_t num_epochs,
                                      std::int64_t tokens_per_epoch,
                                      bool drop_last_partial_sequence) {
  const std::int64_t tokens = num_epochs * tokens_per_epoch - kExtra;
  if (drop_last_partial_sequence) return tokens / seq_length;
  // helpers.cpp computes ceil(float(tokens) / seq_length) in single precision; so do we.
  return static_cast<std::int64_t>(
      std::ceil(static_cast<float>(tokens) / static_cast<float>(seq_length)));
}

namespace {

template <class T>
std::vector<T> walk_sample_index(std::span<const std::int32_t> sizes,
                                 std::span<const std::int32_t> document_index,
                                 std::int64_t seq_length, std::int64_t num_samples) {
  // Each sample needs seq_length + 1 tokens; the next sample starts on the last token of this
  // one (offset - 1 below). Rows are (position in document_index, offset in that sequence).
  std::vector<T> rows(static_cast<std::size_t>(2 * (num_samples + 1)));
  std::int64_t pos = 0, offset = 0;
  rows[0] = 0;
  rows[1] = 0;
  const auto last_pos = static_cast<std::int64_t>(document_index.size()) - 1;
  for (std::int64_t s = 1; s <= num_samples; ++s) {
    std::int64_t remaining = seq_length + kExtra;
    while (remaining != 0) {
      const std::int64_t doc_len =
          sizes[static_cast<std::size_t>(document_index[static_cast<std::size_t>(pos)])] - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        offset += remaining + doc_len - kExtra;
        remaining = 0;
      } else if (pos == last_pos) {
        // Out of documents: only the final, partial sample (drop_last_partial_sequence = false).
        TRIDENT_ASSERT(s == num_samples, "document index exhausted at sample ", s, " of ",
                       num_samples);
        offset =
            sizes[static_cast<std::size_t>(document_index[static_cast<std::size_t>(pos)])] - kExtra;
        break;
      } else {
        ++pos;
        offset = 0;
      }
    }
    rows[static_cast<std::size_t>(2 * s)] = static_cast<T>(pos);
    rows[static_cast<std::size_t>(2 * s + 1)] = static_cast<T>(offset);
  }
  return rows;
}

}  // namespace

IndexArray build_sample_index(std::span<const std::int32_t> sizes,
                              std::span<const std::int32_t> document_index, std::int64_t seq_length,
                              std::int64_t num_epochs, std::int64_t tokens_per_epoch,
                              bool drop_last_partial_sequence) {
  TRIDENT_ASSERT(!document_index.empty() && !sizes.empty(), "empty document index");
  const std::int64_t num_samples = sample_index_num_samples(
      seq_length, num_epochs, tokens_per_epoch, drop_last_partial_sequence);
  const std::int64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  const std::int64_t max_value =
      std::max<std::int64_t>(static_cast<std::int64_t>(document_index.size()), max_size);
  const std::vector<std::int64_t> shape{num_samples + 1, 2};
  if (max_value <= std::numeric_limits<std::int32_t>::max()) {
    return IndexArray::from_vector(
        walk_sample_index<std::int32_t>(sizes, document_index, seq_length, num_samples), shape);
  }
  return IndexArray::from_vector(
      walk_sample_index<std::int64_t>(sizes, document_index, seq_length, num_samples), shape);
}

IndexArray build_shuffle_index(std::int64_t num_samples, std::int64_t total_size, Mt19937& rng) {
  auto build = [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> idx(static_cast<std::size_t>(total_size));
    for (std::int64_t i = 0; i < total_size; ++i)
      idx[static_cast<std::size_t>(i)] = static_cast<T>(i);
    std::span<T> all(idx);
    rng.shuffle(all.first(static_cast<std::size_t>(num_samples)));
    if (total_size > num_samples) rng.shuffle(all.subspan(static_cast<std::size_t>(num_samples)));
    return IndexArray::from_vector(std::move(idx), {total_size});
  };
  const std::int64_t u32_max = std::numeric_limits<std::uint32_t>::max();
  if (total_size >= u32_max - 1) return build(std::int64_t{0});
  return build(std::uint32_t{0});
}

// ---------------------------------------------------------------------------------------------
// GPTDataset

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> dataset, std::int64_t begin,
                       std::int64_t end, GPTDatasetConfig cfg)
    : dataset_(std::move(dataset)), begin_(begin), end_(end), cfg_(std::move(cfg)) {
  TRIDENT_CHECK(dataset_ != nullptr, "GPTDataset needs an IndexedDataset");
  TRIDENT_CHECK(cfg_.sequence_length > 0, "--seq-length must be positive, got ",
                cfg_.sequence_length);
  TRIDENT_CHECK(cfg_.random_seed >= 0 && cfg_.random_seed <= 0xffffffffll,
                "--seed must be in [0, 2^32) (numpy's RandomState), got ", cfg_.random_seed);
  TRIDENT_CHECK(!cfg_.num_samples || *cfg_.num_samples >= 0, "number of samples for ",
                split_name(cfg_.index_split), " must be >= 0, got ", *cfg_.num_samples);
  TRIDENT_CHECK(0 <= begin_ && begin_ <= end_ && end_ <= dataset_->num_sequences(),
                "bad sequence range [", begin_, ", ", end_, ") of ", dataset_->prefix());
  TRIDENT_CHECK(!cfg_.bigscience || (cfg_.num_samples && !cfg_.bigscience_cache_stem.empty()),
                "a BigScience GPTDataset needs num_samples and a cache stem");

  // MegatronDataset.__init__: the identifiers, in this order, are the cache key.
  identifiers_["class"] = "GPTDataset";
  identifiers_["dataset_path"] = cfg_.dataset_path;
  identifiers_["num_samples"] =
      cfg_.num_samples ? nlohmann::ordered_json(*cfg_.num_samples) : nlohmann::ordered_json();
  identifiers_["index_split"] = split_name(cfg_.index_split);
  identifiers_["random_seed"] = cfg_.random_seed;
  identifiers_["sequence_length"] = cfg_.sequence_length;
  identifiers_["split"] =
      cfg_.split ? nlohmann::ordered_json(*cfg_.split) : nlohmann::ordered_json();
  identifiers_["split_matrix"] =
      cfg_.split_matrix ? split_matrix_json(*cfg_.split_matrix) : nlohmann::ordered_json();
  identifiers_["tokenizer"] = cfg_.tokenizer;
  description_ = python_json_dumps(identifiers_);
  hash_ = md5_hex(description_);

  for (std::int64_t s = begin_; s < end_; ++s) tokens_per_epoch_ += dataset_->sequence_length(s);
  if (tokens_per_epoch_ <= kExtra) {
    throw DataError(str(dataset_->prefix(), ": the ", split_name(cfg_.index_split),
                        " split (sequences [", begin_, ", ", end_, ") of ",
                        dataset_->num_sequences(), ") holds ", tokens_per_epoch_,
                        " tokens, too few for one sample; change --split or use more data"));
  }
  const EpochPlan plan = plan_epochs(tokens_per_epoch_, cfg_.sequence_length, cfg_.num_samples,
                                     cfg_.bigscience ? 0.95 : 0.80);
  num_epochs_ = plan.num_epochs;
  separate_final_epoch_ = plan.separate_final_epoch;
  num_samples_sans_final_epoch_ = plan.num_samples_sans_final_epoch;
  const bool drop_last = cfg_.bigscience || cfg_.index_split != Split::kValid ||
                         cfg_.drop_last_partial_validation_sequence;
  num_samples_ =
      sample_index_num_samples(cfg_.sequence_length, num_epochs_, tokens_per_epoch_, drop_last);

  const std::string what = cfg_.bigscience ? str("BigScience GPTDataset ", cfg_.bigscience_name)
                                           : str("GPTDataset ", split_name(cfg_.index_split));
  const bool cached = cfg_.bigscience || !cfg_.cache_dir.empty();
  core::Timer timer;
  if (cached && try_load_cache()) {
    source_ = IndexSource::kLoadedFromCache;
    log::info("data: ", what, " ", cfg_.dataset_path, ": loaded cached indices ", cache_file_stem(),
              "* (", num_samples_, " samples, ", num_epochs_, " epochs) in ", timer.elapsed_s(),
              " s");
    return;
  }
  if (cfg_.cache_mode == CacheMode::kLoadOnly) {
    throw DataError(str("no valid cached indices at ", cache_file_stem(), "* for the ", what,
                        " of ", cfg_.dataset_path,
                        "; rank 0 must build them first (same settings, "
                        "same --data-cache-path)"));
  }
  build_indices();
  source_ = IndexSource::kBuilt;
  const double build_s = timer.elapsed_s();
  if (cached) save_cache();
  log::info("data: ", what, " ", cfg_.dataset_path, ": built indices (", num_samples_, " samples, ",
            num_epochs_, " epochs", separate_final_epoch_ ? ", last epoch shuffled separately" : "",
            ") in ", build_s, " s", cached ? str("; saved to ", cache_file_stem(), "*") : "");
}

std::string GPTDataset::cache_file_stem() const {
  if (cfg_.bigscience) return cfg_.bigscience_cache_stem;
  return (std::filesystem::path(cfg_.cache_dir) /
          str(hash_, "-GPTDataset-", split_name(cfg_.index_split), "-"))
      .string();
}

bool GPTDataset::try_load_cache() {
  const std::string stem = cache_file_stem();
  const std::string desc_path = stem + "description.txt";
  const std::string doc_path = stem + (cfg_.bigscience ? "doc_idx.npy" : "document_index.npy");
  const std::string sample_path = stem + (cfg_.bigscience ? "sample_idx.npy" : "sample_index.npy");
  const std::string shuffle_path =
      stem + (cfg_.bigscience ? "shuffle_idx.npy" : "shuffle_index.npy");
  namespace fs = std::filesystem;
  std::error_code ec;
  // Megatron's cache-hit rule: all four files exist (BigScience's: the three arrays).
  if (!cfg_.bigscience && !fs::is_regular_file(desc_path, ec)) return false;
  for (const auto& p : {doc_path, sample_path, shuffle_path}) {
    if (!fs::is_regular_file(p, ec)) return false;
  }
  auto stale = [&](const std::string& why) {
    log::warn("data: ignoring cached GPTDataset indices ", stem, "*: ", why, "; rebuilding");
    return false;
  };
  // BigScience's cache has no description (its file name leaves out the document range and the
  // data): the array checks below are what tells a stale one.
  const auto text =
      cfg_.bigscience ? std::optional<std::string>(description_) : read_text_file(desc_path);
  if (!text || *text != description_) {
    return stale("its description differs from this dataset's (settings changed or file edited)");
  }
  try {
    IndexArray doc = IndexArray::map_npy(doc_path);
    IndexArray sample = IndexArray::map_npy(sample_path);
    IndexArray shuffle = IndexArray::map_npy(shuffle_path);
    const std::int64_t doc_len = num_epochs_ * (end_ - begin_);
    if (doc.dtype() != IndexDType::kI32 || doc.shape() != std::vector<std::int64_t>{doc_len}) {
      return stale(str("document_index is not int32 of length ", doc_len));
    }
    if ((sample.dtype() != IndexDType::kI32 && sample.dtype() != IndexDType::kI64) ||
        sample.shape() != std::vector<std::int64_t>{num_samples_ + 1, 2}) {
      return stale(str("sample_index is not (", num_samples_ + 1, ", 2) int32/int64"));
    }
    if ((shuffle.dtype() != IndexDType::kU32 && shuffle.dtype() != IndexDType::kI64) ||
        shuffle.shape() != std::vector<std::int64_t>{num_samples_}) {
      return stale(str("shuffle_index is not (", num_samples_, ",) uint32/int64"));
    }
    // The values too: a cache is used only if every sample it describes lies in this split.
    if (const std::string bad = check_cached_values(doc, sample, shuffle); !bad.empty()) {
      return stale(bad);
    }
    document_index_ = std::move(doc);
    sample_index_ = std::move(sample);
    shuffle_index_ = std::move(shuffle);
  } catch (const DataError& e) {
    return stale(e.what());
  }
  return true;
}

std::string GPTDataset::check_cached_values(const IndexArray& doc, const IndexArray& sample,
                                            const IndexArray& shuffle) const {
  const std::int64_t doc_len = doc.numel();
  for (std::int64_t k = 0; k < doc_len; ++k) {
    const std::int64_t seq = doc.at(k);
    if (seq < begin_ || seq >= end_) {
      return str("document_index[", k, "] = ", seq, " is not a sequence of the split [", begin_,
                 ", ", end_, ")");
    }
  }
  std::vector<char> seen(static_cast<std::size_t>(num_samples_), 0);
  for (std::int64_t i = 0; i < num_samples_; ++i) {
    const std::int64_t row = shuffle.at(i);
    if (row < 0 || row >= num_samples_ || seen[static_cast<std::size_t>(row)]) {
      return str("shuffle_index[", i, "] = ", row, " is not a permutation of [0, ", num_samples_,
                 ")");
    }
    seen[static_cast<std::size_t>(row)] = 1;
  }
  // Sample r runs from row r to row r + 1 of the sample index, as sample() reads it; rows never go
  // back, so this walks the document index once.
  const std::int64_t want = cfg_.sequence_length + kExtra;
  for (std::int64_t r = 0; r < num_samples_; ++r) {
    const std::int64_t beg_pos = sample.at(2 * r), beg_off = sample.at(2 * r + 1);
    const std::int64_t end_pos = sample.at(2 * r + 2), end_off = sample.at(2 * r + 3);
    const auto bad_row = [&] {
      return str("sample_index rows ", r, " and ", r + 1, " ([", beg_pos, ", ", beg_off, "], [",
                 end_pos, ", ", end_off, "]) do not describe a sample of ", want,
                 " tokens or fewer within the document index of length ", doc_len);
    };
    if (beg_pos < 0 || end_pos < beg_pos || end_pos >= doc_len) return bad_row();
    std::int64_t tokens = 0;
    for (std::int64_t p = beg_pos; p <= end_pos; ++p) {
      const std::int64_t len = dataset_->sequence_length(doc.at(p));
      const std::int64_t offset = p == beg_pos ? beg_off : 0;
      const std::int64_t count = p < end_pos ? len - offset : end_off + kExtra - offset;
      if (offset < 0 || offset > len || count < 0 || count > len - offset ||
          tokens + count > want) {
        return bad_row();
      }
      tokens += count;
    }
  }
  return "";
}

void GPTDataset::build_indices() {
  Mt19937 rng(static_cast<std::uint32_t>(cfg_.random_seed));
  std::vector<std::int32_t> doc =
      build_document_index(begin_, end_, num_epochs_, separate_final_epoch_, rng);
  const std::vector<std::int32_t> sizes = dataset_->sequence_lengths();
  const bool drop_last =
      cfg_.index_split != Split::kValid || cfg_.drop_last_partial_validation_sequence;
  sample_index_ = build_sample_index(sizes, doc, cfg_.sequence_length, num_epochs_,
                                     tokens_per_epoch_, drop_last);
  TRIDENT_ASSERT(sample_index_.shape()[0] == num_samples_ + 1, "sample index length mismatch");
  const std::int64_t first = separate_final_epoch_ ? num_samples_sans_final_epoch_ : num_samples_;
  shuffle_index_ = build_shuffle_index(first, num_samples_, rng);
  const auto doc_len = static_cast<std::int64_t>(doc.size());
  document_index_ = IndexArray::from_vector(std::move(doc), {doc_len});
}

void GPTDataset::save_cache() const {
  const std::string stem = cache_file_stem();
  if (cfg_.bigscience) {
    // doc_idx, sample_idx, shuffle_idx: BigScience's order; a crash before the last leaves no hit.
    write_npy(stem + "doc_idx.npy", document_index_);
    write_npy(stem + "sample_idx.npy", sample_index_);
    write_npy(stem + "shuffle_idx.npy", shuffle_index_);
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(cfg_.cache_dir, ec);
  if (ec) {
    throw DataError(str("cannot create the index cache directory ", cfg_.cache_dir, ": ",
                        ec.message(), "; pass --data-cache-path with a writable directory"));
  }
  write_npy(stem + "document_index.npy", document_index_);
  write_npy(stem + "sample_index.npy", sample_index_);
  write_npy(stem + "shuffle_index.npy", shuffle_index_);
  // Written last: a crash before this point leaves no description, hence no cache hit.
  write_text_file(stem + "description.txt", description_);
}

void GPTDataset::sample(std::int64_t i, std::span<std::int32_t> out) const {
  TRIDENT_ASSERT(0 <= i && i < num_samples_, "sample ", i, " out of range [0, ", num_samples_,
                 ") of ", describe());
  const std::int64_t want = cfg_.sequence_length + kExtra;
  TRIDENT_ASSERT(static_cast<std::int64_t>(out.size()) == want, "sample buffer holds ", out.size(),
                 " tokens, expected ", want);
  const std::int64_t row = shuffle_index_.at(i);
  const std::int64_t beg_pos = sample_index_.at(2 * row), beg_off = sample_index_.at(2 * row + 1);
  const std::int64_t end_pos = sample_index_.at(2 * row + 2);
  const std::int64_t end_off = sample_index_.at(2 * row + 3);
  std::int64_t written = 0;
  for (std::int64_t p = beg_pos; p <= end_pos; ++p) {
    const std::int64_t seq = document_index_.at(p);
    const std::int64_t offset = p == beg_pos ? beg_off : 0;
    const std::int64_t count =
        p < end_pos ? dataset_->sequence_length(seq) - offset : end_off + kExtra - offset;
    TRIDENT_ASSERT(count >= 0 && written + count <= want, "sample ", i,
                   " overruns: ", written + count, " > ", want, " tokens");
    if (count > 0) dataset_->read(seq, offset, count, out.data() + written);
    written += count;
  }
  std::fill(out.begin() + written, out.end(), cfg_.pad_id);
}

std::string GPTDataset::describe() const {
  return str(
      cfg_.bigscience ? "BigScience GPTDataset(" + cfg_.bigscience_name + ", " : "GPTDataset(",
      cfg_.dataset_path, ", ", split_name(cfg_.index_split), ", sequences [", begin_, ", ", end_,
      "), ", num_samples_, " samples, ", num_epochs_, " epochs, seq_length ", cfg_.sequence_length,
      ", seed ", cfg_.random_seed,
      cfg_.bigscience ? str(", cache ", cfg_.bigscience_cache_stem, "*") : str(", hash ", hash_),
      ")");
}

}  // namespace trident::data
