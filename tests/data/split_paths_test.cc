// BigScience's --*-weighted-split-paths (BLOOM's data flags): the grammar and its errors, and
// parity with BigScience's algorithm. tests/data/reference/bigscience_split_paths.py, a
// reimplementation of BigScience Megatron-DeepSpeed's rules on numpy's RandomState and
// megatron-core's IndexedDataset, runs in the test on the shared Megatron corpus and two datasets
// derived from it; trident must write byte-identical index caches under BigScience's file names,
// the same blending order and the same sample tokens, group by group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "reference/reference_util.h"
#include "trident/core/error.h"
#include "trident/data/dataset_builder.h"
#include "trident/data/indexed_dataset.h"
#include "trident/data/weighted_split_paths.h"

namespace trident::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string corpus_prefix() {
  return testing::shared_data() + "/megatron/meg-gpt2-openwebtext_text_document";
}

// The corpus under `dir` (symlinks), so that the caches written next to it stay in the test's
// directory.
std::string link_corpus(const fs::path& dir, const std::string& name) {
  for (const char* ext : {".bin", ".idx"}) {
    fs::create_symlink(corpus_prefix() + ext, dir / (name + ext));
  }
  return (dir / name).string();
}

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

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::set<std::string> cache_files(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find("_indexmap_") != std::string::npos) names.insert(n);
  }
  return names;
}

struct Case {
  std::string name;
  std::array<std::vector<std::string>, kNumSplits> groups{};
  std::array<std::string, kNumSplits> files{};  // the -path forms (a file of quoted groups)
  std::int64_t seq_length = 0, seed = 1234;
  std::array<std::int64_t, kNumSplits> sizes{};
  bool allow_overlap = false;
};

const char* kSplitNames[] = {"train", "valid", "test"};

