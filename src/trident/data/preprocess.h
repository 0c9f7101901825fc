// `trident preprocess`: text or JSON lines -> Megatron .bin/.idx, as tools/preprocess_data.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trident/data/tokenizer.h"

namespace trident::data {

struct PreprocessConfig {
  std::vector<std::string> inputs;  // files (.txt / .jsonl / .json)
  std::string output_prefix;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  int workers = 1;
  TokenizerConfig tokenizer;
};

struct PreprocessStats {
  std::int64_t documents = 0, tokens = 0, bytes = 0;
  double seconds = 0;
};

// Writes {output_prefix}_{key}_document.{bin,idx} for every json key ("text" for .txt input).
PreprocessStats preprocess(const PreprocessConfig& cfg);

}  // namespace trident::data
