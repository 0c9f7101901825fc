// SequentialDataset: samples of seq_length + 1 tokens taken in file order from a range of
// sequences of an IndexedDataset, consecutive samples sharing one boundary token (as Megatron's
// sample index does), with no shuffling. Used by `--dataloader-type sequential-file`, by tests
// and by tools that want the corpus in order; Megatron's shuffled GPTDataset is the default.
#pragma once

#include <memory>
#include <vector>

#include "trident/data/indexed_dataset.h"
#include "trident/data/sample_dataset.h"

namespace trident::data {

class SequentialDataset : public SampleDataset {
 public:
  // Sequences [first_sequence, last_sequence) of `dataset`. Throws DataError when they hold
  // fewer than seq_length + 1 tokens.
  SequentialDataset(std::shared_ptr<const IndexedDataset> dataset, std::int64_t first_sequence,
                    std::int64_t last_sequence, std::int64_t seq_length);

  std::int64_t num_samples() const override { return num_samples_; }
  std::int64_t seq_length() const override { return seq_length_; }
  void sample(std::int64_t i, std::span<std::int32_t> out) const override;
  std::string describe() const override;

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
  std::int64_t first_ = 0, last_ = 0, seq_length_ = 0, num_samples_ = 0;
  std::vector<std::int64_t> cumulative_;  // tokens before sequence first_ + j
};

}  // namespace trident::data
