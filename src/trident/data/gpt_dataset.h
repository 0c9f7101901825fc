// GPTDataset: Megatron's shuffled view of one split of an IndexedDataset. Three index arrays
// (document, sample and shuffle index) turn sample i into a span of seq_length + 1 tokens; they are
// the same arrays megatron-core's GPTDataset builds for the same settings, and they are cached as
// the same .npy files under the same MD5-derived names, so either side can load the other's cache.
// The rules (epochs, separate last epoch, sample index walk) are in docs/data-indices.md.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trident/data/dataset_split.h"
#include "trident/data/index_cache.h"
#include "trident/data/indexed_dataset.h"
#include "trident/data/mt19937.h"
#include "trident/data/sample_dataset.h"

namespace trident::data {

// What to do when no valid cache is found.
enum class CacheMode : std::uint8_t {
  kBuildIfMissing,  // build the indices (and save them when a cache directory is set)
  kLoadOnly,        // throw DataError: for ranks that wait while rank 0 builds the cache
};

// Where a dataset's indices came from (for logs and tests).
enum class IndexSource : std::uint8_t { kBuilt, kLoadedFromCache };

struct GPTDatasetConfig {
  std::string dataset_path;  // the prefix as given; part of the description
  Split index_split = Split::kTrain;
  std::optional<std::int64_t> num_samples;     // samples requested; nullopt = exactly one epoch
  std::int64_t random_seed = 1234;             // --seed, 0 <= seed < 2^32
  std::int64_t sequence_length = 0;            // --seq-length (each sample holds one token more)
  std::optional<std::string> split;            // --split as typed; nullopt for per-split paths
  std::optional<SplitMatrix> split_matrix;     // from `split`; nullopt for per-split paths
  nlohmann::ordered_json tokenizer = nullptr;  // the tokenizer's unique identifiers (or null)
  std::string cache_dir;                       // where the .npy files live; empty = do not cache
  CacheMode cache_mode = CacheMode::kBuildIfMissing;
  std::int32_t pad_id = -1;  // fills the tail of a short final sample
  // Megatron's drop_last_partial_validation_sequence (valid split only): when false the valid
  // split keeps a last, padded, partial sample. Not part of Megatron's description hash, so a
  // cache built with the other setting is recognised by its array lengths instead.
  bool drop_last_partial_validation_sequence = true;
  // BigScience Megatron-DeepSpeed's GPTDataset (--*-weighted-split-paths, megatron/data/
  // gpt_dataset.py) instead of megatron-core's: the last epoch is shuffled apart below 95% of an
  // epoch (not 80%), a last partial sample is always dropped (valid too), num_samples must be
  // set, and the cache is BigScience's: no description, the files <stem>doc_idx.npy,
  // <stem>sample_idx.npy and <stem>shuffle_idx.npy with bigscience_cache_stem =
  // "<dir>/<prefix>_<group name>_indexmap_<N>ns_<L>sl_<seed>s_" (cache_dir is not used).
  bool bigscience = false;
  std::string bigscience_name;        // the group name, for logs
  std::string bigscience_cache_stem;  // required when bigscience
};

class GPTDataset : public SampleDataset {
 public:
  // Exposes sequences [begin, end) of `dataset` (the split's range). Loads the indices from
  // cfg.cache_dir when a cache with the same description and consistent arrays is there, otherwise
  // builds them (and writes them there), logging which happened. Throws InvalidArgument for bad
  // settings and DataError for an empty range, an unwritable cache directory, or a missing cache
  // in CacheMode::kLoadOnly.
  GPTDataset(std::shared_ptr<const IndexedDataset> dataset, std::int64_t begin, std::int64_t end,
             GPTDatasetConfig cfg);

  std::int64_t num_samples() const override { return num_samples_; }
  std::int64_t seq_length() const override { return cfg_.sequence_length; }
  // Tokens from row shuffle_index[i] to the next row of the sample index, as Megatron's
  // _query_document_sample_shuffle_indices; a short final sample is padded with pad_id.
  // Thread-safe.
  void sample(std::int64_t i, std::span<std::int32_t> out) const override;
  std::string describe() const override;

  const GPTDatasetConfig& config() const { return cfg_; }
  // Megatron's unique_identifiers / unique_description / unique_description_hash.
  const nlohmann::ordered_json& unique_identifiers() const { return identifiers_; }
  const std::string& unique_description() const { return description_; }
  const std::string& unique_description_hash() const { return hash_; }

