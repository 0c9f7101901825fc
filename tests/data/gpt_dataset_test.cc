// GPTDataset and BlendedDataset parity with megatron-core: for the shared Megatron corpus (and
// two datasets derived from it) megatron-core's own BlendedMegatronDatasetBuilder runs in this test
// (tests/data/reference/megatron_indices.py) and trident must produce the same cache file names
// (MD5 of the same description), byte-identical .npy index files and the same sample tokens.
// Plus: index building rules on worked examples, cache hit / stale-cache rebuild, bad inputs, and
// a by-hand scale measurement (DISABLED_ScaleBillionTokens).
#include "trident/data/gpt_dataset.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "reference/reference_util.h"
#include "trident/core/error.h"
#include "trident/core/timer.h"
#include "trident/data/blended_dataset.h"
#include "trident/data/dataset_builder.h"
#include "trident/data/indexed_dataset.h"

namespace trident::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// ---- helpers -------------------------------------------------------------------------------

// The shared Megatron corpus (1000 OpenWebText documents, uint16, EOD 4999).
std::string corpus_prefix() {
  return testing::shared_data() + "/megatron/meg-gpt2-openwebtext_text_document";
}

fs::path make_temp_dir(const std::string& tag) {
  std::string pattern = (fs::temp_directory_path() / ("trident-" + tag + "-XXXXXX")).string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return fs::path(pattern);
}

// Set TRIDENT_KEEP_TEST_DIRS=1 to keep a test's files (both caches, the reference's outputs).
void remove_temp_dir(const fs::path& dir) {
  if (std::getenv("TRIDENT_KEEP_TEST_DIRS") == nullptr) fs::remove_all(dir);
}

