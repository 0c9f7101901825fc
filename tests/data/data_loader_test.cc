// The data loader: which samples each data-parallel rank reads per step (Megatron's
// MegatronPretrainingSampler order, closed-form expectations), exact resume from
// consumed_samples, and the --rampup-batch-size and --step-batch-size-schedule schedules against
// megatron-core's own num-microbatches calculators
// (tests/data/reference/megatron_batch_schedule.py, run here: 0.16.1's for the ramp, 0.19.2's
// StepBatchsizeNumMicroBatchesCalculator for the step schedule, read from the pinned wheel because
// 0.16.1 predates it).
#include "trident/data/data_loader.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "reference/reference_util.h"
#include "trident/core/error.h"

namespace trident::data {
namespace {

namespace fs = std::filesystem;

// Sample i is (i, i+1, ..., i+L): every token says which sample it came from.
class CountingDataset : public SampleDataset {
 public:
  CountingDataset(std::int64_t n, std::int64_t seq) : n_(n), seq_(seq) {}
  std::int64_t num_samples() const override { return n_; }
  std::int64_t seq_length() const override { return seq_; }
  void sample(std::int64_t i, std::span<std::int32_t> out) const override {
    for (std::size_t t = 0; t < out.size(); ++t) out[t] = static_cast<std::int32_t>(i + t);
  }
  std::string describe() const override { return "CountingDataset"; }

