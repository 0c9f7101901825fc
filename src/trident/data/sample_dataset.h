// SampleDataset: what the trainer reads. Sample i is seq_length + 1 consecutive token ids (inputs
// are the first seq_length, labels the last seq_length), as Megatron's GPTDataset returns them.
// Implementations: GPTDataset (Megatron's shuffled document/sample/shuffle indices), the
// BlendedDataset (a weighted mix), and SequentialDataset (samples in file order).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace trident::data {

class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual std::int64_t num_samples() const = 0;
  virtual std::int64_t seq_length() const = 0;
  // Writes the seq_length + 1 tokens of sample i (0 <= i < num_samples()) into out. Tokens past
  // the end of a short final sample are set to pad_id (and their labels are masked by the loader).
  virtual void sample(std::int64_t i, std::span<std::int32_t> out) const = 0;
  virtual std::string describe() const = 0;
};

}  // namespace trident::data