// Runs a megatron-core reference script under a time limit, so that a reference that hangs
// (megatron-core loops forever on an empty split) fails the test instead of stalling CI.
void run_megatron_reference(const std::string& script, const std::vector<std::string>& args) {
  std::ostringstream os;  // (string + in a loop trips a GCC 12 -Wrestrict false positive)
  os << "timeout 600 " << testing::shell_quote(testing::ref_python()) << ' '
     << testing::shell_quote(testing::reference_script(script));
  for (const auto& a : args) os << ' ' << testing::shell_quote(a);
  const std::string cmd = os.str();
  std::string out;
  const int rc = testing::run_command(cmd, &out);
  ASSERT_EQ(rc, 0) << "reference command failed: " << cmd << "\n" << out;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::set<std::string> file_names(const fs::path& dir) {
  std::set<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Writes a uint16 dataset made of sequences of the corpus (each optionally reversed).
std::string derive_dataset(const fs::path& dir, const std::string& name, std::int64_t first,
                           std::int64_t last, bool reversed) {
  const IndexedDataset corpus(corpus_prefix());
  const std::string prefix = (dir / name).string();
  IndexedDatasetBuilder builder(prefix, TokenDType::kU16);
  for (std::int64_t s = first; s < last; ++s) {
    std::vector<std::int32_t> tokens = corpus.sequence(s);
    if (reversed) std::reverse(tokens.begin(), tokens.end());
    builder.add_sequence(tokens);
    builder.end_document();
  }
  builder.finalize();
  return prefix;
}

// One comparison: the same settings given to megatron-core and to trident.
struct ParityCase {
  std::string name{};
  std::vector<std::string> data_path{};                          // --data-path entries
  std::array<std::vector<std::string>, kNumSplits> per_split{};  // --train/valid/test-data-path
  std::string split = kDefaultSplit;
  std::int64_t seq_length = 0;
  std::int64_t seed = 1234;
  std::array<std::optional<std::int64_t>, kNumSplits> sizes{};
  json tokenizer = nullptr;
  bool drop_last_partial_validation_sequence = true;
};

json sizes_json(const ParityCase& c) {
  json s = json::array();
  for (const auto& n : c.sizes) s.push_back(n ? json(*n) : json());
  return s;
}

void check_case(const ParityCase& c, const fs::path& dir, TrainValidTestDatasets& built);

// Runs megatron-core for every case (one Python process) and checks trident against it.
// Returns the trident datasets per case for further checks.
std::vector<TrainValidTestDatasets> check_parity(const std::vector<ParityCase>& cases,
                                                 const fs::path& dir) {
  json spec;
  spec["cases"] = json::array();
  for (const auto& c : cases) {
    json j;
    j["name"] = c.name;
    j["cache_dir"] = (dir / c.name / "megatron-cache").string();
    j["out_dir"] = (dir / c.name).string();
    j["data_path"] = c.data_path.empty() ? json() : json(c.data_path);
    bool per_split = false;
    json ps = json::array();
    for (const auto& p : c.per_split) {
      ps.push_back(p.empty() ? json() : json(p));
      per_split = per_split || !p.empty();
    }
    j["per_split_paths"] = per_split ? ps : json();
    j["split"] = per_split ? json() : json(c.split);
    j["seq_length"] = c.seq_length;
    j["seed"] = c.seed;
    j["sizes"] = sizes_json(c);
    j["tokenizer"] = c.tokenizer;
    j["drop_last_partial_validation_sequence"] = c.drop_last_partial_validation_sequence;
    j["num_dump"] = 6;
    spec["cases"].push_back(j);
  }
  const fs::path spec_path = dir / "spec.json";
  std::ofstream(spec_path) << spec.dump(1);
  std::vector<TrainValidTestDatasets> built(cases.size());
  run_megatron_reference("megatron_indices.py", {spec_path.string()});
  if (::testing::Test::HasFatalFailure()) return built;
  for (std::size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + cases[k].name);
    check_case(cases[k], dir, built[k]);
  }
  return built;
}

void check_case(const ParityCase& c, const fs::path& dir, TrainValidTestDatasets& built) {
  {
    DatasetBuildConfig cfg;
    cfg.data_path = c.data_path;
    cfg.train_data_path = c.per_split[0];
    cfg.valid_data_path = c.per_split[1];
    cfg.test_data_path = c.per_split[2];
    cfg.split = c.split;
    cfg.seq_length = c.seq_length;
    cfg.seed = c.seed;
    cfg.num_samples = c.sizes;
    cfg.data_cache_path = (dir / c.name / "trident-cache").string();
    cfg.tokenizer = c.tokenizer;
    cfg.drop_last_partial_validation_sequence = c.drop_last_partial_validation_sequence;
    built = build_train_valid_test_datasets(cfg);
    const TrainValidTestDatasets& ds = built;

    std::ifstream summary_in(dir / c.name / (c.name + "-summary.json"));
    const json summary = json::parse(summary_in);
    for (Split s : kAllSplits) {
      const std::string name = split_name(s);
      const json& ref = summary.at(name);
      const auto& mine = ds.get(s);
      ASSERT_EQ(ref.is_null(), mine == nullptr) << name << " split presence differs";
      if (ref.is_null()) continue;
      ASSERT_EQ(mine->num_samples(), ref.at("length").get<std::int64_t>()) << name;
      std::string description, hash;
      if (const auto* g = dynamic_cast<const GPTDataset*>(mine.get())) {
        EXPECT_EQ(ref.at("class"), "GPTDataset") << name;
        description = g->unique_description();
        hash = g->unique_description_hash();
      } else if (const auto* b = dynamic_cast<const BlendedDataset*>(mine.get())) {
        EXPECT_EQ(ref.at("class"), "BlendedDataset") << name;
        description = b->unique_description();
        hash = b->unique_description_hash();
      } else {
        FAIL() << "unexpected dataset type " << mine->describe();
      }
      EXPECT_EQ(description, ref.at("description").get<std::string>()) << name;
      EXPECT_EQ(hash, ref.at("hash").get<std::string>()) << name;

      // Sample tokens, padding included.
      const IndexArray expected =
          IndexArray::map_npy((dir / c.name / (c.name + "-" + name + "-samples.npy")).string());
      const auto ids = ref.at("ids").get<std::vector<std::int64_t>>();
      const std::int64_t row = c.seq_length + 1;
      ASSERT_EQ(expected.numel(), static_cast<std::int64_t>(ids.size()) * row);
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(row));
      for (std::size_t k = 0; k < ids.size(); ++k) {
        mine->sample(ids[k], tokens);
        for (std::int64_t t = 0; t < row; ++t) {
          ASSERT_EQ(tokens[static_cast<std::size_t>(t)],
                    expected.at(static_cast<std::int64_t>(k) * row + t))
              << name << " sample " << ids[k] << " token " << t;
        }
      }
    }
    // Every cache file megatron-core wrote, trident wrote under the same name, byte for byte.
    const fs::path theirs = dir / c.name / "megatron-cache";
    const fs::path ours = dir / c.name / "trident-cache";
    const std::set<std::string> names = file_names(theirs);
    EXPECT_FALSE(names.empty());
    EXPECT_EQ(file_names(ours), names);
    for (const auto& n : names) {
      EXPECT_TRUE(file_bytes(theirs / n) == file_bytes(ours / n)) << n << " differs";
    }
  }
}