  const IndexArray& document_index() const { return document_index_; }  // (E * |range|,) int32
  const IndexArray& sample_index() const { return sample_index_; }      // (num_samples + 1, 2)
  const IndexArray& shuffle_index() const { return shuffle_index_; }    // (num_samples,)
  std::int64_t num_epochs() const { return num_epochs_; }
  IndexSource index_source() const { return source_; }
  // "<cache_dir>/<hash>-GPTDataset-<split>-" (the cache file names append "description.txt", ...);
  // BigScience's bigscience_cache_stem with cfg.bigscience.
  std::string cache_file_stem() const;

 private:
  bool try_load_cache();
  // Why cached arrays of the right shapes cannot be this dataset's indices ("" when they can):
  // sequence ids outside the split, a shuffle that is no permutation, samples whose rows leave
  // the document index or the sequences, or hold more than seq_length + 1 tokens.
  std::string check_cached_values(const IndexArray& doc, const IndexArray& sample,
                                  const IndexArray& shuffle) const;
  void build_indices();
  void save_cache() const;

  std::shared_ptr<const IndexedDataset> dataset_;
  std::int64_t begin_ = 0, end_ = 0;
  GPTDatasetConfig cfg_;
  nlohmann::ordered_json identifiers_;
  std::string description_, hash_;
  std::int64_t tokens_per_epoch_ = 0, num_epochs_ = 0, num_samples_ = 0;
  bool separate_final_epoch_ = false;
  std::int64_t num_samples_sans_final_epoch_ = 0;
  IndexArray document_index_, sample_index_, shuffle_index_;
  IndexSource source_ = IndexSource::kBuilt;
};

// ---- The index-building steps, exposed for tests and tools. --------------------------------

// How many epochs a request needs and whether the last one is shuffled on its own
// (GPTDataset._get_num_epochs and the separate-final-epoch rule of
// _build_document_sample_shuffle_indices).
struct EpochPlan {
  std::int64_t num_epochs = 1;
  bool separate_final_epoch = false;
  std::int64_t num_samples_sans_final_epoch = 0;  // only meaningful when separated
};
// num_epochs = smallest E >= 1 with E * tokens_per_epoch >= num_samples * seq_length + 1 (1 when
// num_samples is nullopt). For E > 1 the last epoch is separate iff the samples it must supply,
// num_samples - ((E-1) * T - 1) // L, are fewer than int(0.8 * ((T - 1) // L)).
// last_epoch_cutoff: megatron-core's 0.80; BigScience's Megatron-DeepSpeed uses 0.95.
EpochPlan plan_epochs(std::int64_t tokens_per_epoch, std::int64_t seq_length,
                      std::optional<std::int64_t> num_samples, double last_epoch_cutoff = 0.80);

// The document index: sequence ids begin..end-1 repeated num_epochs times (epoch-major), as int32,
// shuffled with `rng`; when separated, the first E-1 epochs and the last one are shuffled apart
// and concatenated.
std::vector<std::int32_t> build_document_index(std::int64_t begin, std::int64_t end,
                                               std::int64_t num_epochs, bool separate_final_epoch,
                                               Mt19937& rng);

// helpers.cpp build_sample_idx with add_extra_token_to_sequence = 1: rows (position in the
// document index, token offset) where each sample starts, shape (num_samples + 1, 2); consecutive
// samples share one token. int32 when max(len(document_index), max(sizes)) fits, else int64.
// `sizes` are the lengths of all sequences of the dataset.
IndexArray build_sample_index(std::span<const std::int32_t> sizes,
                              std::span<const std::int32_t> document_index, std::int64_t seq_length,
                              std::int64_t num_epochs, std::int64_t tokens_per_epoch,
                              bool drop_last_partial_sequence);

// The number of samples build_sample_index produces (the same formula, without building).
std::int64_t sample_index_num_samples(std::int64_t seq_length, std::int64_t num_epochs,
                                      std::int64_t tokens_per_epoch,
                                      bool drop_last_partial_sequence);

// arange(num_samples) shuffled, then (if total_size > num_samples) arange(num_samples,
// total_size) shuffled, concatenated; uint32 unless total_size >= 2^32 - 2, then int64.
IndexArray build_shuffle_index(std::int64_t num_samples, std::int64_t total_size, Mt19937& rng);

}  // namespace trident::data
