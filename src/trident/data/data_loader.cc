// Batch-size schedule (Megatron's num-microbatches calculators) and per-rank sample slicing
// (MegatronPretrainingSampler); see data_loader.h.
#include "trident/data/data_loader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "trident/core/error.h"
#include "trident/data/dataset_split.h"

namespace trident::data {

using core::str;

namespace {

constexpr const char* kStepFlag = "--step-batch-size-schedule";

// StepBatchsizeNumMicroBatchesCalculator._parse_numeric_value: strip, upper-case, an optional
// suffix K/M/B/T, then int(float(rest) * multiplier) (truncated toward zero).
std::int64_t parse_schedule_number(const std::string& entry, std::string text) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && space(text.front())) text.erase(text.begin());
  while (!text.empty() && space(text.back())) text.pop_back();
  double multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'T':
      case 't':
        multiplier = 1e12;
        break;
      case 'B':
      case 'b':
        multiplier = 1e9;
        break;
      case 'M':
      case 'm':
        multiplier = 1e6;
        break;
      case 'K':
      case 'k':
        multiplier = 1e3;
        break;
      default:
        break;
    }
    if (multiplier != 1) text.pop_back();
  }
  // Python's float() takes '_' between digits ("2_400").
  std::string digits;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool between = text[i] == '_' && i > 0 && i + 1 < text.size() &&
                         std::isdigit(static_cast<unsigned char>(text[i - 1])) &&
                         std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (!between) digits += text[i];
  }
  const std::optional<double> v = parse_python_float(digits);
  TRIDENT_CHECK(v.has_value(), kStepFlag, ": \"", text, "\" in \"", entry,
                "\" is not a number (write THRESHOLD:BATCH_SIZE with numbers such as 2.4B:320, "
                "suffixes K, M, B, T)");
  const double x = *v * multiplier;
  TRIDENT_CHECK(std::abs(x) < 9.2e18, kStepFlag, ": \"", entry, "\": ", x, " is too large");
  return static_cast<std::int64_t>(x);  // int(): toward zero
}

// Python's {:,} for an integer.
std::string with_commas(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

}  // namespace

std::vector<StepBatchStage> parse_step_batch_size_schedule(const std::string& schedule,
                                                           std::optional<std::int64_t> seq_length) {
  TRIDENT_CHECK(!seq_length || *seq_length > 0, kStepFlag, " needs a positive --seq-length");
  std::string text = schedule;
  std::replace(text.begin(), text.end(), ',', ' ');
  std::vector<StepBatchStage> stages;
  std::size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    const std::string entry = text.substr(i, j - i);
    i = j;
    const std::size_t colon = entry.find(':');
    TRIDENT_CHECK(colon != std::string::npos, kStepFlag, ": invalid entry \"", entry,
                  "\"; expected THRESHOLD:BATCH_SIZE, e.g. \"0:16 2.4B:320\"");
    StepBatchStage st;
    st.threshold = parse_schedule_number(entry, entry.substr(0, colon));
    st.batch_size = parse_schedule_number(entry, entry.substr(colon + 1));
    if (seq_length) {  // tokens -> samples, Python's floor division
      const std::int64_t q = st.threshold / *seq_length;
      st.threshold = (st.threshold % *seq_length != 0 && st.threshold < 0) ? q - 1 : q;
    }
    stages.push_back(st);
  }
  TRIDENT_CHECK(!stages.empty(), kStepFlag, " \"", schedule,
                "\" holds no stage; give THRESHOLD:BATCH_SIZE pairs, e.g. \"0:16 2.4B:320\"");
  std::stable_sort(
      stages.begin(), stages.end(),
      [](const StepBatchStage& a, const StepBatchStage& b) { return a.threshold < b.threshold; });
  const char* unit = seq_length ? " samples (thresholds are tokens, divided by --seq-length)" : "";
  TRIDENT_CHECK(stages[0].threshold == 0, kStepFlag, " \"", schedule,
                "\": the first stage must start at 0, got ", stages[0].threshold, unit);
  for (std::size_t k = 1; k < stages.size(); ++k) {
    TRIDENT_CHECK(stages[k].threshold > stages[k - 1].threshold, kStepFlag, " \"", schedule,
                  "\": thresholds must be strictly increasing, got ", stages[k - 1].threshold,
                  " before ", stages[k].threshold, unit);
  }
  for (const StepBatchStage& st : stages) {
    TRIDENT_CHECK(st.batch_size > 0, kStepFlag, " \"", schedule,
                  "\": batch sizes must be positive, got ", st.batch_size);
  }
  return stages;
}