json gpt2_tokenizer_identity() {
  json t;
  t["class"] = "_GPT2BPETokenizer";
  t["tokenizer_path"] = json::array({"gpt2-tiny-vocab.json", "gpt2-tiny-merges.txt"});
  return t;
}

// ---- megatron-core parity -----------------------------------------------------------------

TEST(MegatronParity, GPTDatasetIndicesMatchMegatronCore) {
  const fs::path dir = make_temp_dir("gpt-parity");
  const std::string corpus = corpus_prefix();
  ASSERT_FALSE(corpus.empty());
  std::vector<ParityCase> cases;
  // Megatron-LM's default split string; valid needs 11 epochs and shuffles its last separately.
  cases.push_back({.name = "default_split",
                   .data_path = {corpus},
                   .seq_length = 512,
                   .seed = 1234,
                   .sizes = {10000, 640, 40},
                   .tokenizer = gpt2_tokenizer_identity()});
  // Train: 2 epochs, the second separated; empty test split (no dataset).
  cases.push_back({.name = "sep_last_epoch",
                   .data_path = {corpus},
                   .split = "98,2,0",
                   .seq_length = 128,
                   .seed = 42,
                   .sizes = {12000, 200, 0}});
  // One epoch each (no sizes); the valid split keeps its padded partial last sample.
  cases.push_back({.name = "one_epoch_padded",
                   .data_path = {corpus},
                   .split = "1/1/1",
                   .seq_length = 64,
                   .seed = 7,
                   .sizes = {std::nullopt, std::nullopt, std::nullopt},
                   .drop_last_partial_validation_sequence = false});
  // Largest seed; long sequences; test split of one sequence shorter than a sample.
  cases.push_back({.name = "long_seq",
                   .data_path = {corpus},
                   .split = "5, 3, 2",
                   .seq_length = 2048,
                   .seed = 4294967295LL,
                   .sizes = {100, 50, 500}});
  const auto built = check_parity(cases, dir);

  // The cases must exercise both sides of the separate-last-epoch rule (plans recomputed from
  // the corpus: valid of default_split, train of sep_last_epoch, train of default_split).
  int separated = 0, joined = 0;
  const IndexedDataset c(corpus);
  auto tokens_of = [&](std::int64_t b, std::int64_t e) {
    std::int64_t t = 0;
    for (std::int64_t k = b; k < e; ++k) t += c.sequence_length(k);
    return t;
  };
  for (const auto& [range, sl, n] :
       std::vector<std::tuple<std::pair<std::int64_t, std::int64_t>, std::int64_t, std::int64_t>>{
           {{969, 999}, 512, 640}, {{0, 980}, 128, 12000}, {{0, 969}, 512, 10000}}) {
    const EpochPlan p = plan_epochs(tokens_of(range.first, range.second), sl, n);
    EXPECT_GT(p.num_epochs, 1);
    (p.separate_final_epoch ? separated : joined) += 1;
  }
  EXPECT_EQ(separated, 2);
  EXPECT_EQ(joined, 1);
  remove_temp_dir(dir);
}

