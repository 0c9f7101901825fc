// BigScience's --*-weighted-split-paths: the grammar of megatron/arguments.py (parse_data_paths,
// parse_data_paths_path) and the datasets of megatron/data/gpt_dataset.py (build_dataset_group),
// dataset_utils.py (get_split_by_range_, analyze_data_prefix,
// get_datasets_weights_and_num_samples) and blendable_dataset.py, reimplemented from their rules.
#include "trident/data/weighted_split_paths.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/data/blended_dataset.h"
#include "trident/data/index_cache.h"

namespace trident::data {

using core::DataError;
using core::str;

namespace {

constexpr const char* kGroupForm =
    "write each group as \"NAME: WEIGHT START:END PREFIX, WEIGHT START:END PREFIX, ...\", e.g. "
    "\"valid_en: 1 0.95:1 /data/en_text_document\"";

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Python's str.split() with no argument: runs of whitespace separate, none at the ends.
std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    if (is_space(s[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < s.size() && !is_space(s[j])) ++j;
    out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// Python's str.split(sep).
std::vector<std::string> split_on(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.emplace_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

// Python's float() for the forms a user types, '_' between digits included.
std::optional<double> to_float(const std::string& text) {
  std::string t;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool between = text[i] == '_' && i > 0 && i + 1 < text.size() &&
                         std::isdigit(static_cast<unsigned char>(text[i - 1])) &&
                         std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (!between) t += text[i];
  }
  return parse_python_float(t);
}

const char* split_flag(Split s) {
  switch (s) {
    case Split::kTrain:
      return "--train-weighted-split-paths";
    case Split::kValid:
      return "--valid-weighted-split-paths";
    case Split::kTest:
      return "--test-weighted-split-paths";
  }
  return "?";
}

}  // namespace

std::vector<SplitPathsGroup> parse_weighted_split_paths(const std::vector<std::string>& values,
                                                        std::string_view flag) {
  const bool train = flag.starts_with("--train-");
  TRIDENT_CHECK(!train || values.size() <= 1, flag,
                " takes one group (BigScience allows one "
                "training group), got ",
                values.size(), "; put every training dataset in it");
  std::vector<SplitPathsGroup> groups;
  std::set<std::string> names;
  for (const std::string& v : values) {
    const std::size_t colon = v.find(':');
    TRIDENT_CHECK(colon != std::string::npos, flag, ": group \"", v, "\" has no name; ",
                  kGroupForm);
    SplitPathsGroup g;
    g.name = v.substr(0, colon);
    std::string trimmed = g.name;
    while (!trimmed.empty() && is_space(trimmed.back())) trimmed.pop_back();
    while (!trimmed.empty() && is_space(trimmed.front())) trimmed.erase(trimmed.begin());
    TRIDENT_CHECK(!trimmed.empty(), flag, ": group \"", v, "\" has an empty name; ", kGroupForm);
    TRIDENT_CHECK(g.name.find('/') == std::string::npos, flag, ": group name \"", g.name,
                  "\" holds '/' (names become parts of the index cache file names)");
    TRIDENT_CHECK(names.insert(g.name).second, flag, ": two groups are named \"", g.name,
                  "\"; give each its own name (names key the logs and the index cache files)");
    const std::string rest = v.substr(colon + 1);
    for (const std::string& d : split_on(rest, ',')) {
      const std::vector<std::string> words = split_words(d);
      std::string shown;
      for (const std::string& w : words) shown += (shown.empty() ? "" : " ") + w;
      const bool spaced_name =
          std::any_of(g.name.begin(), g.name.end(), [](char ch) { return is_space(ch); });
      TRIDENT_CHECK(words.size() == 3, flag, ": in group \"", g.name, "\", \"", shown, "\" is ",
                    words.size(), " word", words.size() == 1 ? "" : "s",
                    ", not WEIGHT START:END PREFIX (a dataset per comma)",
                    spaced_name ? " (a group's name is the text before its first ':'; did the "
                                  "group leave out NAME:?)"
                                : "",
                    "; ", kGroupForm);
      SplitPathsEntry e;
      e.weight_text = words[0];
      e.range_text = words[1];
      e.prefix = words[2];
      const std::optional<double> w = to_float(e.weight_text);
      TRIDENT_CHECK(w && std::isfinite(*w) && *w > 0, flag, ": in group \"", g.name,
                    "\", the weight \"", e.weight_text, "\" of ", e.prefix,
                    " is not a number > 0 (leave a dataset out instead of weighting it 0)");
      e.weight = *w;
      const std::vector<std::string> bounds = split_on(e.range_text, ':');
      std::optional<double> lo, hi;
      if (bounds.size() == 2) {
        lo = to_float(bounds[0]);
        hi = to_float(bounds[1]);
      }
      TRIDENT_CHECK(lo && hi, flag, ": in group \"", g.name, "\", the range \"", e.range_text,
                    "\" of ", e.prefix,
                    " is not START:END, two fractions of the dataset's documents (e.g. 0:0.95)");
      e.start = *lo;
      e.end = *hi;
      TRIDENT_CHECK(e.start < e.end, flag, ": in group \"", g.name, "\", the range \"",
                    e.range_text, "\" of ", e.prefix, " is empty or reversed: START < END");
      TRIDENT_CHECK(e.start >= 0 && e.end <= 1, flag, ": in group \"", g.name, "\", the range \"",
                    e.range_text, "\" of ", e.prefix,
                    " leaves [0, 1]; START and END are fractions of the dataset's documents");
      g.datasets.push_back(std::move(e));
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

std::vector<std::string> read_weighted_split_paths_file(const std::string& path,
                                                        std::string_view flag) {
  std::error_code ec;
  TRIDENT_CHECK(std::filesystem::is_regular_file(path, ec), flag, " ", path,
                ": cannot read the file (not a regular file)");
  const auto bytes = std::filesystem::file_size(path, ec);
  TRIDENT_CHECK(!ec && bytes <= (std::uintmax_t{64} << 20), flag, " ", path, ": the file holds ",
                bytes, " bytes; a file of groups is one line (at most 64 MiB)");
  std::ifstream in(path, std::ios::binary);
  TRIDENT_CHECK(in.good(), flag, " ", path, ": cannot read the file");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  // A final newline (BigScience's files have one) and trailing blank lines are not lines.
  while (!text.empty() && is_space(text.back())) text.pop_back();
  TRIDENT_CHECK(!text.empty(), flag, " ", path,
                ": the file is empty; it must hold one line of quoted groups, \"GROUP\" \"GROUP\"");
  const std::size_t lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
  TRIDENT_CHECK(lines == 0, flag, " ", path, ": the file holds ", lines + 1,
                " lines; BigScience's format is one line of quoted groups, \"GROUP\" \"GROUP\"");
  TRIDENT_CHECK(text.size() >= 2 && text.front() == '"' && text.back() == '"', flag, " ", path,
                ": the line must start and end with '\"' (\"GROUP\" \"GROUP\" ...), got ",
                text.size() > 60 ? text.substr(0, 60) + "..." : text);
  std::vector<std::string> groups;
  const std::string inner = text.substr(1, text.size() - 2);
  std::size_t start = 0;
  while (true) {
    const std::size_t sep = inner.find("\" \"", start);
    groups.push_back(
        inner.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
    if (sep == std::string::npos) break;
    start = sep + 3;
  }
  return groups;
}

std::pair<std::int64_t, std::int64_t> split_paths_document_range(const SplitPathsEntry& e,
                                                                 std::int64_t num_documents) {
  const double n = static_cast<double>(num_documents);
  return {static_cast<std::int64_t>(std::nearbyint(e.start * n)),
          static_cast<std::int64_t>(std::nearbyint(e.end * n))};
}

std::vector<double> bigscience_normalize_weights(const std::vector<double>& w) {
  double sum = 0.0;
  for (double x : w) sum += x;
  TRIDENT_CHECK(sum > 0, "blend weights must sum to more than 0");
  std::vector<double> out;
  out.reserve(w.size());
  for (double x : w) out.push_back(x / sum);
  return out;
}

std::int64_t bigscience_samples_for_dataset(std::int64_t target, double normalized_weight) {
  return static_cast<std::int64_t>(
      std::ceil(static_cast<double>(target) * normalized_weight * 1.005));
}

// ---------------------------------------------------------------------------------------------
// BigScienceBlendedDataset

BigScienceBlendedDataset::BigScienceBlendedDataset(
    std::string name, std::vector<std::shared_ptr<const GPTDataset>> datasets,
    std::vector<double> weights, std::int64_t size)
    : name_(std::move(name)), datasets_(std::move(datasets)) {
  TRIDENT_CHECK(!datasets_.empty() && datasets_.size() == weights.size(),
                "a blend needs one weight per dataset");
  TRIDENT_CHECK(datasets_.size() < 255, "group \"", name_, "\" blends ", datasets_.size(),
                " datasets; BigScience's blend holds at most 254");
  weights_ = normalize_weights(weights);  // BlendableDataset: weights /= np.sum(weights)
  for (const auto& d : datasets_) full_length_ += d->num_samples();
  size_ = std::min(size, full_length_);
  const BlendingIndices idx = build_blending_indices(weights_, size_);
  dataset_index_ = idx.dataset_index;
  dataset_sample_index_ = idx.dataset_sample_index;
  std::vector<std::int64_t> used(datasets_.size(), 0);
  for (std::int64_t k = 0; k < size_; ++k) {
    const auto d = static_cast<std::size_t>(dataset_index_[static_cast<std::size_t>(k)]);
    used[d] = std::max(used[d], dataset_sample_index_[static_cast<std::size_t>(k)] + 1);
  }
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    if (used[d] > datasets_[d]->num_samples()) {
      throw DataError(str("group \"", name_, "\": the blend asks ",
                          datasets_[d]->config().dataset_path, " for ", used[d],
                          " samples but it has ", datasets_[d]->num_samples(),
                          " (BigScience's 0.5% surplus is not enough here)"));
    }
  }
}

void BigScienceBlendedDataset::sample(std::int64_t i, std::span<std::int32_t> out) const {
  TRIDENT_ASSERT(0 <= i && i < size_, "sample ", i, " out of range [0, ", size_, ") of ",
                 describe());
  const auto k = static_cast<std::size_t>(i);
  datasets_[static_cast<std::size_t>(dataset_index_[k])]->sample(dataset_sample_index_[k], out);
}

std::string BigScienceBlendedDataset::describe() const {
  std::string parts;
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    parts += str(d == 0 ? "" : ", ", weights_[d], " ", datasets_[d]->config().dataset_path);
  }
  return str("BigScience blend \"", name_, "\" (", size_, " of ", full_length_,
             " samples built: ", parts, ")");
}

// ---------------------------------------------------------------------------------------------
// The builder

namespace {

class SplitPathsBuilder {
 public:
  explicit SplitPathsBuilder(const SplitPathsBuildConfig& cfg) : cfg_(cfg) {}

  SplitPathsDatasets build() {
    TRIDENT_CHECK(cfg_.seq_length > 0, "--seq-length must be positive, got ", cfg_.seq_length);
    TRIDENT_CHECK(cfg_.seed >= 0 && cfg_.seed <= 0xffffffffll,
                  "--seed must be in [0, 2^32) for the dataset shuffles, got ", cfg_.seed);
    for (Split s : kAllSplits) {
      groups_[idx(s)] = parse_weighted_split_paths(cfg_.groups[idx(s)], split_flag(s));
    }
    TRIDENT_CHECK(!groups_[idx(Split::kTrain)].empty(),
                  "--valid-weighted-split-paths / --test-weighted-split-paths need "
                  "--train-weighted-split-paths (BigScience's data option 2 starts from the "
                  "training group)");
    resolve_ranges();
    check_overlaps();
    SplitPathsDatasets out;
    for (Split s : kAllSplits) {
      const std::int64_t n = cfg_.num_samples[idx(s)];
      if (n <= 0) continue;  // a split the run never reads is not built
      for (std::size_t g = 0; g < groups_[idx(s)].size(); ++g) {
        std::shared_ptr<const SampleDataset> ds = build_group(s, g, n);
        if (s == Split::kTrain) {
          out.train = ds;
        } else {
          (s == Split::kValid ? out.valid : out.test)
              .push_back({groups_[idx(s)][g].name, std::move(ds)});
        }
      }
    }
    return out;
  }

 private:
  static std::size_t idx(Split s) { return static_cast<std::size_t>(s); }

  std::shared_ptr<const IndexedDataset> open(const std::string& prefix, const char* flag) {
    auto it = opened_.find(prefix);
    if (it != opened_.end()) return it->second;
    for (const char* ext : {".idx", ".bin"}) {
      std::error_code ec;
      const std::string path = prefix + ext;
      std::string hint;
      for (const std::string bad : {".bin", ".idx"}) {
        if (prefix.size() > bad.size() &&
            prefix.compare(prefix.size() - bad.size(), bad.size(), bad) == 0) {
          hint = str(" (give the prefix without \"", bad, "\")");
        }
      }
      TRIDENT_CHECK(std::filesystem::is_regular_file(path, ec), flag, ": dataset prefix \"", prefix,
                    "\" has no ", path, hint,
                    "; a prefix P names the pair P.bin/P.idx written by `trident preprocess`");
    }
    auto ds = std::make_shared<const IndexedDataset>(prefix);
    opened_.emplace(prefix, ds);
    return ds;
  }

  // Every dataset's document range, which must hold at least one document.
  void resolve_ranges() {
    for (Split s : kAllSplits) {
      auto& rs = ranges_[idx(s)];
      for (const SplitPathsGroup& g : groups_[idx(s)]) {
        rs.emplace_back();
        for (const SplitPathsEntry& e : g.datasets) {
          const auto ds = open(e.prefix, split_flag(s));
          const auto r = split_paths_document_range(e, ds->num_sequences());
          TRIDENT_CHECK(r.second > r.first, split_flag(s), ": in group \"", g.name,
                        "\", the range ", e.range_text, " of ", e.prefix,
                        " selects no document (documents [", r.first, ", ", r.second, ") of ",
                        ds->num_sequences(), "); widen it");
          rs.back().push_back(r);
        }
      }
    }
  }

  // Validation and test ranges must not share documents with the training range of the same
  // dataset (BigScience does not check; BLOOM's own files keep 0:0.95 and 0.95:1 apart).
  void check_overlaps() {
    const auto& train = groups_[idx(Split::kTrain)];
    for (Split s : {Split::kValid, Split::kTest}) {
      for (std::size_t g = 0; g < groups_[idx(s)].size(); ++g) {
        const SplitPathsGroup& group = groups_[idx(s)][g];
        for (std::size_t d = 0; d < group.datasets.size(); ++d) {
          const auto [c, e] = ranges_[idx(s)][g][d];
          for (std::size_t t = 0; t < train.front().datasets.size(); ++t) {
            if (train.front().datasets[t].prefix != group.datasets[d].prefix) continue;
            const auto [a, b] = ranges_[idx(Split::kTrain)][0][t];
            const std::int64_t lo = std::max(a, c), hi = std::min(b, e);
            if (lo >= hi) continue;
            const std::string what =
                str(split_flag(s), ": group \"", group.name, "\" takes documents [", c, ", ", e,
                    ") (", group.datasets[d].range_text, ") of ", group.datasets[d].prefix,
                    ", which overlap the training group \"", train.front().name, "\"'s [", a, ", ",
                    b, ") (", train.front().datasets[t].range_text, ") in [", lo, ", ", hi, "), ",
                    hi - lo, " documents");
            if (!cfg_.allow_overlap) {
              throw core::InvalidArgument(
                  str(what, ": the ", s == Split::kValid ? "validation" : "test",
                      " loss would be measured on training documents. Make the ranges disjoint "
                      "(e.g. 0:0.95 and 0.95:1), or pass --allow-split-paths-overlap to do it "
                      "anyway (BigScience does not check)"));
            }
            log::warn("data: ", what, " (--allow-split-paths-overlap)");
          }
        }
      }
    }
  }

  std::shared_ptr<const GPTDataset> gpt(Split s, const SplitPathsGroup& g, std::size_t d,
                                        std::pair<std::int64_t, std::int64_t> range,
                                        std::int64_t num_samples) {
    const SplitPathsEntry& e = g.datasets[d];
    auto ds = open(e.prefix, split_flag(s));
    log::info("data: ", split_flag(s), " group \"", g.name, "\": ", e.prefix,
              " document indices in [", range.first, ", ", range.second, ") total of ",
              range.second - range.first, " documents (", e.range_text, " of ", ds->num_sequences(),
              "), ", num_samples, " samples requested");
    GPTDatasetConfig c;
    c.dataset_path = e.prefix;
    c.index_split = s;
    c.num_samples = num_samples;
    c.random_seed = cfg_.seed;
    c.sequence_length = cfg_.seq_length;
    c.cache_mode = cfg_.cache_mode;
    c.bigscience = true;
    c.bigscience_name = g.name;
    const std::string file =
        str(g.name, "_indexmap_", num_samples, "ns_", cfg_.seq_length, "sl_", cfg_.seed, "s_");
    if (cfg_.data_cache_path.empty()) {
      c.bigscience_cache_stem = str(e.prefix, "_", file);  // next to the data, as BigScience
    } else {
      std::error_code ec;
      std::filesystem::create_directories(cfg_.data_cache_path, ec);
      TRIDENT_CHECK(!ec, "cannot create --data-cache-path ", cfg_.data_cache_path, ": ",
                    ec.message());
      c.bigscience_cache_stem =
          (std::filesystem::path(cfg_.data_cache_path) /
           str(md5_hex(e.prefix).substr(0, 12), "_",
               std::filesystem::path(e.prefix).filename().string(), "_", file))
              .string();
    }
    return std::make_shared<const GPTDataset>(ds, range.first, range.second, std::move(c));
  }

  // build_dataset_group: one dataset used whole (its weight ignored, as BigScience), or a blend.
  std::shared_ptr<const SampleDataset> build_group(Split s, std::size_t g, std::int64_t n) {
    const SplitPathsGroup& group = groups_[idx(s)][g];
    const auto& ranges = ranges_[idx(s)][g];
    if (group.datasets.size() == 1) return gpt(s, group, 0, ranges[0], n);
    std::vector<double> raw;
    for (const SplitPathsEntry& e : group.datasets) raw.push_back(e.weight);
    const std::vector<double> w = bigscience_normalize_weights(raw);
    std::vector<std::shared_ptr<const GPTDataset>> parts;
    for (std::size_t d = 0; d < group.datasets.size(); ++d) {
      parts.push_back(gpt(s, group, d, ranges[d], bigscience_samples_for_dataset(n, w[d])));
    }
    auto blend =
        std::make_shared<const BigScienceBlendedDataset>(group.name, std::move(parts), w, n);
    log::info("data: ", split_flag(s), " group \"", group.name, "\": ", blend->describe());
    return blend;
  }

  const SplitPathsBuildConfig& cfg_;
  std::array<std::vector<SplitPathsGroup>, kNumSplits> groups_;
  std::array<std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>, kNumSplits> ranges_;
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened_;
};

}  // namespace

SplitPathsDatasets build_split_paths_datasets(const SplitPathsBuildConfig& cfg) {
  return SplitPathsBuilder(cfg).build();
}

}  // namespace trident::data
