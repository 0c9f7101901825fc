// Batch-size schedule (Megatron's num-microbatches calculators) and per-rank sample slicing
// (MegatronPretrainingSampler); see data_loader.h.
#include "trident/data/data_loader.h"

#include "trident/core/error.h"

namespace trident::data {

BatchSchedule::BatchSchedule(const BatchScheduleConfig& cfg) : cfg_(cfg) {
  TRIDENT_CHECK(cfg_.global_batch_size > 0, "--global-batch-size must be positive, got ",
                cfg_.global_batch_size);
  TRIDENT_CHECK(cfg_.micro_batch_size > 0, "--micro-batch-size must be positive, got ",
                cfg_.micro_batch_size);
  TRIDENT_CHECK(cfg_.data_parallel_size > 0, "data-parallel size must be positive, got ",
                cfg_.data_parallel_size);
  const std::int64_t unit = cfg_.micro_batch_size * cfg_.data_parallel_size;
  std::vector<std::int64_t> stages{cfg_.global_batch_size};
  if (cfg_.rampup) {
    const RampupBatchSize& r = *cfg_.rampup;
    TRIDENT_CHECK(r.start > 0 && r.increment > 0 && r.samples > 0,
                  "--rampup-batch-size START INCREMENT SAMPLES must all be positive, got ", r.start,
                  " ", r.increment, " ", r.samples);
    const std::int64_t diff = cfg_.global_batch_size - r.start;
    TRIDENT_CHECK(diff > 0, "--rampup-batch-size start (", r.start,
                  ") must be below --global-batch-size (", cfg_.global_batch_size,
                  "); drop --rampup-batch-size for a constant batch size");
    TRIDENT_CHECK(diff % r.increment == 0, "--rampup-batch-size: global batch size ",
                  cfg_.global_batch_size, " minus start ", r.start, " (", diff,
                  ") must be a multiple of the increment ", r.increment);
    const std::int64_t num_increments = diff / r.increment;
    rampup_samples_per_increment_ =
        static_cast<double>(r.samples) / static_cast<double>(num_increments);
    for (std::int64_t k = 0; k < num_increments; ++k) stages.push_back(r.start + k * r.increment);
  }
  for (std::int64_t gbs : stages) {
    if (cfg_.decrease_batch_size_if_needed) {
      TRIDENT_CHECK(gbs >= unit, "global batch size ", gbs, " is below micro_batch_size (",
                    cfg_.micro_batch_size, ") * data-parallel size (", cfg_.data_parallel_size,
                    ")");
    } else {
      TRIDENT_CHECK(gbs % unit == 0, "global batch size ", gbs,
                    cfg_.rampup ? " (a stage of --rampup-batch-size)" : " (--global-batch-size)",
                    " is not a multiple of --micro-batch-size (", cfg_.micro_batch_size,
                    ") * data-parallel size (", cfg_.data_parallel_size,
                    "); change it or pass --decrease-batch-size-if-needed");
    }
  }
}

StepBatch BatchSchedule::make(std::int64_t global_batch_size) const {
  const std::int64_t unit = cfg_.micro_batch_size * cfg_.data_parallel_size;
  StepBatch b;
  b.global_batch_size = global_batch_size;
  b.running_global_batch_size = global_batch_size;
  if (cfg_.decrease_batch_size_if_needed)
    b.running_global_batch_size = global_batch_size / unit * unit;
  b.num_micro_batches = b.running_global_batch_size / unit;
  return b;
}

StepBatch BatchSchedule::at(std::int64_t consumed_samples) const {
  TRIDENT_CHECK(consumed_samples >= 0, "consumed samples must be >= 0, got ", consumed_samples);
  if (!cfg_.rampup || consumed_samples > cfg_.rampup->samples) return make(cfg_.global_batch_size);
  // int(consumed / rampup_samples_per_increment): a double quotient truncated, as in Python.
  const auto steps = static_cast<std::int64_t>(static_cast<double>(consumed_samples) /
                                               rampup_samples_per_increment_);
  return make(cfg_.rampup->start + steps * cfg_.rampup->increment);
}

std::int64_t micro_batch_first_sample(std::int64_t consumed_samples, std::int64_t micro_batch,
                                      std::int64_t dp_rank, std::int64_t micro_batch_size,
                                      std::int64_t data_parallel_size) {
  return consumed_samples + micro_batch * micro_batch_size * data_parallel_size +
         dp_rank * micro_batch_size;
}

DataLoader::DataLoader(std::shared_ptr<const SampleDataset> dataset, DataLoaderConfig cfg,
                       std::int64_t consumed_samples)
    : dataset_(std::move(dataset)),
      cfg_(cfg),
      schedule_(cfg.schedule),
      consumed_(consumed_samples) {
  TRIDENT_CHECK(dataset_ != nullptr, "the data loader needs a dataset");
  TRIDENT_CHECK(0 <= cfg_.dp_rank && cfg_.dp_rank < cfg_.schedule.data_parallel_size,
                "data-parallel rank ", cfg_.dp_rank, " is outside [0, ",
                cfg_.schedule.data_parallel_size, ")");
  TRIDENT_CHECK(consumed_ >= 0 && consumed_ < dataset_->num_samples(),
                "no samples left to consume: consumed samples ", consumed_, ", dataset has ",
                dataset_->num_samples(), " (", dataset_->describe(), ")");
}

bool DataLoader::has_next_step() const {
  return consumed_ + current_step().running_global_batch_size <= dataset_->num_samples();
}

std::vector<std::int64_t> DataLoader::micro_batch_sample_ids(std::int64_t j) const {
  const StepBatch step = current_step();
  TRIDENT_CHECK(0 <= j && j < step.num_micro_batches, "micro-batch ", j, " is outside [0, ",
                step.num_micro_batches, ")");
  const std::int64_t mbs = cfg_.schedule.micro_batch_size;
  const std::int64_t first =
      micro_batch_first_sample(consumed_, j, cfg_.dp_rank, mbs, cfg_.schedule.data_parallel_size);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(mbs));
  for (std::int64_t k = 0; k < mbs; ++k) ids[static_cast<std::size_t>(k)] = first + k;
  return ids;
}

void DataLoader::read_micro_batch(std::int64_t j, std::span<std::int32_t> out) const {
  const std::int64_t row = dataset_->seq_length() + 1;
  const std::int64_t mbs = cfg_.schedule.micro_batch_size;
  TRIDENT_CHECK(static_cast<std::int64_t>(out.size()) == mbs * row, "micro-batch buffer holds ",
                out.size(), " tokens, expected micro_batch_size * (seq_length + 1) = ", mbs * row);
  const std::vector<std::int64_t> ids = micro_batch_sample_ids(j);
  for (std::int64_t k = 0; k < mbs; ++k) {
    const std::int64_t id = ids[static_cast<std::size_t>(k)];
    TRIDENT_CHECK(id < dataset_->num_samples(), "sample ", id, " is past the end of ",
                  dataset_->describe(), "; check has_next_step() before reading");
    dataset_->sample(id,
                     out.subspan(static_cast<std::size_t>(k * row), static_cast<std::size_t>(row)));
  }
}

void DataLoader::advance() { consumed_ += current_step().running_global_batch_size; }

}  // namespace trident::data