BatchSchedule::BatchSchedule(const BatchScheduleConfig& cfg) : cfg_(cfg) {
  TRIDENT_CHECK(cfg_.global_batch_size > 0, "--global-batch-size must be positive, got ",
                cfg_.global_batch_size);
  TRIDENT_CHECK(cfg_.micro_batch_size > 0, "--micro-batch-size must be positive, got ",
                cfg_.micro_batch_size);
  TRIDENT_CHECK(cfg_.data_parallel_size > 0, "data-parallel size must be positive, got ",
                cfg_.data_parallel_size);
  const std::int64_t unit = cfg_.micro_batch_size * cfg_.data_parallel_size;
  if (!cfg_.step_schedule.empty()) {
    TRIDENT_CHECK(!cfg_.rampup, "give --step-batch-size-schedule or --rampup-batch-size, not both");
    TRIDENT_CHECK(!cfg_.decrease_batch_size_if_needed,
                  "--step-batch-size-schedule cannot be combined with "
                  "--decrease-batch-size-if-needed (as in Megatron-LM)");
    TRIDENT_CHECK(cfg_.step_schedule.front().threshold == 0, kStepFlag,
                  ": the first stage must start at 0");
    for (std::size_t k = 0; k < cfg_.step_schedule.size(); ++k) {
      TRIDENT_CHECK(cfg_.step_schedule[k].batch_size > 0, kStepFlag,
                    ": batch sizes must be positive");
      TRIDENT_CHECK(k == 0 || cfg_.step_schedule[k].threshold > cfg_.step_schedule[k - 1].threshold,
                    kStepFlag, ": thresholds must be strictly increasing");
    }
  }
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
  if (!cfg_.step_schedule.empty()) {
    std::int64_t bs = cfg_.step_schedule.front().batch_size;
    for (const StepBatchStage& st : cfg_.step_schedule) {
      if (consumed_samples < st.threshold) break;
      bs = st.batch_size;
    }
    return make(bs);
  }
  if (!cfg_.rampup || consumed_samples > cfg_.rampup->samples) return make(cfg_.global_batch_size);
  // int(consumed / rampup_samples_per_increment): a double quotient truncated, as in Python.
  const auto steps = static_cast<std::int64_t>(static_cast<double>(consumed_samples) /
                                               rampup_samples_per_increment_);
  return make(cfg_.rampup->start + steps * cfg_.rampup->increment);
}

void BatchSchedule::check_from(std::int64_t consumed_samples) const {
  const std::vector<StepBatchStage>& st = cfg_.step_schedule;
  if (st.empty()) return;
  const std::int64_t unit = cfg_.micro_batch_size * cfg_.data_parallel_size;
  std::size_t current = 0;
  while (current + 1 < st.size() && st[current + 1].threshold <= consumed_samples) ++current;
  for (std::size_t k = current; k < st.size(); ++k) {
    TRIDENT_CHECK(st[k].batch_size % unit == 0, kStepFlag, ": the stage from ", st[k].threshold,
                  " samples has global batch size ", st[k].batch_size,
                  ", not a multiple of --micro-batch-size (", cfg_.micro_batch_size,
                  ") * data-parallel size (", cfg_.data_parallel_size,
                  "); change the schedule or the layout");
    TRIDENT_CHECK(k == current || st[k].batch_size >= st[k - 1].batch_size, kStepFlag,
                  ": the global batch size would shrink from ", st[k - 1].batch_size, " to ",
                  st[k].batch_size, " at ", st[k].threshold,
                  " samples; Megatron stops there (the number of micro-batches must not "
                  "decrease), so give a schedule whose batch sizes grow");
  }
}

// Both walk the schedule stage by stage (steps of one batch size at a time), not step by step:
// a schedule of 16-sample batches over 10^12 samples is counted at once.
namespace {
// The consumed samples at which the batch size after `consumed` may change (the next stage's
// threshold), or INT64_MAX.
std::int64_t next_threshold(const std::vector<StepBatchStage>& st, std::int64_t consumed) {
  for (const StepBatchStage& s : st) {
    if (s.threshold > consumed) return s.threshold;
  }
  return std::numeric_limits<std::int64_t>::max();
}
}  // namespace

std::int64_t BatchSchedule::iterations_for_samples(std::int64_t train_samples) const {
  using i128 = __int128;
  std::int64_t iterations = 0;
  i128 consumed = 0;
  while (consumed < train_samples) {
    const auto c = static_cast<std::int64_t>(consumed);
    const std::int64_t b = at(c).global_batch_size;
    const i128 limit = std::min<i128>(train_samples, next_threshold(cfg_.step_schedule, c));
    const i128 steps = cfg_.step_schedule.empty() ? 1 : (limit - consumed + b - 1) / b;
    consumed += steps * b;
    iterations += static_cast<std::int64_t>(steps);
  }
  return iterations;
}

std::int64_t BatchSchedule::samples_for_iterations(std::int64_t iterations) const {
  using i128 = __int128;
  i128 consumed = 0;
  std::int64_t done = 0;
  const i128 cap = std::numeric_limits<std::int64_t>::max();
  while (done < iterations && consumed < cap) {
    const auto c = static_cast<std::int64_t>(consumed);
    const std::int64_t b = at(c).running_global_batch_size;
    const i128 in_stage = cfg_.step_schedule.empty()
                              ? 1
                              : (next_threshold(cfg_.step_schedule, c) - consumed + b - 1) / b;
    const i128 steps = std::min<i128>(in_stage, iterations - done);
    consumed += steps * b;
    done += static_cast<std::int64_t>(steps);
  }
  return static_cast<std::int64_t>(std::min(consumed, cap));
}

std::string BatchSchedule::describe_step_schedule(std::optional<std::int64_t> seq_length) const {
  if (cfg_.step_schedule.empty()) return "";
  const std::int64_t unit = cfg_.micro_batch_size * cfg_.data_parallel_size;
  std::string s = str("step batch size schedule (", cfg_.step_schedule.size(), " steps):");
  for (const StepBatchStage& st : cfg_.step_schedule) {
    const std::string from = seq_length ? str(with_commas(st.threshold * *seq_length), " tokens (",
                                              with_commas(st.threshold), " samples)")
                                        : str(with_commas(st.threshold), " samples");
    s += str("\n  >= ", from, " -> batch_size=", st.batch_size,
             ", num_microbatches=", st.batch_size / unit);
  }
  return s;
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