TEST(MegatronParity, BlendedDatasetIndicesMatchMegatronCore) {
  const fs::path dir = make_temp_dir("blend-parity");
  const std::string a = corpus_prefix();
  ASSERT_FALSE(a.empty());
  const std::string b = derive_dataset(dir, "first400", 0, 400, false);
  const std::string c = derive_dataset(dir, "reversed600", 400, 1000, true);
  std::vector<ParityCase> cases;
  // Weighted blend of two, with the 0.5% surplus per dataset.
  // (With "969, 30, 1" the test split of first400 would be empty, and megatron-core would loop
  // forever on it; trident refuses such a split with an error instead.)
  cases.push_back({.name = "weighted2",
                   .data_path = {"0.3", a, "0.7", b},
                   .split = "95,4,1",
                   .seq_length = 256,
                   .seed = 1234,
                   .sizes = {5000, 300, 30},
                   .tokenizer = gpt2_tokenizer_identity()});
  // Unnormalized weights over three datasets.
  cases.push_back({.name = "weighted3",
                   .data_path = {"2", a, "1", b, "5", c},
                   .split = "90,8,2",
                   .seq_length = 128,
                   .seed = 99,
                   .sizes = {20000, 700, 90}});
  // Prefixes without weights: weighted by dataset length, sized by the request.
  cases.push_back({.name = "unweighted3",
                   .data_path = {a, b, c},
                   .split = "80,20,0",
                   .seq_length = 128,
                   .seed = 5,
                   .sizes = {4000, 100000, 0}});
  // Without sizes: the exhaustive blend (integer weights).
  cases.push_back({.name = "exhaustive",
                   .data_path = {a, c},
                   .split = "1,1,0",
                   .seq_length = 256,
                   .seed = 3,
                   .sizes = {std::nullopt, std::nullopt, std::nullopt}});
  // A single weighted prefix is still a (one-dataset) blend in Megatron.
  cases.push_back({.name = "single_weighted",
                   .data_path = {"1.0", b},
                   .split = "1,1,1",
                   .seq_length = 128,
                   .seed = 11,
                   .sizes = {900, 90, 9}});
  // Separate distributions per split.
  cases.push_back({.name = "per_split",
                   .per_split = {std::vector<std::string>{"0.5", a, "0.5", c},
                                 std::vector<std::string>{b}, std::vector<std::string>{}},
                   .seq_length = 256,
                   .seed = 21,
                   .sizes = {3000, 200, 10},
                   .tokenizer = gpt2_tokenizer_identity()});
  check_parity(cases, dir);
  remove_temp_dir(dir);
}

// ---- index building rules -----------------------------------------------------------------

TEST(GPTIndices, SampleIndexWorkedExample) {
  // sizes [5, 3, 4], one epoch in order, L = 4: samples are seq0[0:5] and
  // seq0[4:5] + seq1 + seq2[0:1]; consecutive samples share one token.
  const std::vector<std::int32_t> sizes{5, 3, 4}, doc{0, 1, 2};
  const IndexArray s = build_sample_index(sizes, doc, 4, 1, 12, true);
  ASSERT_EQ(s.shape(), (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(s.dtype(), IndexDType::kI32);
  const std::vector<std::int64_t> expected{0, 0, 0, 4, 2, 0};
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(s.at(i), expected[static_cast<std::size_t>(i)]);
  // Keeping the partial last sample: ceil(11 / 4) = 3 samples, the last ends at (2, size - 1).
  const IndexArray p = build_sample_index(sizes, doc, 4, 1, 12, false);
  ASSERT_EQ(p.shape(), (std::vector<std::int64_t>{4, 2}));
  EXPECT_EQ(p.at(6), 2);
  EXPECT_EQ(p.at(7), 3);
}

TEST(GPTIndices, EpochPlan) {
  // T = 100 tokens per epoch, L = 10: 9 samples per epoch ((100 - 1) // 10).
  EXPECT_EQ(plan_epochs(100, 10, std::nullopt).num_epochs, 1);
  EXPECT_EQ(plan_epochs(100, 10, 9).num_epochs, 1);   // 91 tokens needed
  EXPECT_EQ(plan_epochs(100, 10, 10).num_epochs, 2);  // 101 tokens needed
  // 2 epochs: 9 samples before the last; 10 - 9 = 1 from the last < int(0.8 * 9) = 7: separate.
  EXPECT_TRUE(plan_epochs(100, 10, 10).separate_final_epoch);
  EXPECT_EQ(plan_epochs(100, 10, 10).num_samples_sans_final_epoch, 9);
  // 16 - 9 = 7 from the last epoch is not < 7: shuffled together.
  EXPECT_FALSE(plan_epochs(100, 10, 16).separate_final_epoch);
  EXPECT_TRUE(plan_epochs(100, 10, 15).separate_final_epoch);
}

TEST(GPTIndices, ShuffleIndexKeepsTheLastEpochAtTheEnd) {
  Mt19937 rng(1234);
  const IndexArray s = build_shuffle_index(10, 15, rng);
  EXPECT_EQ(s.dtype(), IndexDType::kU32);
  std::set<std::int64_t> head, tail;
  for (std::int64_t i = 0; i < 10; ++i) head.insert(s.at(i));
  for (std::int64_t i = 10; i < 15; ++i) tail.insert(s.at(i));
  EXPECT_EQ(head.size(), 10u);
  EXPECT_EQ(*head.rbegin(), 9);
  EXPECT_EQ(*tail.begin(), 10);
}

// ---- cache behaviour ----------------------------------------------------------------------

DatasetBuildConfig small_config(const std::string& corpus, const fs::path& cache) {
  DatasetBuildConfig cfg;
  cfg.data_path = {corpus};
  cfg.split = "98,2,0";
  cfg.seq_length = 128;
  cfg.seed = 1;
  cfg.num_samples = {3000, 100, 0};
  cfg.data_cache_path = cache.string();
  return cfg;
}

const GPTDataset& as_gpt(const std::shared_ptr<const SampleDataset>& d) {
  const auto* g = dynamic_cast<const GPTDataset*>(d.get());
  EXPECT_NE(g, nullptr);
  return *g;
}

std::vector<std::int32_t> tokens_of(const SampleDataset& d, std::int64_t i) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(d.seq_length() + 1));
  d.sample(i, t);
  return t;
}

