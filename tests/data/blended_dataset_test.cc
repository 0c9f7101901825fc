// Blending rules in closed form (the greedy largest-deficit order, exhaustive blends), split and
// blend-list parsing, BlendedDataset caching and its errors. Parity of whole blends with
// megatron-core is in gpt_dataset_test.cc (MegatronParity.BlendedDatasetIndicesMatchMegatronCore).
#include "trident/data/blended_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "trident/core/error.h"
#include "trident/data/dataset_builder.h"
#include "trident/data/dataset_split.h"
#include "trident/data/indexed_dataset.h"

namespace trident::data {
namespace {

namespace fs = std::filesystem;

fs::path make_temp_dir(const std::string& tag) {
  std::string pattern = (fs::temp_directory_path() / ("trident-" + tag + "-XXXXXX")).string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return fs::path(pattern);
}

// A small dataset whose tokens encode (dataset tag, sequence, position): tag * 100000 + seq * 100
// + position, so a sample shows where it came from.
std::string write_tagged_dataset(const fs::path& dir, const std::string& name, int tag,
                                 int num_sequences) {
  const std::string prefix = (dir / name).string();
  IndexedDatasetBuilder b(prefix, TokenDType::kI32);
  for (int s = 0; s < num_sequences; ++s) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(20 + (s * 7) % 30));
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      tokens[t] = tag * 100000 + s * 100 + static_cast<std::int32_t>(t);
    }
    b.add_sequence(tokens);
    b.end_document();
  }
  b.finalize();
  return prefix;
}

TEST(Blending, GreedyLargestDeficitOrder) {
  const std::vector<double> w{0.5, 0.3, 0.2};
  const BlendingIndices b = build_blending_indices(w, 10);
  EXPECT_EQ(b.dataset_index, (std::vector<std::int16_t>{0, 1, 2, 0, 1, 0, 2, 0, 1, 0}));
  EXPECT_EQ(b.dataset_sample_index, (std::vector<std::int64_t>{0, 0, 0, 1, 1, 2, 1, 3, 2, 4}));
}

TEST(Blending, CountsFollowTheWeights) {
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<double> u(0.01, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> w(static_cast<std::size_t>(2 + trial % 5));
    for (auto& x : w) x = u(gen);
    w = normalize_weights(w);
    const std::int64_t size = 1000 + 137 * trial;
    const BlendingIndices b = build_blending_indices(w, size);
    std::vector<std::int64_t> count(w.size(), 0);
    for (std::int64_t k = 0; k < size; ++k) {
      const auto d = static_cast<std::size_t>(b.dataset_index[static_cast<std::size_t>(k)]);
      // Each dataset's samples are taken in order 0, 1, 2, ...
      ASSERT_EQ(b.dataset_sample_index[static_cast<std::size_t>(k)], count[d]);
      ++count[d];
    }
    for (std::size_t d = 0; d < w.size(); ++d) {
      EXPECT_LE(std::abs(static_cast<double>(count[d]) - w[d] * static_cast<double>(size)), 1.0)
          << "trial " << trial << " dataset " << d;
    }
  }
}

TEST(Blending, ExhaustiveTakesExactlyEverySample) {
  const std::vector<std::int64_t> sizes{7, 1, 30, 12};
  const BlendingIndices b = build_exhaustive_blending_indices(sizes);
  ASSERT_EQ(b.dataset_index.size(), 50u);
  std::vector<std::int64_t> next(4, 0);
  for (std::size_t k = 0; k < 50; ++k) {
    const auto d = static_cast<std::size_t>(b.dataset_index[k]);
    EXPECT_EQ(b.dataset_sample_index[k], next[d]++);
  }
  EXPECT_EQ(next, sizes);
}

