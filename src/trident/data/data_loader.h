// Which samples each data-parallel rank reads at each step, in Megatron's order: the batch-size
// schedule (megatron-core's num-microbatches calculator, with --rampup-batch-size) and the
// MegatronPretrainingSampler slicing. The loader's whole state is consumed_samples, so a resumed
// run that restores it reads exactly the samples the uninterrupted run would have read.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trident/data/sample_dataset.h"

namespace trident::data {

// --rampup-batch-size START INCREMENT SAMPLES.
struct RampupBatchSize {
  std::int64_t start = 0;      // global batch size at consumed_samples = 0
  std::int64_t increment = 0;  // added at each stage
  std::int64_t samples = 0;    // samples over which the ramp runs
};

// One stage of --step-batch-size-schedule: from `threshold` consumed samples on, the global batch
// size is `batch_size` (until the next stage's threshold).
struct StepBatchStage {
  std::int64_t threshold = 0;  // in samples (tokens are converted by the parser)
  std::int64_t batch_size = 0;
};

// Megatron-LM's --step-batch-size-schedule grammar (megatron-core >= 0.18,
// StepBatchsizeNumMicroBatchesCalculator._parse_schedule): entries "THRESHOLD:BATCH_SIZE"
// separated by spaces or commas; each number is a Python float with an optional suffix K, M, B or
// T (case-insensitive; 1e3, 1e6, 1e9, 1e12), truncated to an integer after the multiplication
// (int(float(x) * multiplier)). With seq_length (Megatron always passes --seq-length), thresholds
// are tokens and become samples by floor division; without, they are samples. The stages are
// sorted by threshold. Throws InvalidArgument naming --step-batch-size-schedule and the entry for
// text that is not such an entry, a first threshold that is not 0, thresholds that are not strictly
// increasing once in samples (two token thresholds within one sample of each other), or a batch
// size that is not positive.
std::vector<StepBatchStage> parse_step_batch_size_schedule(const std::string& schedule,
                                                           std::optional<std::int64_t> seq_length);

struct BatchScheduleConfig {
  std::int64_t global_batch_size = 0;   // --global-batch-size (after the ramp)
  std::int64_t micro_batch_size = 0;    // --micro-batch-size
  std::int64_t data_parallel_size = 1;  // dp size
  std::optional<RampupBatchSize> rampup;
  // --step-batch-size-schedule, parsed (see parse_step_batch_size_schedule); excludes rampup and
  // decrease_batch_size_if_needed. global_batch_size is then not a stage of the schedule (Megatron
  // sets it to micro_batch_size * data_parallel_size; it only sizes evaluation).
  std::vector<StepBatchStage> step_schedule;
  // --decrease-batch-size-if-needed: round a global batch down to a multiple of
  // micro_batch_size * data_parallel_size instead of rejecting it.
  bool decrease_batch_size_if_needed = false;
};

// One step's batch sizes.
struct StepBatch {
  std::int64_t global_batch_size = 0;          // the schedule's global batch size
  std::int64_t running_global_batch_size = 0;  // samples this step consumes (<= the above)
  std::int64_t num_micro_batches = 0;          // per data-parallel rank
};

// Megatron's Constant/RampupBatchsize/StepBatchsizeNumMicroBatchesCalculator as a pure function
// of consumed_samples. With a ramp of n = (global - start) / increment stages, the global batch
// size is start + increment * int(consumed / (samples / n)) while consumed <= samples, and global
// after. With a step schedule it is the batch size of the last stage whose threshold is <=
// consumed.
class BatchSchedule {
 public:
  // Throws InvalidArgument (naming --global-batch-size, --micro-batch-size,
  // --rampup-batch-size or --step-batch-size-schedule) for sizes that are not positive, a ramp that
  // does not reach the global batch size in whole increments, or a batch size on the schedule that
  // is not a multiple of micro_batch_size * data_parallel_size (unless
  // decrease_batch_size_if_needed). A step schedule's stages are checked by check_from().
  explicit BatchSchedule(const BatchScheduleConfig& cfg);

  StepBatch at(std::int64_t consumed_samples) const;
  // For a step schedule: the stages a run that has consumed `consumed_samples` will still reach
  // must be multiples of micro_batch_size * data_parallel_size and must not shrink (Megatron
  // asserts both when training reaches such a stage; earlier stages may have been trained with
  // another data-parallel size, which Megatron allows). Throws InvalidArgument naming the stage.
  // No-op for the other schedules (checked by the constructor).
  void check_from(std::int64_t consumed_samples) const;
  // Megatron's update_train_iters for a sample-based run with a step schedule: iterations until
  // the consumed samples reach train_samples (the last one may overshoot it).
  std::int64_t iterations_for_samples(std::int64_t train_samples) const;
  // The samples `iterations` training steps consume from consumed = 0.
  std::int64_t samples_for_iterations(std::int64_t iterations) const;
  // The schedule for the start-up log (Megatron's lines); empty without a step schedule.
  std::string describe_step_schedule(std::optional<std::int64_t> seq_length) const;
  const BatchScheduleConfig& config() const { return cfg_; }

 private:
  StepBatch make(std::int64_t global_batch_size) const;

  BatchScheduleConfig cfg_;
  double rampup_samples_per_increment_ = 0;
};

// MegatronPretrainingSampler: the first sample id of micro-batch j of data-parallel rank r in the
// global batch that starts at consumed_samples; that micro-batch is [first, first + mbs).
//   first = consumed_samples + j * mbs * dp + r * mbs
std::int64_t micro_batch_first_sample(std::int64_t consumed_samples, std::int64_t micro_batch,
                                      std::int64_t dp_rank, std::int64_t micro_batch_size,
                                      std::int64_t data_parallel_size);

struct DataLoaderConfig {
  BatchScheduleConfig schedule;
  std::int64_t dp_rank = 0;  // this rank's data-parallel index, 0 <= dp_rank < dp size
};

// One data-parallel rank's view of a dataset, step by step. Not thread-safe (one per rank).
class DataLoader {
 public:
  // Starts at consumed_samples (0, or the value restored from a checkpoint). Throws
  // InvalidArgument for a bad rank or schedule, or when consumed_samples is not below the
  // dataset's size (Megatron's "no samples left to consume").
  DataLoader(std::shared_ptr<const SampleDataset> dataset, DataLoaderConfig cfg,
             std::int64_t consumed_samples);

  std::int64_t consumed_samples() const { return consumed_; }
  StepBatch current_step() const { return schedule_.at(consumed_); }
  // Whether the dataset still holds a full global batch for the current step.
  bool has_next_step() const;
  // Sample ids of this rank's micro-batch j (0 <= j < num_micro_batches) of the current step.
  std::vector<std::int64_t> micro_batch_sample_ids(std::int64_t j) const;
  // Writes micro-batch j as micro_batch_size rows of seq_length + 1 tokens (row-major) into out.
  void read_micro_batch(std::int64_t j, std::span<std::int32_t> out) const;
  // Moves to the next step: consumed_samples += running_global_batch_size.
  void advance();

  const SampleDataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const SampleDataset> dataset_;
  DataLoaderConfig cfg_;
  BatchSchedule schedule_;
  std::int64_t consumed_ = 0;
};

}  // namespace trident::data