// Runs the reference on every case, then trident, and compares.
void check_parity(const std::vector<Case>& cases, const fs::path& dir) {
  json spec;
  spec["cases"] = json::array();
  for (const Case& c : cases) {
    json j;
    j["name"] = c.name;
    j["out_dir"] = (dir / ("ref-" + c.name)).string();
    for (int s = 0; s < kNumSplits; ++s) {
      if (!c.files[s].empty()) {
        j[std::string(kSplitNames[s]) + "_file"] = c.files[s];
      } else {
        j[kSplitNames[s]] = c.groups[s];
      }
    }
    j["seq_length"] = c.seq_length;
    j["seed"] = c.seed;
    j["sizes"] = c.sizes;
    j["num_dump"] = 8;
    spec["cases"].push_back(j);
  }
  std::ofstream(dir / "spec.json") << spec.dump(1);
  ASSERT_TRUE(testing::run_reference("bigscience_split_paths.py", {(dir / "spec.json").string()}));

  int separated = 0, separated_only_at_095 = 0, blends = 0, singles = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("case " + c.name);
    const fs::path ref_dir = dir / ("ref-" + c.name);
    std::ifstream summary_in(ref_dir / "summary.json");
    const json summary = json::parse(summary_in);
    // The caches of earlier cases must not be taken for this one's (names differ anyway).
    for (const std::string& n : cache_files(dir)) fs::remove(dir / n);

    DatasetBuildConfig cfg;
    std::array<std::vector<std::string>*, kNumSplits> dest = {&cfg.train_weighted_split_paths,
                                                              &cfg.valid_weighted_split_paths,
                                                              &cfg.test_weighted_split_paths};
    for (int s = 0; s < kNumSplits; ++s) {
      *dest[s] =
          c.files[s].empty()
              ? c.groups[s]
              : read_weighted_split_paths_file(
                    c.files[s], std::string("--") + kSplitNames[s] + "-weighted-split-paths-path");
      // The grammar: the same groups, names, weights, ranges and paths.
      if (dest[s]->empty()) continue;
      const auto groups = parse_weighted_split_paths(
          *dest[s], std::string("--") + kSplitNames[s] + "-weighted-split-paths");
      const json& parsed = summary.at("parsed").at(kSplitNames[s]);
      ASSERT_EQ(groups.size(), parsed.size());
      for (std::size_t g = 0; g < groups.size(); ++g) {
        EXPECT_EQ(groups[g].name, parsed[g][0].get<std::string>());
        ASSERT_EQ(groups[g].datasets.size(), parsed[g][1].size());
        for (std::size_t d = 0; d < groups[g].datasets.size(); ++d) {
          EXPECT_EQ(groups[g].datasets[d].weight_text, parsed[g][1][d][0].get<std::string>());
          EXPECT_EQ(groups[g].datasets[d].range_text, parsed[g][1][d][1].get<std::string>());
          EXPECT_EQ(groups[g].datasets[d].prefix, parsed[g][1][d][2].get<std::string>());
        }
      }
    }
    cfg.seq_length = c.seq_length;
    cfg.seed = c.seed;
    cfg.num_samples = {c.sizes[0], c.sizes[1], c.sizes[2]};
    cfg.allow_split_paths_overlap = c.allow_overlap;
    const TrainValidTestDatasets built = build_train_valid_test_datasets(cfg);

    // Every index cache file the reference wrote, trident wrote next to the data under the same
    // (BigScience's) name, byte for byte.
    std::set<std::string> expected;
    for (int s = 0; s < kNumSplits; ++s) {
      if (!summary.at("groups").contains(kSplitNames[s])) continue;
      const json& groups = summary["groups"][kSplitNames[s]];
      std::vector<NamedDataset> mine;
      if (s == 0) {
        mine.push_back({groups[0]["name"].get<std::string>(), built.train});
      } else {
        mine = s == 1 ? built.valid_groups : built.test_groups;
      }
      ASSERT_EQ(mine.size(), groups.size()) << kSplitNames[s];
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const json& ref = groups[g];
        const std::string name = ref["name"].get<std::string>();
        SCOPED_TRACE(std::string(kSplitNames[s]) + " group " + name);
        EXPECT_EQ(mine[g].name, name);
        ASSERT_NE(mine[g].dataset, nullptr);
        for (const json& f : ref["files"]) expected.insert(f.get<std::string>());
        for (const json& d : ref["datasets"]) {
          separated += d["separate_last_epoch"].get<bool>();
          separated_only_at_095 +=
              d["separate_last_epoch"].get<bool>() && !d["separate_at_0_80"].get<bool>();
        }
        const std::int64_t requested = c.sizes[static_cast<std::size_t>(s)];
        if (ref["kind"] == "blend") {
          ++blends;
          const auto* b = dynamic_cast<const BigScienceBlendedDataset*>(mine[g].dataset.get());
          ASSERT_NE(b, nullptr) << mine[g].dataset->describe();
          EXPECT_EQ(b->full_length(), ref["length"].get<std::int64_t>());
          EXPECT_EQ(b->num_samples(), std::min(requested, b->full_length()));
          const std::string base =
              (ref_dir / (std::string(kSplitNames[s]) + "-" + name + "-")).string();
          const IndexArray di = IndexArray::map_npy(base + "dataset_index.npy");
          const IndexArray dsi = IndexArray::map_npy(base + "dataset_sample_index.npy");
          ASSERT_EQ(di.numel(), b->full_length());
          for (std::int64_t k = 0; k < b->num_samples(); ++k) {
            ASSERT_EQ(b->dataset_index()[static_cast<std::size_t>(k)], di.at(k)) << "sample " << k;
            ASSERT_EQ(b->dataset_sample_index()[static_cast<std::size_t>(k)], dsi.at(k))
                << "sample " << k;
          }
        } else {
          ++singles;
          const auto* gd = dynamic_cast<const GPTDataset*>(mine[g].dataset.get());
          ASSERT_NE(gd, nullptr) << mine[g].dataset->describe();
          EXPECT_EQ(gd->num_samples(), ref["length"].get<std::int64_t>());
        }
        // The samples' tokens.
        const IndexArray tokens = IndexArray::map_npy(
            (ref_dir / (std::string(kSplitNames[s]) + "-" + name + "-samples.npy")).string());
        const auto ids = ref["ids"].get<std::vector<std::int64_t>>();
        const std::int64_t row = c.seq_length + 1;
        ASSERT_EQ(tokens.numel(), static_cast<std::int64_t>(ids.size()) * row);
        std::vector<std::int32_t> got(static_cast<std::size_t>(row));
        for (std::size_t k = 0; k < ids.size(); ++k) {
          mine[g].dataset->sample(ids[k], got);
          for (std::int64_t t = 0; t < row; ++t) {
            ASSERT_EQ(got[static_cast<std::size_t>(t)],
                      tokens.at(static_cast<std::int64_t>(k) * row + t))
                << "sample " << ids[k] << " token " << t;
          }
        }
      }
    }
    EXPECT_FALSE(expected.empty());
    EXPECT_EQ(cache_files(dir), expected);
    for (const std::string& n : expected) {
      EXPECT_TRUE(file_bytes(dir / n) == file_bytes(ref_dir / n)) << n << " differs";
    }
    // A second build loads the caches (the same samples, nothing rebuilt).
    const TrainValidTestDatasets again = build_train_valid_test_datasets(cfg);
    std::vector<std::int32_t> a(static_cast<std::size_t>(c.seq_length + 1)), b(a.size());
    built.train->sample(built.train->num_samples() - 1, a);
    again.train->sample(again.train->num_samples() - 1, b);
    EXPECT_EQ(a, b);
  }
  // What the cases must have exercised to mean anything.
  EXPECT_GT(blends, 2);
  EXPECT_GT(singles, 0);
  EXPECT_GT(separated, 0) << "no dataset shuffled its last epoch apart";
  EXPECT_GT(separated_only_at_095, 0)
      << "no dataset where BigScience's 0.95 cutoff differs from megatron-core's 0.80";
}