 private:
  std::int64_t n_, seq_;
};

BatchScheduleConfig schedule(std::int64_t gbs, std::int64_t mbs, std::int64_t dp) {
  return BatchScheduleConfig{.global_batch_size = gbs,
                             .micro_batch_size = mbs,
                             .data_parallel_size = dp,
                             .rampup = std::nullopt,
                             .step_schedule = {}};
}

TEST(DataLoader, RanksSliceEachGlobalBatchAsMegatron) {
  const auto ds = std::make_shared<CountingDataset>(1000, 4);
  const std::int64_t gbs = 24, mbs = 3, dp = 4;  // 2 micro-batches per rank per step
  std::vector<DataLoader> ranks;
  for (std::int64_t r = 0; r < dp; ++r) {
    ranks.emplace_back(ds, DataLoaderConfig{.schedule = schedule(gbs, mbs, dp), .dp_rank = r}, 0);
  }
  for (int step = 0; step < 5; ++step) {
    std::set<std::int64_t> seen;
    for (std::int64_t r = 0; r < dp; ++r) {
      DataLoader& l = ranks[static_cast<std::size_t>(r)];
      ASSERT_EQ(l.current_step().num_micro_batches, 2);
      for (std::int64_t j = 0; j < 2; ++j) {
        const auto ids = l.micro_batch_sample_ids(j);
        ASSERT_EQ(ids.size(), 3u);
        for (std::int64_t k = 0; k < mbs; ++k) {
          // consumed + j * mbs * dp + r * mbs + k
          EXPECT_EQ(ids[static_cast<std::size_t>(k)], step * gbs + j * mbs * dp + r * mbs + k);
          seen.insert(ids[static_cast<std::size_t>(k)]);
        }
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(mbs * 5));
        l.read_micro_batch(j, tokens);
        for (std::int64_t k = 0; k < mbs; ++k) {
          EXPECT_EQ(tokens[static_cast<std::size_t>(k * 5)], ids[static_cast<std::size_t>(k)]);
        }
      }
    }
    // The ranks together read exactly the global batch [step * gbs, (step + 1) * gbs).
    ASSERT_EQ(seen.size(), static_cast<std::size_t>(gbs));
    EXPECT_EQ(*seen.begin(), step * gbs);
    EXPECT_EQ(*seen.rbegin(), (step + 1) * gbs - 1);
    for (auto& l : ranks) l.advance();
  }
  EXPECT_EQ(ranks[0].consumed_samples(), 5 * gbs);
  EXPECT_EQ(micro_batch_first_sample(100, 2, 1, 4, 8), 100 + 2 * 4 * 8 + 1 * 4);
}

TEST(DataLoader, ResumeFromConsumedSamplesContinuesExactly) {
  const auto ds = std::make_shared<CountingDataset>(100000, 8);
  BatchScheduleConfig sched = schedule(64, 2, 2);
  sched.rampup = RampupBatchSize{.start = 16, .increment = 16, .samples = 500};
  const DataLoaderConfig cfg{.schedule = sched, .dp_rank = 1};
  auto read_step = [](const DataLoader& l) {
    std::vector<std::int32_t> all;
    const std::int64_t mbs = l.current_step().num_micro_batches;
    for (std::int64_t j = 0; j < mbs; ++j) {
      std::vector<std::int32_t> t(2 * 9);
      l.read_micro_batch(j, t);
      all.insert(all.end(), t.begin(), t.end());
    }
    return all;
  };
  DataLoader uninterrupted(ds, cfg, 0);
  std::vector<std::vector<std::int32_t>> reference;
  for (int step = 0; step < 40; ++step) {
    reference.push_back(read_step(uninterrupted));
    uninterrupted.advance();
  }
  for (int stop : {1, 7, 13, 30}) {
    DataLoader first(ds, cfg, 0);
    for (int s = 0; s < stop; ++s) first.advance();
    DataLoader resumed(ds, cfg, first.consumed_samples());  // what a checkpoint stores
    for (int s = stop; s < 40; ++s) {
      ASSERT_EQ(read_step(resumed), reference[static_cast<std::size_t>(s)])
          << "stop " << stop << " step " << s;
      resumed.advance();
    }
  }
}

TEST(DataLoader, StopsBeforeAPartialGlobalBatch) {
  const auto ds = std::make_shared<CountingDataset>(50, 4);
  DataLoader l(ds, DataLoaderConfig{.schedule = schedule(16, 4, 2), .dp_rank = 0}, 0);
  int steps = 0;
  while (l.has_next_step()) {
    l.advance();
    ++steps;
  }
  EXPECT_EQ(steps, 3);  // 48 of 50 samples; the last 2 are dropped, as Megatron's sampler does
}

TEST(BatchSchedule, RampupClosedForm) {
  // 16 -> 64 in steps of 16: 3 increments over 300 samples, one per 100 samples.
  BatchScheduleConfig cfg = schedule(64, 2, 2);
  cfg.rampup = RampupBatchSize{.start = 16, .increment = 16, .samples = 300};
  const BatchSchedule s(cfg);
  EXPECT_EQ(s.at(0).global_batch_size, 16);
  EXPECT_EQ(s.at(0).num_micro_batches, 4);
  EXPECT_EQ(s.at(99).global_batch_size, 16);
  EXPECT_EQ(s.at(100).global_batch_size, 32);
  EXPECT_EQ(s.at(250).global_batch_size, 48);
  EXPECT_EQ(s.at(300).global_batch_size, 64);  // int(300 / 100) = 3 increments
  EXPECT_EQ(s.at(301).global_batch_size, 64);
  EXPECT_EQ(s.at(301).num_micro_batches, 16);
}

TEST(BatchSchedule, MatchesMegatronCoreCalculator) {
  const testing::TempDir tmp;
  const fs::path dir(tmp.path());

  std::vector<BatchScheduleConfig> configs;
  configs.push_back(schedule(512, 4, 8));  // constant
  BatchScheduleConfig c = schedule(1536, 2, 16);
  c.rampup = RampupBatchSize{.start = 32, .increment = 32, .samples = 300000};  // GPT-3 style
  configs.push_back(c);
  c = schedule(100, 1, 4);
  c.rampup = RampupBatchSize{.start = 4, .increment = 12, .samples = 997};  // uneven stage length
  configs.push_back(c);
  c = schedule(96, 4, 3);
  c.rampup = RampupBatchSize{.start = 16, .increment = 16, .samples = 1000};
  c.decrease_batch_size_if_needed = true;  // 16, 32, 64, 80 are not multiples of 12
  configs.push_back(c);

  nlohmann::json spec;
  spec["cases"] = nlohmann::json::array();
  std::vector<std::int64_t> consumed;
  for (std::int64_t v = 0; v < 320000; v += 997) consumed.push_back(v);
  for (std::int64_t v :
       {1, 2, 99, 100, 101, 332, 333, 334, 996, 997, 998, 1000, 1001, 299999, 300000, 300001}) {
    consumed.push_back(v);
  }
  for (const auto& cfg : configs) {
    nlohmann::json j;
    j["global_batch_size"] = cfg.global_batch_size;
    j["micro_batch_size"] = cfg.micro_batch_size;
    j["data_parallel_size"] = cfg.data_parallel_size;
    j["rampup"] =
        cfg.rampup
            ? nlohmann::json::array({cfg.rampup->start, cfg.rampup->increment, cfg.rampup->samples})
            : nlohmann::json();
    j["decrease_batch_size_if_needed"] = cfg.decrease_batch_size_if_needed;
    j["consumed"] = consumed;
    j["train_steps"] = 400;
    spec["cases"].push_back(j);
  }
  std::ofstream(dir / "spec.json") << spec.dump();
  ASSERT_TRUE(testing::run_reference("megatron_batch_schedule.py",
                                     {(dir / "spec.json").string(), (dir / "out.json").string()}));
  std::ifstream in(dir / "out.json");
  const nlohmann::json out = nlohmann::json::parse(in);
  ASSERT_EQ(out.size(), configs.size());
  for (std::size_t k = 0; k < configs.size(); ++k) {
    SCOPED_TRACE("config " + std::to_string(k));
    const BatchSchedule s(configs[k]);
    const auto& at = out[k].at("at");
    ASSERT_EQ(at.size(), consumed.size());
    for (std::size_t i = 0; i < consumed.size(); ++i) {
      const StepBatch b = s.at(consumed[i]);
      ASSERT_EQ(b.global_batch_size, at[i][0].get<std::int64_t>()) << "consumed " << consumed[i];
      ASSERT_EQ(b.running_global_batch_size, at[i][1].get<std::int64_t>()) << consumed[i];
      ASSERT_EQ(b.num_micro_batches, at[i][2].get<std::int64_t>()) << consumed[i];
    }
    // The training loop's consumed-samples sequence, step by step, as a DataLoader advances.
    const auto ds = std::make_shared<CountingDataset>(std::int64_t{1} << 40, 4);
    DataLoader loader(ds, DataLoaderConfig{.schedule = configs[k], .dp_rank = 0}, 0);
    for (const auto& row : out[k].at("loop")) {
      ASSERT_EQ(loader.consumed_samples(), row[0].get<std::int64_t>());
      ASSERT_EQ(loader.current_step().running_global_batch_size, row[2].get<std::int64_t>());
      ASSERT_EQ(loader.current_step().num_micro_batches, row[3].get<std::int64_t>());
      loader.advance();
    }
  }
}

template <class F>
void expect_invalid(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(BatchSchedule, BadInputsGiveClearErrors) {
  expect_invalid([] { BatchSchedule s(schedule(10, 4, 2)); }, "--global-batch-size");
  expect_invalid([] { BatchSchedule s(schedule(0, 4, 2)); }, "--global-batch-size");
  expect_invalid([] { BatchSchedule s(schedule(8, 0, 2)); }, "--micro-batch-size");
  auto ramp = [](std::int64_t start, std::int64_t inc, std::int64_t samples) {
    BatchScheduleConfig c = schedule(64, 2, 2);
    c.rampup = RampupBatchSize{.start = start, .increment = inc, .samples = samples};
    return c;
  };
  expect_invalid([&] { BatchSchedule s(ramp(16, 20, 100)); }, "multiple of the increment");
  expect_invalid([&] { BatchSchedule s(ramp(64, 16, 100)); }, "must be below");
  expect_invalid([&] { BatchSchedule s(ramp(16, 16, 0)); }, "must all be positive");
  expect_invalid([&] { BatchSchedule s(ramp(6, 2, 100)); }, "a stage of --rampup-batch-size");
  const auto ds = std::make_shared<CountingDataset>(100, 4);
  expect_invalid([&] { DataLoader l(ds, {.schedule = schedule(8, 2, 2), .dp_rank = 2}, 0); },
                 "data-parallel rank");
  expect_invalid([&] { DataLoader l(ds, {.schedule = schedule(8, 2, 2), .dp_rank = 0}, 100); },
                 "no samples left");
}

// The step schedule's grammar, string by string, against megatron-core 0.19.2's _parse_schedule
// and _validate_schedule: the same stages (thresholds in samples) or both refuse.
TEST(StepBatchSchedule, GrammarMatchesMegatronCore) {
  const testing::TempDir tmp;
  const fs::path dir(tmp.path());
  const std::vector<std::pair<std::string, std::optional<std::int64_t>>> inputs = {
      {"0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536", 2048},  // GPT-3 175B example
      {"0:768 250B:1536 500B:3072 750B:6144", 4096},
      {"0:768 61035156250:1536", std::nullopt},  // thresholds in samples
      {"0:16,2.4b:320 , 4.8B:624", 2048},        // commas, lower case
      {"  0:8   1k:16\t2.5K:32 ", 16},
      {"1M:64 0:32 3m:128", 1000},          // unsorted
      {"0:1.5k 1T:3K", 100},                // suffixed, fractional batch sizes
      {"0:16.9 100.7:24.2", std::nullopt},  // truncated toward zero
      {"0:2 1e3:4 2.5e3:8", 3},
      {"0:4 2_000:8", 10},            // digit underscores, as float() takes them
      {"0:16 2047:32", 2048},         // 2047 tokens are 0 samples: not strictly increasing
      {"5:16 100:32", std::nullopt},  // no stage at 0
      {"0:16 100:0", std::nullopt},   // batch size 0
      {"0:16 100:-8", std::nullopt},
      {"0:16 100", std::nullopt},     // no colon
      {"0:16 abc:32", std::nullopt},  // not a number
      {"0:16 1Q:32", std::nullopt},
      {"", std::nullopt},
      {"0:16 100:32 100:64", std::nullopt},  // repeated threshold
      {"0:16 1:2:3", std::nullopt},
  };
  nlohmann::json spec;
  spec["cases"] = nlohmann::json::array();
  spec["parse"] = nlohmann::json::array();
  for (const auto& [text, seq] : inputs) {
    spec["parse"].push_back({text, seq ? nlohmann::json(*seq) : nlohmann::json()});
  }
  std::ofstream(dir / "spec.json") << spec.dump();
  ASSERT_TRUE(testing::run_reference("megatron_batch_schedule.py",
                                     {(dir / "spec.json").string(), (dir / "out.json").string()}));
  std::ifstream in(dir / "out.json");
  const nlohmann::json out = nlohmann::json::parse(in).at("parse");
  ASSERT_EQ(out.size(), inputs.size());
  int refused = 0;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    SCOPED_TRACE("schedule \"" + inputs[k].first + "\"");
    const nlohmann::json& ref = out[k];
    if (ref.is_string()) {
      ++refused;
      try {
        (void)parse_step_batch_size_schedule(inputs[k].first, inputs[k].second);
        ADD_FAILURE() << "trident accepted what megatron-core refuses: " << ref.get<std::string>();
      } catch (const core::InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("--step-batch-size-schedule"), std::string::npos)
            << e.what();
      }
      continue;
    }
    const std::vector<StepBatchStage> got =
        parse_step_batch_size_schedule(inputs[k].first, inputs[k].second);
    ASSERT_EQ(got.size(), ref.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].threshold, ref[i][0].get<std::int64_t>()) << "stage " << i;
      EXPECT_EQ(got[i].batch_size, ref[i][1].get<std::int64_t>()) << "stage " << i;
    }
  }
  EXPECT_EQ(refused, 10) << "the refused inputs above must be refused by megatron-core too";
}

