// Megatron's train/valid/test split strings ("969, 30, 1"), split matrices and blend lists
// (`--data-path 0.3 A 0.7 B`), parsed exactly as megatron-core's
// blended_megatron_dataset_config.py / utils.py do, with clear errors where Megatron would assert.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trident::data {

enum class Split : std::uint8_t { kTrain = 0, kValid = 1, kTest = 2 };
inline constexpr int kNumSplits = 3;
inline constexpr std::array<Split, kNumSplits> kAllSplits{Split::kTrain, Split::kValid,
                                                          Split::kTest};
const char* split_name(Split s);  // "train", "valid", "test" (Megatron's Split enum names)

// Megatron-LM's default --split when --data-path is given without one.
inline constexpr const char* kDefaultSplit = "969, 30, 1";

// One split's share [lo, hi) of a dataset, as fractions in [0, 1].
struct SplitBookends {
  double lo = 0;
  double hi = 0;
};
// Per split: its bookends, or nullopt when the split is empty (no dataset is built for it).
using SplitMatrix = std::array<std::optional<SplitBookends>, kNumSplits>;

// parse_and_normalize_split: every run of [.0-9] in `split` is a number (so "969,30,1",
// "969, 30, 1" and "98/2/0" all work), missing entries are 0, the three are divided by their sum.
// Throws InvalidArgument naming --split for a run that is not a number (e.g. "1.2.3"), more than
// three numbers, or numbers that sum to zero.
std::array<double, kNumSplits> parse_split(const std::string& split);

// convert_split_vector_to_split_matrix: cumulative bookends [(0, v0), (v0, v0+v1), ...], with a
// zero-width split mapped to nullopt. The sums are formed left to right as Python does.
SplitMatrix split_matrix_from_vector(const std::array<double, kNumSplits>& v);

// The split matrix as Python's json.dumps writes Megatron's list of tuples: [[0, 0.969], ...,
// null]. The very first bound is the Python int 0 (written "0", not "0.0").
nlohmann::ordered_json split_matrix_json(const SplitMatrix& m);

// The element range [begin, end) of a split over num_elements sequences:
// int(round(lo * N)), int(round(hi * N)) with Python's round-half-to-even.
std::pair<std::int64_t, std::int64_t> split_range(const SplitBookends& b,
                                                  std::int64_t num_elements);

// A parsed blend: dataset prefixes and, when given, their raw (unnormalized) weights.
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // same length as prefixes
};

// get_blend_from_list: an odd number of entries, or an even number whose every other entry is not
// a number, is a list of prefixes; otherwise the entries are (weight, prefix) pairs. Prefixes are
// stripped of surrounding whitespace. `flag` ("--data-path", "--train-data-path", ...) names the
// culprit in errors. Throws InvalidArgument for an empty list, a mix of numeric and non-numeric
// weight positions, or a weight that is not finite and > 0 (Megatron asserts weights > 0).
Blend parse_blend(const std::vector<std::string>& entries, std::string_view flag);

// utils.normalize: w / numpy.sum(w) in float64 (numpy's pairwise sum).
std::vector<double> normalize_weights(const std::vector<double>& w);

// _get_size_per_split_per_dataset: the samples to request from one dataset of a weighted blend,
// int(ceil(ceil(target * weight) * (1 + surplus))).
std::int64_t blend_samples_for_dataset(std::int64_t target, double weight, double surplus);

// Python's float(s) for the decimal forms a user types ("0.3", " 2 ", "1e-3", "+4."); nullopt for
// anything else (including hex floats, which strtod accepts and Python does not).
std::optional<double> parse_python_float(std::string_view s);

}  // namespace trident::data