TEST(GPTDatasetCache, SecondBuildLoadsTheCache) {
  const fs::path dir = make_temp_dir("cache-hit");
  const std::string corpus = corpus_prefix();
  ASSERT_FALSE(corpus.empty());
  const DatasetBuildConfig cfg = small_config(corpus, dir / "cache");
  const TrainValidTestDatasets first = build_train_valid_test_datasets(cfg);
  EXPECT_EQ(as_gpt(first.train).index_source(), IndexSource::kBuilt);
  EXPECT_EQ(file_names(dir / "cache").size(), 8u);  // 2 splits x (description + 3 arrays)
  EXPECT_EQ(first.test, nullptr);

  DatasetBuildConfig load_only = cfg;
  load_only.cache_mode = CacheMode::kLoadOnly;  // must not rebuild
  const TrainValidTestDatasets second = build_train_valid_test_datasets(load_only);
  const GPTDataset& a = as_gpt(first.train);
  const GPTDataset& b = as_gpt(second.train);
  EXPECT_EQ(b.index_source(), IndexSource::kLoadedFromCache);
  EXPECT_EQ(as_gpt(second.valid).index_source(), IndexSource::kLoadedFromCache);
  ASSERT_EQ(a.num_samples(), b.num_samples());
  for (std::int64_t i = 0; i < a.num_samples(); i += 97) {
    EXPECT_EQ(tokens_of(a, i), tokens_of(b, i)) << "sample " << i;
  }
  remove_temp_dir(dir);
}