TEST(SplitParsing, MegatronRules) {
  const auto v = parse_split("969, 30, 1");
  EXPECT_DOUBLE_EQ(v[0], 0.969);
  EXPECT_DOUBLE_EQ(v[2], 0.001);
  EXPECT_EQ(parse_split("98/2/0"), parse_split("98,2,0"));
  EXPECT_EQ(parse_split("100"), (std::array<double, 3>{1.0, 0.0, 0.0}));
  const SplitMatrix m = split_matrix_from_vector(parse_split("98,2,0"));
  ASSERT_TRUE(m[0] && m[1]);
  EXPECT_FALSE(m[2].has_value());  // empty split: no dataset
  EXPECT_EQ(split_matrix_json(m).dump(), "[[0,0.98],[0.98,1.0],null]");
  // Python's round(): half to even. 0.5 * 5 = 2.5 -> 2, 0.5 * 7 = 3.5 -> 4.
  EXPECT_EQ(split_range(SplitBookends{0.0, 0.5}, 5), (std::pair<std::int64_t, std::int64_t>{0, 2}));
  EXPECT_EQ(split_range(SplitBookends{0.5, 1.0}, 7), (std::pair<std::int64_t, std::int64_t>{4, 7}));
  EXPECT_THROW(parse_split("1.2.3"), core::InvalidArgument);
  EXPECT_THROW(parse_split("1,1,1,1"), core::InvalidArgument);
  EXPECT_THROW(parse_split("0,0"), core::InvalidArgument);
}