TEST(BigScienceParity, SplitPathsIndicesMatchBigScience) {
  const testing::TempDir tmp;
  const fs::path dir(tmp.path());
  const std::string a = link_corpus(dir, "owt_text_document");
  const std::string b = derive_dataset(dir, "first400_text_document", 0, 400, false);
  const std::string c = derive_dataset(dir, "reversed600_text_document", 400, 1000, true);
  std::vector<Case> cases;
  // BLOOM's layout (tr11: load_ratios_meg_ds_format.py): train 0:0.950 of every dataset, named
  // validation sets on 0.950:1.0, one per language and one of them all; a test group.
  cases.push_back(
      {.name = "bloom",
       .groups = {std::vector<std::string>{"train: 0.3 0:0.950 " + a + ", 0.5 0:0.950 " + b +
                                           ", 0.2 0:0.950 " + c},
                  std::vector<std::string>{
                      "valid: 0.3 0.950:1.0 " + a + ", 0.5 0.950:1.0 " + b + ", 0.2 0.950:1.0 " + c,
                      "valid_owt: 1 0.950:1.0 " + a,
                      "valid_derived: 2 0.950:1 " + b + ", 1 0.950:1 " + c},
                  std::vector<std::string>{"test_rev: 1 0.95:1 " + c}},
       .seq_length = 64,
       .seed = 42,
       .sizes = {30000, 700, 70}});
  // BigScience's own training test (tests/test_training.py): one dataset twice in the training
  // group, validation ranges that overlap training ones (allowed with the flag), many epochs.
  cases.push_back(
      {.name = "bigscience_test",
       .groups = {std::vector<std::string>{"TRAIN: 1 0:0.95 " + a + ", 0.3 0:0.90 " + a},
                  std::vector<std::string>{"VALID1: 1 0.95:0.98 " + a + ", 0.3 0.90:0.99 " + a,
                                           "VALID2: 0.5 0.95:0.97 " + a + ", 0.5 0.90:0.98 " + a},
                  {}},
       .seq_length = 128,
       .seed = 1234,
       .sizes = {40000, 1500, 0},
       .allow_overlap = true});
  // The -path forms, as BLOOM's script passes them; a single-dataset training group.
  const fs::path train_file = dir / "train-splits.txt", valid_file = dir / "valid-splits.txt";
  std::ofstream(train_file) << "\"train: 1 0:0.8 " + b + "\"\n";
  std::ofstream(valid_file) << "\"valid: 1 0.8:0.9 " + b + ", 3 0.9:1.0 " + b +
                                   "\" \"valid_first: 1 0.8:0.9 " + b + "\"\n";
  cases.push_back({.name = "files",
                   .files = {train_file.string(), valid_file.string(), ""},
                   .seq_length = 32,
                   .seed = 7,
                   .sizes = {9000, 900, 0}});
  check_parity(cases, dir);
}