TEST(GPTDatasetCache, StaleOrCorruptCacheIsRebuilt) {
  const fs::path dir = make_temp_dir("cache-stale");
  const std::string corpus = corpus_prefix();
  ASSERT_FALSE(corpus.empty());
  DatasetBuildConfig cfg = small_config(corpus, dir / "cache");
  cfg.split = "1,0,0";
  const TrainValidTestDatasets original = build_train_valid_test_datasets(cfg);
  const GPTDataset& g = as_gpt(original.train);
  const std::string stem = g.cache_file_stem();
  const std::vector<std::int32_t> sample7 = tokens_of(g, 7);

  // Other settings -> another description -> another hash: the old files are never used.
  DatasetBuildConfig other = cfg;
  other.seed = 2;
  const auto reseeded = build_train_valid_test_datasets(other);
  EXPECT_EQ(as_gpt(reseeded.train).index_source(), IndexSource::kBuilt);
  EXPECT_NE(as_gpt(reseeded.train).unique_description_hash(), g.unique_description_hash());
  EXPECT_EQ(file_names(dir / "cache").size(), 8u);

  auto rebuild_and_check = [&](const std::string& what) {
    SCOPED_TRACE(what);
    const auto again = build_train_valid_test_datasets(cfg);
    EXPECT_EQ(as_gpt(again.train).index_source(), IndexSource::kBuilt);
    EXPECT_EQ(tokens_of(*again.train, 7), sample7);
    // ... and the rebuilt cache is valid again.
    const auto third = build_train_valid_test_datasets(cfg);
    EXPECT_EQ(as_gpt(third.train).index_source(), IndexSource::kLoadedFromCache);
  };
  // A description file that does not match (edited, or an MD5 collision).
  std::ofstream(stem + "description.txt") << "{\"something\": \"else\"}";
  rebuild_and_check("edited description");
  // A truncated array.
  fs::resize_file(stem + "sample_index.npy", fs::file_size(stem + "sample_index.npy") - 8);
  rebuild_and_check("truncated sample index");
  // An array of the wrong length under the right name.
  write_npy(stem + "shuffle_index.npy",
            IndexArray::from_vector(std::vector<std::uint32_t>{0, 1, 2}, {3}));
  rebuild_and_check("wrong shuffle index length");
  // Arrays of the right shapes whose values point outside the dataset (found while writing
  // fuzz_gpt_cache, tests/fuzz: only shapes were checked, so such a cache was loaded and sample()
  // then indexed the mapped arrays and the dataset with the bad values).
  const auto n = static_cast<std::size_t>(g.num_samples());
  std::vector<std::uint32_t> shuffle(n);
  for (std::size_t i = 0; i < n; ++i) shuffle[i] = static_cast<std::uint32_t>(i);
  shuffle[3] = static_cast<std::uint32_t>(n + 1000000);
  write_npy(stem + "shuffle_index.npy",
            IndexArray::from_vector(shuffle, {static_cast<std::int64_t>(n)}));
  rebuild_and_check("shuffle index value out of range");
  shuffle[3] = 4;  // a repeated row: not a permutation
  write_npy(stem + "shuffle_index.npy",
            IndexArray::from_vector(shuffle, {static_cast<std::int64_t>(n)}));
  rebuild_and_check("shuffle index with a repeated sample");
  {
    const IndexArray doc = IndexArray::map_npy(stem + "document_index.npy");
    std::vector<std::int32_t> bad(static_cast<std::size_t>(doc.numel()));
    for (std::size_t k = 0; k < bad.size(); ++k) bad[k] = static_cast<std::int32_t>(doc.at(k));
    bad.back() = 1 << 30;  // no such sequence
    write_npy(stem + "document_index.npy", IndexArray::from_vector(bad, doc.shape()));
  }
  rebuild_and_check("document index value out of range");
  {
    const IndexArray sample = IndexArray::map_npy(stem + "sample_index.npy");
    std::vector<std::int64_t> rows(static_cast<std::size_t>(sample.numel()));
    for (std::size_t k = 0; k < rows.size(); ++k) rows[k] = sample.at(static_cast<std::int64_t>(k));
    rows[2 * 5 + 1] += 100000;  // an offset past its sequence's end
    std::vector<std::int32_t> narrow(rows.begin(), rows.end());
    write_npy(stem + "sample_index.npy", sample.dtype() == IndexDType::kI32
                                             ? IndexArray::from_vector(narrow, sample.shape())
                                             : IndexArray::from_vector(rows, sample.shape()));
  }
  rebuild_and_check("sample index offset out of range");
  {
    // The same corruption on a load-only rank is an error naming the file, not a rebuild.
    const IndexArray sample = IndexArray::map_npy(stem + "sample_index.npy");
    std::vector<std::int64_t> rows(static_cast<std::size_t>(sample.numel()));
    for (std::size_t k = 0; k < rows.size(); ++k) rows[k] = sample.at(static_cast<std::int64_t>(k));
    rows[2 * 5] = -7;
    std::vector<std::int32_t> narrow(rows.begin(), rows.end());
    write_npy(stem + "sample_index.npy", sample.dtype() == IndexDType::kI32
                                             ? IndexArray::from_vector(narrow, sample.shape())
                                             : IndexArray::from_vector(rows, sample.shape()));
    DatasetBuildConfig corrupt_load_only = cfg;
    corrupt_load_only.cache_mode = CacheMode::kLoadOnly;
    try {
      build_train_valid_test_datasets(corrupt_load_only);
      ADD_FAILURE() << "a corrupt cache was accepted by a load-only rank";
    } catch (const core::DataError& e) {
      EXPECT_NE(std::string(e.what()).find("no valid cached indices"), std::string::npos)
          << e.what();
    }
    rebuild_and_check("sample index position out of range");
  }
  // A missing file is a plain miss.
  fs::remove(stem + "document_index.npy");
  rebuild_and_check("missing document index");

  // Load-only ranks fail clearly when there is nothing to load.
  DatasetBuildConfig load_only = cfg;
  load_only.cache_mode = CacheMode::kLoadOnly;
  load_only.seed = 3;
  EXPECT_THROW(build_train_valid_test_datasets(load_only), core::DataError);
  remove_temp_dir(dir);
}