TEST(BlendParsing, MegatronRules) {
  const Blend weighted = parse_blend({"0.3", " a ", "70", "b"}, "--data-path");
  EXPECT_EQ(weighted.prefixes, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(weighted.weights.has_value());
  EXPECT_EQ(*weighted.weights, (std::vector<double>{0.3, 70.0}));
  EXPECT_EQ(normalize_weights(*weighted.weights)[1], 70.0 / 70.3);
  const Blend prefixes = parse_blend({"a", "b"}, "--data-path");
  EXPECT_EQ(prefixes.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(prefixes.weights.has_value());
  EXPECT_FALSE(parse_blend({"a", "b", "c"}, "--data-path").weights.has_value());
  EXPECT_THROW(parse_blend({}, "--data-path"), core::InvalidArgument);
  EXPECT_THROW(parse_blend({"0.5", "a", "b", "c"}, "--data-path"), core::InvalidArgument);
  EXPECT_THROW(parse_blend({"0", "a", "1", "b"}, "--data-path"), core::InvalidArgument);
  EXPECT_THROW(parse_blend({"nan", "a", "1", "b"}, "--data-path"), core::InvalidArgument);
  // The surplus rule: ceil(ceil(target * w) * 1.005).
  EXPECT_EQ(blend_samples_for_dataset(1000, 0.3, 0.005), 302);
  EXPECT_EQ(blend_samples_for_dataset(1000, 0.3, 0.0), 300);
}

TEST(BlendedDataset, SamplesComeFromTheIndexedDatasets) {
  const fs::path dir = make_temp_dir("blend-samples");
  const std::string a = write_tagged_dataset(dir, "a", 1, 60);
  const std::string b = write_tagged_dataset(dir, "b", 2, 40);
  DatasetBuildConfig cfg;
  cfg.data_path = {"0.25", a, "0.75", b};
  cfg.split = "1,0,0";
  cfg.seq_length = 16;
  cfg.num_samples = {200, std::nullopt, std::nullopt};
  cfg.data_cache_path = (dir / "cache").string();
  const TrainValidTestDatasets ds = build_train_valid_test_datasets(cfg);
  const auto* blend = dynamic_cast<const BlendedDataset*>(ds.train.get());
  ASSERT_NE(blend, nullptr);
  EXPECT_EQ(blend->num_samples(), 50 + 150);  // ceil(200 * 0.25) + ceil(200 * 0.75)
  // Each mid-level dataset was asked for its share plus the 0.5% surplus.
  EXPECT_EQ(blend->datasets()[0]->config().num_samples, 51);
  EXPECT_EQ(blend->datasets()[1]->config().num_samples, 151);
  std::vector<std::int32_t> t(17), u(17);
  std::int64_t from_b = 0;
  for (std::int64_t i = 0; i < blend->num_samples(); ++i) {
    blend->sample(i, t);
    const auto d = blend->dataset_index().at(i);
    blend->datasets()[static_cast<std::size_t>(d)]->sample(blend->dataset_sample_index().at(i), u);
    ASSERT_EQ(t, u);
    EXPECT_EQ(t[0] / 100000, d + 1) << "sample " << i;
    from_b += d;
  }
  EXPECT_EQ(from_b, 150);
  fs::remove_all(dir);
}

TEST(BlendedDataset, CachedUnderDataCachePathOnly) {
  const fs::path dir = make_temp_dir("blend-cache");
  const std::string a = write_tagged_dataset(dir, "a", 1, 60);
  const std::string b = write_tagged_dataset(dir, "b", 2, 40);
  DatasetBuildConfig cfg;
  cfg.data_path = {"1", a, "3", b};
  cfg.split = "9,1,0";
  cfg.seq_length = 8;
  cfg.num_samples = {300, 20, 0};
  cfg.data_cache_path = (dir / "cache").string();
  const auto first = build_train_valid_test_datasets(cfg);
  const auto* b1 = dynamic_cast<const BlendedDataset*>(first.train.get());
  ASSERT_NE(b1, nullptr);
  EXPECT_EQ(b1->index_source(), IndexSource::kBuilt);
  cfg.cache_mode = CacheMode::kLoadOnly;
  const auto second = build_train_valid_test_datasets(cfg);
  const auto* b2 = dynamic_cast<const BlendedDataset*>(second.train.get());
  EXPECT_EQ(b2->index_source(), IndexSource::kLoadedFromCache);
  for (std::int64_t i = 0; i < b1->num_samples(); ++i) {
    ASSERT_EQ(b1->dataset_index().at(i), b2->dataset_index().at(i));
    ASSERT_EQ(b1->dataset_sample_index().at(i), b2->dataset_sample_index().at(i));
  }
  // A stale description is detected and the blend rebuilt.
  std::ofstream(b1->cache_file_stem() + "description.txt") << "stale";
  cfg.cache_mode = CacheMode::kBuildIfMissing;
  const auto third = build_train_valid_test_datasets(cfg);
  EXPECT_EQ(dynamic_cast<const BlendedDataset*>(third.train.get())->index_source(),
            IndexSource::kBuilt);

  // Without --data-cache-path Megatron caches the GPTDatasets next to the data but never the
  // blend itself.
  cfg.data_cache_path.clear();
  const auto uncached = build_train_valid_test_datasets(cfg);
  EXPECT_EQ(dynamic_cast<const BlendedDataset*>(uncached.train.get())->index_source(),
            IndexSource::kBuilt);
  EXPECT_TRUE(fs::exists(fs::path(a) / "cache" / "GPTDataset_indices"));
  fs::remove_all(dir);
}

TEST(BlendedDataset, OversamplingAndBadWeightsAreRejected) {
  const fs::path dir = make_temp_dir("blend-bad");
  const std::string a = write_tagged_dataset(dir, "a", 1, 60);
  const auto indexed = std::make_shared<const IndexedDataset>(a);
  GPTDatasetConfig g;
  g.dataset_path = a;
  g.sequence_length = 8;
  g.num_samples = 10;
  auto small = std::make_shared<const GPTDataset>(indexed, 0, 10, g);  // one epoch: ~41 samples
  BlendedDatasetConfig bc;
  // Asking for many more samples than the dataset holds.
  try {
    BlendedDataset big({small, small}, {0.5, 0.5}, 1000, bc);
    ADD_FAILURE() << "no over-sampling error";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("--mid-level-dataset-surplus"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(BlendedDataset({small, small}, {1.0, 0.0}, 10, bc), core::InvalidArgument);
  EXPECT_THROW(BlendedDataset({small}, {1.0, 2.0}, 10, bc), core::InvalidArgument);
  bc.split = Split::kValid;  // the datasets are train-split datasets
  EXPECT_THROW(BlendedDataset({small}, {1.0}, 10, bc), core::InvalidArgument);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trident::data
