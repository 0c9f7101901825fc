// Split strings, split matrices and blend lists; see dataset_split.h for the Megatron functions
// each one reproduces.
#include "trident/data/dataset_split.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "trident/core/error.h"
#include "trident/data/index_cache.h"

namespace trident::data {

const char* split_name(Split s) {
  switch (s) {
    case Split::kTrain:
      return "train";
    case Split::kValid:
      return "valid";
    case Split::kTest:
      return "test";
  }
  return "?";
}

namespace {
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
}  // namespace

std::optional<double> parse_python_float(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  if (s.empty()) return std::nullopt;
  for (char c : s) {
    const bool allowed =
        (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
    if (!allowed) return std::nullopt;  // no hex floats, inf/nan or underscores
  }
  const std::string buf(s);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(buf.c_str(), &end);
  if (end != buf.c_str() + buf.size()) return std::nullopt;
  return v;
}

std::array<double, kNumSplits> parse_split(const std::string& split) {
  std::vector<double> values;
  std::size_t i = 0;
  while (i < split.size()) {
    auto in_run = [&](std::size_t k) {
      return (split[k] >= '0' && split[k] <= '9') || split[k] == '.';
    };
    if (!in_run(i)) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < split.size() && in_run(j)) ++j;
    const std::string token = split.substr(i, j - i);
    const auto v = parse_python_float(token);
    TRIDENT_CHECK(v.has_value(), "--split \"", split, "\": \"", token,
                  "\" is not a number; write three weights such as \"969,30,1\"");
    values.push_back(*v);
    i = j;
  }
  TRIDENT_CHECK(values.size() <= kNumSplits, "--split \"", split, "\" has ", values.size(),
                " numbers; give at most three (train, valid, test), e.g. \"969,30,1\"");
  values.resize(kNumSplits, 0.0);
  const double sum = numpy_sum(values);
  TRIDENT_CHECK(sum > 0, "--split \"", split,
                "\" gives every split weight 0; give at least one positive weight, e.g. \"1,0,0\"");
  return {values[0] / sum, values[1] / sum, values[2] / sum};
}

SplitMatrix split_matrix_from_vector(const std::array<double, kNumSplits>& v) {
  SplitMatrix m;
  double lo = 0.0;
  for (int i = 0; i < kNumSplits; ++i) {
    const double hi = lo + v[static_cast<std::size_t>(i)];
    if (hi <= lo) {
      m[static_cast<std::size_t>(i)] = std::nullopt;
    } else {
      m[static_cast<std::size_t>(i)] = SplitBookends{lo, hi};
    }
    lo = hi;
  }
  return m;
}

nlohmann::ordered_json split_matrix_json(const SplitMatrix& m) {
  auto out = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (!m[i]) {
      out.push_back(nullptr);
      continue;
    }
    auto pair = nlohmann::ordered_json::array();
    if (i == 0) {
      pair.push_back(0);  // Python's literal int 0 starts the cumulative sums
    } else {
      pair.push_back(m[i]->lo);
    }
    pair.push_back(m[i]->hi);
    out.push_back(pair);
  }
  return out;
}

std::pair<std::int64_t, std::int64_t> split_range(const SplitBookends& b,
                                                  std::int64_t num_elements) {
  const double n = static_cast<double>(num_elements);
  // nearbyint rounds half to even under the default rounding mode, as Python's round() does.
  return {static_cast<std::int64_t>(std::nearbyint(b.lo * n)),
          static_cast<std::int64_t>(std::nearbyint(b.hi * n))};
}

Blend parse_blend(const std::vector<std::string>& entries, std::string_view flag) {
  TRIDENT_CHECK(!entries.empty(), flag,
                " is empty; give one or more dataset prefixes, "
                "optionally each preceded by a weight (e.g. \"0.3 dataA 0.7 dataB\")");
  auto strip = [](std::string s) {
    std::size_t a = 0, b = s.size();
    while (a < b && is_space(s[a])) ++a;
    while (b > a && is_space(s[b - 1])) --b;
    return s.substr(a, b - a);
  };
  Blend blend;
  if (entries.size() % 2 == 1) {
    for (const auto& e : entries) blend.prefixes.push_back(strip(e));
  } else {
    std::vector<double> weights;
    std::vector<std::size_t> bad;
    for (std::size_t i = 0; i < entries.size(); i += 2) {
      const auto w = parse_python_float(entries[i]);
      if (w) {
        weights.push_back(*w);
      } else {
        bad.push_back(i);
      }
    }
    if (bad.size() == entries.size() / 2) {
      for (const auto& e : entries) blend.prefixes.push_back(strip(e));
    } else {
      TRIDENT_CHECK(bad.empty(), flag, ": entry ", bad.empty() ? 0 : bad[0] + 1, " (\"",
                    entries[bad.empty() ? 0 : bad[0]],
                    "\") is not a number, but other weight positions are; write either only "
                    "prefixes or \"weight prefix\" pairs (e.g. \"0.3 dataA 0.7 dataB\")");
      for (std::size_t i = 0; i < weights.size(); ++i) {
        TRIDENT_CHECK(std::isfinite(weights[i]) && weights[i] > 0, flag, ": weight \"",
                      entries[2 * i], "\" of \"", entries[2 * i + 1],
                      "\" must be a finite number > 0");
        blend.prefixes.push_back(strip(entries[2 * i + 1]));
      }
      blend.weights = std::move(weights);
    }
  }
  for (const auto& p : blend.prefixes) {
    TRIDENT_CHECK(!p.empty(), flag, " has an empty dataset prefix");
  }
  return blend;
}

std::vector<double> normalize_weights(const std::vector<double>& w) {
  const double sum = numpy_sum(w);
  TRIDENT_CHECK(sum > 0 && std::isfinite(sum), "blend weights must sum to a positive number");
  std::vector<double> out(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) out[i] = w[i] / sum;
  return out;
}

std::int64_t blend_samples_for_dataset(std::int64_t target, double weight, double surplus) {
  const double base = std::ceil(static_cast<double>(target) * weight);
  return static_cast<std::int64_t>(std::ceil(base * (1.0 + surplus)));
}

}  // namespace trident::data