TEST(GPTDatasetCache, DropLastSettingIsNotConfusedByTheSharedHash) {
  // Megatron leaves drop_last_partial_validation_sequence out of the description, so both
  // settings share file names; the array lengths tell them apart.
  const fs::path dir = make_temp_dir("cache-droplast");
  const std::string corpus = corpus_prefix();
  ASSERT_FALSE(corpus.empty());
  DatasetBuildConfig cfg = small_config(corpus, dir / "cache");
  cfg.split = "1,1,0";
  cfg.num_samples = {std::nullopt, std::nullopt, std::nullopt};
  const auto dropped = build_train_valid_test_datasets(cfg);
  cfg.drop_last_partial_validation_sequence = false;
  const auto kept = build_train_valid_test_datasets(cfg);
  EXPECT_EQ(as_gpt(kept.valid).index_source(), IndexSource::kBuilt);
  EXPECT_EQ(as_gpt(kept.train).index_source(), IndexSource::kLoadedFromCache);
  EXPECT_EQ(kept.valid->num_samples(), dropped.valid->num_samples() + 1);
  // The extra sample is the padded tail: it ends with pad ids (-1).
  const GPTDataset& v = as_gpt(kept.valid);
  bool found_padded = false;
  for (std::int64_t i = 0; i < v.num_samples(); ++i) {
    if (tokens_of(v, i).back() == -1) found_padded = true;
  }
  EXPECT_TRUE(found_padded);
  remove_temp_dir(dir);
}

TEST(GPTDatasetCache, DefaultCacheDirIsNextToTheData) {
  const fs::path dir = make_temp_dir("cache-default");
  const std::string prefix = derive_dataset(dir, "small", 0, 50, false);
  DatasetBuildConfig cfg = small_config(prefix, "");
  cfg.num_samples = {100, 10, 0};
  const auto ds = build_train_valid_test_datasets(cfg);
  EXPECT_EQ(file_names(fs::path(prefix) / "cache" / "GPTDataset_indices").size(), 8u);
  remove_temp_dir(dir);
}

// ---- bad input ----------------------------------------------------------------------------

template <class E>
void expect_error(const DatasetBuildConfig& cfg, const std::string& needle) {
  try {
    build_train_valid_test_datasets(cfg);
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DatasetBuilder, BadInputsGiveClearErrors) {
  const fs::path dir = make_temp_dir("bad-input");
  const std::string corpus = corpus_prefix();
  ASSERT_FALSE(corpus.empty());
  const DatasetBuildConfig good = small_config(corpus, dir / "cache");
  using core::InvalidArgument;

  DatasetBuildConfig c = good;
  c.data_path = {dir.string() + "/nonexistent_text_document"};
  expect_error<InvalidArgument>(c, "nonexistent_text_document");
  c.data_path = {corpus + ".bin"};
  expect_error<InvalidArgument>(c, "without \".bin\"");
  c.data_path = {"0.5", corpus, "0.5", dir.string() + "/missing"};
  expect_error<InvalidArgument>(c, "missing");
  c.data_path = {"0.5", corpus, "x", corpus};
  expect_error<InvalidArgument>(c, "is not a number");
  c.data_path = {"0", corpus, "0", corpus};
  expect_error<InvalidArgument>(c, "must be a finite number > 0");
  c.data_path = {"-1", corpus, "2", corpus};
  expect_error<InvalidArgument>(c, "must be a finite number > 0");
  c.data_path = {};
  expect_error<InvalidArgument>(c, "no data");

  c = good;
  c.split = "1.2.3, 4";
  expect_error<InvalidArgument>(c, "--split");
  c.split = "1,2,3,4";
  expect_error<InvalidArgument>(c, "at most three");
  c.split = "0,0,0";
  expect_error<InvalidArgument>(c, "every split weight 0");

  c = good;
  c.train_data_path = {corpus};
  expect_error<InvalidArgument>(c, "cannot be combined");
  c = good;
  c.data_path = {"0.5", corpus, "0.5", corpus};
  c.num_samples = {std::nullopt, 10, 10};
  expect_error<InvalidArgument>(c, "needs the number of train samples");
  c = good;
  c.seq_length = 0;
  expect_error<InvalidArgument>(c, "--seq-length");
  c = good;
  c.seed = -1;
  expect_error<InvalidArgument>(c, "--seed");
  c = good;
  std::ofstream(dir / "a-file") << "x";
  c.data_cache_path = (dir / "a-file" / "cache").string();
  expect_error<core::DataError>(c, "--data-cache-path");
  remove_temp_dir(dir);
}

// ---- scale (by hand) ----------------------------------------------------------------------

// Writes a Megatron .idx for `lengths` (uint16 tokens, one document per sequence) and a sparse
// .bin of the matching size: index building reads only the .idx, so the 2 GB of tokens need no
// disk blocks.
void write_synthetic_dataset(const std::string& prefix, const std::vector<std::int32_t>& lengths) {
  std::ofstream idx(prefix + ".idx", std::ios::binary);
  auto put = [&](const auto& v) { idx.write(reinterpret_cast<const char*>(&v), sizeof(v)); };
  idx.write("MMIDIDX\0\0", 9);
  put(std::uint64_t{1});
  put(std::uint8_t{8});  // uint16
  const auto n = static_cast<std::uint64_t>(lengths.size());
  put(n);
  put(n + 1);
  idx.write(reinterpret_cast<const char*>(lengths.data()),
            static_cast<std::streamsize>(4 * lengths.size()));
  std::int64_t pointer = 0;
  for (std::int32_t len : lengths) {
    put(pointer);
    pointer += 2 * std::int64_t{len};
  }
  for (std::uint64_t d = 0; d <= n; ++d) put(static_cast<std::int64_t>(d));
  idx.close();
  const int fd = ::open((prefix + ".bin").c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, pointer), 0);
  ::close(fd);
}

