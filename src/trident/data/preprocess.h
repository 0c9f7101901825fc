// `trident preprocess`: text or JSON lines -> Megatron .bin/.idx, as tools/preprocess_data.py, and
// merging of preprocessed datasets, as tools/merge_datasets.py. How inputs become documents and
// the exact output rules are in docs/data.md ("Preprocessing").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trident/data/tokenizer.h"

namespace trident::data {

// How a .txt input is cut into documents.
enum class TextDocuments {
  kBlankLine,  // a document is a block of lines between blank (whitespace-only) lines (default)
  kLine,       // every non-blank line is a document
  kFile,       // the whole file is one document
};

struct PreprocessConfig {
  std::vector<std::string> inputs;  // files (.jsonl / .json: one JSON object per line; .txt)
  std::string output_prefix;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  int workers = 1;  // tokenizing threads; the output is the same for any count
  TextDocuments text_documents = TextDocuments::kBlankLine;
  double progress_interval_s = 5;  // seconds between progress lines (<= 0: none)
  TokenizerConfig tokenizer;
};

struct PreprocessStats {
  std::int64_t documents = 0, tokens = 0, bytes = 0;  // documents read, tokens written, input bytes
  double seconds = 0;
  std::vector<std::string> outputs;  // the prefixes written: {output_prefix}_{key}_document
};

// Writes {output_prefix}_{key}_document.{bin,idx} for every json key ("text" for .txt input),
// with dtype optimal_token_dtype(tokenizer vocab size). Documents are written in input order.
// Throws InvalidArgument for bad settings, DataError for unreadable input (naming file and line),
// a missing key, or an empty corpus (no document, or no token at all); nothing is written then.
PreprocessStats preprocess(const PreprocessConfig& cfg);

// Concatenates datasets (all of one dtype) into output_prefix.{bin,idx}, in the given order, as
// Megatron's tools/merge_datasets.py does. Returns the number of sequences written.
std::int64_t merge_datasets(const std::vector<std::string>& prefixes,
                            const std::string& output_prefix);

}  // namespace trident::data