// ---- the grammar and its errors, without Python ----------------------------------------------

template <class F>
void expect_invalid(F f, const std::vector<std::string>& pieces) {
  testing::expect_error<core::InvalidArgument>(f, pieces);
}

TEST(SplitPathsGrammar, GroupsAsBigScienceParsesThem) {
  const auto g = parse_weighted_split_paths(
      {"valid_en: 0.6 0.6:0.8 A, 0.3 0:1 B,0.1 0:1 C", "valid fr:1 0.9:1.0 /d/x:y_text"},
      "--valid-weighted-split-paths");
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "valid_en");
  ASSERT_EQ(g[0].datasets.size(), 3u);
  EXPECT_EQ(g[0].datasets[0].weight_text, "0.6");
  EXPECT_DOUBLE_EQ(g[0].datasets[0].start, 0.6);
  EXPECT_DOUBLE_EQ(g[0].datasets[0].end, 0.8);
  EXPECT_EQ(g[0].datasets[2].prefix, "C");
  EXPECT_EQ(g[1].name, "valid fr");                   // the text before the first ':', as written
  EXPECT_EQ(g[1].datasets[0].prefix, "/d/x:y_text");  // later ':' belong to the path
  SplitPathsEntry e;
  e.start = 0.95;
  e.end = 1.0;
  EXPECT_EQ(split_paths_document_range(e, 1000),
            (std::pair<std::int64_t, std::int64_t>{950, 1000}));
  e.start = 0.125;
  e.end = 0.375;
  // Python's round(): half to even.
  EXPECT_EQ(split_paths_document_range(e, 4), (std::pair<std::int64_t, std::int64_t>{0, 2}));
  EXPECT_EQ(bigscience_samples_for_dataset(1000, 0.5), 503);  // ceil(1000 * 0.5 * 1.005)
}

TEST(SplitPathsGrammar, BadGroupsGiveClearErrors) {
  const std::string v = "--valid-weighted-split-paths";
  expect_invalid([&] { parse_weighted_split_paths({"1 A"}, v); }, {v, "has no name"});
  expect_invalid([&] { parse_weighted_split_paths({"0.5 0:1 A"}, v); },
                 {v, "did the group leave out NAME:?"});
  expect_invalid([&] { parse_weighted_split_paths({" : 1 0:1 A"}, v); }, {"empty name"});
  expect_invalid([&] { parse_weighted_split_paths({"a/b: 1 0:1 A"}, v); }, {"holds '/'"});
  expect_invalid(
      [&] {
        parse_weighted_split_paths({"x: 1 0:1 A", "x: 1 0:1 B"}, v);
      },
      {"two groups are named \"x\""});
  expect_invalid([&] { parse_weighted_split_paths({"x: 1 0:1"}, v); },
                 {"group \"x\"", "\"1 0:1\" is 2 words"});
  expect_invalid([&] { parse_weighted_split_paths({"x: 1 0:1 A,"}, v); }, {"is 0 words"});
  expect_invalid([&] { parse_weighted_split_paths({"x: 1 0-1 A"}, v); },
                 {"the range \"0-1\" of A is not START:END"});
  expect_invalid([&] { parse_weighted_split_paths({"x: 1 0.5:0.5 A"}, v); }, {"START < END"});
  expect_invalid([&] { parse_weighted_split_paths({"x: 1 0.9:0.1 A"}, v); }, {"reversed"});
  expect_invalid([&] { parse_weighted_split_paths({"x: 1 0:1.5 A"}, v); }, {"leaves [0, 1]"});
  expect_invalid([&] { parse_weighted_split_paths({"x: 1 -0.5:1 A"}, v); }, {"leaves [0, 1]"});
  expect_invalid([&] { parse_weighted_split_paths({"x: 0 0:1 A"}, v); },
                 {"the weight \"0\" of A is not a number > 0"});
  expect_invalid([&] { parse_weighted_split_paths({"x: abc 0:1 A"}, v); }, {"\"abc\""});
  expect_invalid([&] { parse_weighted_split_paths({"x: inf 0:1 A"}, v); }, {"\"inf\""});
  expect_invalid(
      [&] {
        parse_weighted_split_paths({"a: 1 0:1 A", "b: 1 0:1 B"}, "--train-weighted-split-paths");
      },
      {"takes one group"});
}