// Run by hand: trident_data_test --gtest_also_run_disabled_tests
//   --gtest_filter='*DISABLED_ScaleBillionTokens'   (results go to docs/data-indices.md)
TEST(GPTDatasetScale, DISABLED_ScaleBillionTokens) {
  const fs::path dir = make_temp_dir("scale");
  const std::int64_t num_docs = 2'000'000;
  std::mt19937_64 gen(17);
  std::uniform_int_distribution<std::int32_t> len(1, 999);  // mean 500 tokens
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(num_docs));
  std::int64_t total = 0;
  for (auto& l : lengths) total += (l = len(gen));
  const std::string a = (dir / "synthetic_a").string(), b = (dir / "synthetic_b").string();
  core::Timer t;
  write_synthetic_dataset(a, lengths);
  fs::create_symlink(a + ".idx", b + ".idx");
  fs::create_symlink(a + ".bin", b + ".bin");
  std::printf("synthetic dataset: %lld documents, %lld tokens, .idx %.1f MB, written in %.2f s\n",
              static_cast<long long>(num_docs), static_cast<long long>(total),
              static_cast<double>(fs::file_size(a + ".idx")) / 1e6, t.elapsed_s());

  for (const std::int64_t seq : {std::int64_t{2048}, std::int64_t{512}}) {
    for (const double epochs : {1.0, 3.0}) {
      DatasetBuildConfig cfg;
      cfg.data_path = {a};
      cfg.seq_length = seq;
      cfg.num_samples = {static_cast<std::int64_t>(epochs * 0.969 * static_cast<double>(total) /
                                                   static_cast<double>(seq)),
                         10000, 1000};
      cfg.data_cache_path = (dir / "cache").string();
      t.reset();
      const auto built = build_train_valid_test_datasets(cfg);
      const double build_s = t.elapsed_s();
      t.reset();
      cfg.cache_mode = CacheMode::kLoadOnly;
      const auto loaded = build_train_valid_test_datasets(cfg);
      const double load_s = t.elapsed_s();
      const GPTDataset& g = as_gpt(loaded.train);
      t.reset();
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(seq + 1));
      for (std::int64_t i = 0; i < 100000; ++i) g.sample((i * 7919) % g.num_samples(), tokens);
      const double read_s = t.elapsed_s();
      std::printf(
          "seq %lld, %.0f epoch(s): %lld train samples (%lld epochs); build+save %.2f s "
          "(3 splits), mmap load %.3f s, 100k random samples read %.2f s\n",
          static_cast<long long>(seq), epochs, static_cast<long long>(g.num_samples()),
          static_cast<long long>(g.num_epochs()), build_s, load_s, read_s);
    }
  }
  DatasetBuildConfig blend;
  blend.data_path = {"0.3", a, "0.7", b};
  blend.seq_length = 2048;
  blend.num_samples = {1'000'000, 10000, 1000};
  blend.data_cache_path = (dir / "cache").string();
  t.reset();
  build_train_valid_test_datasets(blend);
  const double blend_build_s = t.elapsed_s();
  t.reset();
  blend.cache_mode = CacheMode::kLoadOnly;
  build_train_valid_test_datasets(blend);
  std::printf(
      "blend 0.3/0.7 of two such datasets, 1M train samples: build+save %.2f s, "
      "mmap load %.3f s\n",
      blend_build_s, t.elapsed_s());
  std::uintmax_t cache_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir / "cache")) cache_bytes += e.file_size();
  std::printf("cache directory: %.1f MB\n", static_cast<double>(cache_bytes) / 1e6);
  remove_temp_dir(dir);
}

}  // namespace
}  // namespace trident::data
