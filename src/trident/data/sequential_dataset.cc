#include "trident/data/sequential_dataset.h"

#include <algorithm>

#include "trident/core/error.h"

namespace trident::data {

SequentialDataset::SequentialDataset(std::shared_ptr<const IndexedDataset> dataset,
                                     std::int64_t first_sequence, std::int64_t last_sequence,
                                     std::int64_t seq_length)
    : dataset_(std::move(dataset)), first_(first_sequence), last_(last_sequence),
      seq_length_(seq_length) {
  TRIDENT_CHECK(0 <= first_ && first_ <= last_ && last_ <= dataset_->num_sequences(),
                "bad sequence range [", first_, ", ", last_, ") of ", dataset_->prefix());
  cumulative_.assign(1, 0);
  for (std::int64_t s = first_; s < last_; ++s) {
    cumulative_.push_back(cumulative_.back() + dataset_->sequence_length(s));
  }
  const std::int64_t tokens = cumulative_.back();
  if (tokens < seq_length_ + 1) {
    throw core::DataError(core::str(dataset_->prefix(), ": sequences [", first_, ", ", last_,
                                    ") hold ", tokens, " tokens, fewer than one sample of ",
                                    seq_length_ + 1, " (--seq-length + 1); use more data or a "
                                    "shorter --seq-length"));
  }
  num_samples_ = (tokens - 1) / seq_length_;
}

void SequentialDataset::sample(std::int64_t i, std::span<std::int32_t> out) const {
  TRIDENT_ASSERT(0 <= i && i < num_samples_, "sample ", i, " out of range ", num_samples_);
  TRIDENT_ASSERT(static_cast<std::int64_t>(out.size()) == seq_length_ + 1, "bad sample buffer");
  std::int64_t pos = i * seq_length_;  // first token, in tokens of the range
  std::int64_t need = seq_length_ + 1, written = 0;
  auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), pos);
  std::int64_t j = (it - cumulative_.begin()) - 1;
  while (need > 0) {
    const std::int64_t seq = first_ + j;
    const std::int64_t offset = pos - cumulative_[static_cast<std::size_t>(j)];
    const std::int64_t avail = dataset_->sequence_length(seq) - offset;
    const std::int64_t take = std::min(avail, need);
    if (take > 0) {
      dataset_->read(seq, offset, take, out.data() + written);
      written += take;
      need -= take;
      pos += take;
    }
    ++j;
  }
}

std::string SequentialDataset::describe() const {
  return core::str("SequentialDataset(", dataset_->prefix(), ", sequences [", first_, ", ", last_,
                   "), seq_length ", seq_length_, ", ", num_samples_, " samples)");
}

}  // namespace trident::data