TEST(SplitPathsGrammar, FilesAsBigScienceWritesThem) {
  const testing::TempDir tmp;
  const std::string f = tmp / "groups.txt";
  const std::string flag = "--valid-weighted-split-paths-path";
  testing::write_bytes(f, "\"valid: 1 0.95:1 A, 2 0.95:1 B\" \"valid_a: 1 0.95:1 A\"\n");
  EXPECT_EQ(read_weighted_split_paths_file(f, flag),
            (std::vector<std::string>{"valid: 1 0.95:1 A, 2 0.95:1 B", "valid_a: 1 0.95:1 A"}));
  testing::write_bytes(f, "\"train: 1 0:1 A\"");  // no final newline: accepted
  EXPECT_EQ(read_weighted_split_paths_file(f, flag), (std::vector<std::string>{"train: 1 0:1 A"}));
  expect_invalid([&] { read_weighted_split_paths_file(tmp / "missing.txt", flag); },
                 {flag, "missing.txt", "cannot read"});
  testing::write_bytes(f, "\n");
  expect_invalid([&] { read_weighted_split_paths_file(f, flag); }, {"the file is empty"});
  testing::write_bytes(f, "\"a: 1 0:1 A\"\n\"b: 1 0:1 B\"\n");
  expect_invalid([&] { read_weighted_split_paths_file(f, flag); }, {"holds 2 lines"});
  testing::write_bytes(f, "a: 1 0:1 A\n");
  expect_invalid([&] { read_weighted_split_paths_file(f, flag); }, {"start and end with '\"'"});
}

TEST(SplitPathsBuilder, BadDataGivesClearErrors) {
  const testing::TempDir tmp;
  const fs::path dir(tmp.path());
  const std::string a = derive_dataset(dir, "a_text_document", 0, 100, false);
  DatasetBuildConfig cfg;
  cfg.seq_length = 32;
  cfg.num_samples = {100, 10, 0};
  auto build = [&] { (void)build_train_valid_test_datasets(cfg); };
  cfg.train_weighted_split_paths = {"train: 1 0:0.9 " + a + "_missing"};
  expect_invalid(build, {"--train-weighted-split-paths", "a_text_document_missing", "has no"});
  cfg.train_weighted_split_paths = {"train: 1 0:0.9 " + a + ".bin"};
  expect_invalid(build, {"without \".bin\""});
  cfg.train_weighted_split_paths = {"train: 1 0:0.001 " + a};  // round(0.1) = 0 documents
  expect_invalid(build, {"the range 0:0.001 of", "selects no document", "[0, 0) of 100"});
  cfg.train_weighted_split_paths = {"train: 1 0:0.9 " + a};
  cfg.valid_weighted_split_paths = {"valid: 1 0.85:1 " + a};
  expect_invalid(build, {"--valid-weighted-split-paths: group \"valid\" takes documents [85, 100)",
                         "overlap the training group \"train\"'s [0, 90)", "in [85, 90), 5",
                         "--allow-split-paths-overlap"});
  cfg.allow_split_paths_overlap = true;
  EXPECT_NO_THROW(build());
  cfg.allow_split_paths_overlap = false;
  cfg.valid_weighted_split_paths = {"valid: 1 0.9:1 " + a};
  EXPECT_NO_THROW(build());
  cfg.data_path = {a};
  expect_invalid(build, {"cannot be combined", "--train/valid/test-weighted-split-paths"});
  cfg.data_path.clear();
  cfg.train_weighted_split_paths.clear();
  expect_invalid(build, {"need --train-weighted-split-paths"});
}

}  // namespace
}  // namespace trident::data