// The schedule as a function of consumed samples, the training loop's steps, and Megatron-LM's
// iteration count for --train-samples, against megatron-core 0.19.2's calculator.
TEST(StepBatchSchedule, MatchesMegatronCoreCalculator) {
  const testing::TempDir tmp;
  const fs::path dir(tmp.path());
  struct Case {
    std::string schedule;
    std::optional<std::int64_t> seq_length;
    std::int64_t mbs, dp, train_samples, steps;
  };
  const std::vector<Case> cases = {
      {"0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536", 2048, 1, 8, 20'000'000, 78'000},
      {"0:8 1000:24 1500:24 4000:96", std::nullopt, 2, 4, 12'345, 3000},
      {"0:4 100K:12 250K:36", 64, 1, 4, 9'000, 3000},
  };
  std::vector<std::int64_t> consumed;
  for (std::int64_t v = 0; v < 7'000'000; v += 99'991) consumed.push_back(v);
  for (std::int64_t v : {1, 999, 1000, 1001, 1499, 1500, 1562, 1563, 3906, 3907, 1'171'874,
                         1'171'875, 1'171'876, 5'859'375})
    consumed.push_back(v);
  nlohmann::json spec;
  spec["cases"] = nlohmann::json::array();
  spec["step_cases"] = nlohmann::json::array();
  for (const Case& c : cases) {
    spec["step_cases"].push_back(
        {{"schedule", c.schedule},
         {"seq_length", c.seq_length ? nlohmann::json(*c.seq_length) : nlohmann::json()},
         {"micro_batch_size", c.mbs},
         {"data_parallel_size", c.dp},
         {"consumed", consumed},
         {"train_steps", c.steps},
         {"train_samples", c.train_samples}});
  }
  std::ofstream(dir / "spec.json") << spec.dump();
  ASSERT_TRUE(testing::run_reference("megatron_batch_schedule.py",
                                     {(dir / "spec.json").string(), (dir / "out.json").string()}));
  std::ifstream in(dir / "out.json");
  const nlohmann::json out = nlohmann::json::parse(in).at("step_cases");
  ASSERT_EQ(out.size(), cases.size());
  for (std::size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("schedule \"" + cases[k].schedule + "\"");
    BatchScheduleConfig cfg = schedule(cases[k].mbs * cases[k].dp, cases[k].mbs, cases[k].dp);
    cfg.step_schedule = parse_step_batch_size_schedule(cases[k].schedule, cases[k].seq_length);
    ASSERT_EQ(cfg.step_schedule.size(), out[k].at("stages").size());
    const BatchSchedule s(cfg);
    s.check_from(0);
    const auto& at = out[k].at("at");
    ASSERT_EQ(at.size(), consumed.size());
    for (std::size_t i = 0; i < consumed.size(); ++i) {
      const StepBatch b = s.at(consumed[i]);
      ASSERT_EQ(b.global_batch_size, at[i][0].get<std::int64_t>()) << "consumed " << consumed[i];
      ASSERT_EQ(b.running_global_batch_size, at[i][1].get<std::int64_t>()) << consumed[i];
      ASSERT_EQ(b.num_micro_batches, at[i][2].get<std::int64_t>()) << consumed[i];
    }
    const auto ds = std::make_shared<CountingDataset>(std::int64_t{1} << 40, 4);
    DataLoader loader(ds, DataLoaderConfig{.schedule = cfg, .dp_rank = 0}, 0);
    std::set<std::int64_t> sizes;
    for (const auto& row : out[k].at("loop")) {
      ASSERT_EQ(loader.consumed_samples(), row[0].get<std::int64_t>());
      ASSERT_EQ(loader.current_step().global_batch_size, row[1].get<std::int64_t>());
      ASSERT_EQ(loader.current_step().num_micro_batches, row[3].get<std::int64_t>());
      sizes.insert(loader.current_step().global_batch_size);
      loader.advance();
    }
    EXPECT_GE(sizes.size(), 3u) << "the loop must cross stages to test anything";
    // The samples consumed before step k, computed stage by stage.
    const auto& loop = out[k].at("loop");
    for (std::size_t step :
         {std::size_t{0}, std::size_t{1}, loop.size() / 3, loop.size() / 2, loop.size() - 1}) {
      EXPECT_EQ(s.samples_for_iterations(static_cast<std::int64_t>(step)),
                loop[step][0].get<std::int64_t>())
          << "after " << step << " steps";
    }
    EXPECT_EQ(s.iterations_for_samples(cases[k].train_samples),
              out[k].at("train_iters_for_samples").get<std::int64_t>());
  }
}

TEST(StepBatchSchedule, BadInputsGiveClearErrors) {
  auto cfg = [](const std::string& text, std::int64_t mbs, std::int64_t dp) {
    BatchScheduleConfig c = schedule(mbs * dp, mbs, dp);
    c.step_schedule = parse_step_batch_size_schedule(text, std::nullopt);
    return c;
  };
  // 12 is not a multiple of 8: refused at start-up, naming the stage.
  expect_invalid([&] { BatchSchedule(cfg("0:8 100:12 200:16", 2, 4)).check_from(0); },
                 "the stage from 100 samples has global batch size 12");
  // Past that stage (resumed with another data-parallel size), it no longer matters.
  EXPECT_NO_THROW(BatchSchedule(cfg("0:8 100:12 200:16", 2, 4)).check_from(200));
  expect_invalid([&] { BatchSchedule(cfg("0:16 100:8", 1, 1)).check_from(0); }, "would shrink");
  EXPECT_NO_THROW(BatchSchedule(cfg("0:16 100:8", 1, 1)).check_from(100));
  BatchScheduleConfig both = cfg("0:8 100:16", 1, 1);
  both.rampup = RampupBatchSize{.start = 4, .increment = 4, .samples = 100};
  expect_invalid([&] { BatchSchedule s(both); }, "not both");
  BatchScheduleConfig decrease = cfg("0:8 100:16", 1, 1);
  decrease.decrease_batch_size_if_needed = true;
  expect_invalid([&] { BatchSchedule s(decrease); }, "--decrease-batch-size-if-needed");
  expect_invalid([] { (void)parse_step_batch_size_schedule("0:16 1X:32", 2048); },
                 "\"1X\" in \"1X:32\" is not a number");
  expect_invalid([] { (void)parse_step_batch_size_schedule("0:16 1000:32", 2048); },
                 "strictly increasing, got 0 before 0 samples (thresholds are tokens");
  // The schedule as Megatron logs it.
  EXPECT_EQ(BatchSchedule(cfg("0:16 1171875:320", 1, 8)).describe_step_schedule(2048),
            "step batch size schedule (2 steps):\n"
            "  >= 0 tokens (0 samples) -> batch_size=16, num_microbatches=2\n"
            "  >= 2,400,000,000 tokens (1,171,875 samples) -> batch_size=320, "
            "num_microbatches=40");
}

}  // namespace
}  // namespace trident::data
