// `trident preprocess`: tokenizes .jsonl/.json/.txt files into Megatron .bin/.idx datasets, or
// concatenates existing datasets (--merge-datasets). Flag names follow Megatron's
// tools/preprocess_data.py; docs/data.md describes the rules.
#include <cstdio>
#include <map>
#include <memory>

#include "commands.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/data/preprocess.h"

namespace trident::tools {

namespace {

struct PreprocessArgs {
  data::PreprocessConfig cfg;
  std::vector<std::string> merge;
  std::string text_documents = "blank-line";
};

void run_preprocess(const PreprocessArgs& a) {
  if (!a.merge.empty()) {
    TRIDENT_CHECK(a.cfg.inputs.empty(), "--merge-datasets and --input cannot be combined");
    const std::int64_t n = data::merge_datasets(a.merge, a.cfg.output_prefix);
    log::info("preprocess: merged ", a.merge.size(), " datasets (", n, " sequences) into ",
              a.cfg.output_prefix, ".{bin,idx}");
    return;
  }
  TRIDENT_CHECK(!a.cfg.tokenizer.type.empty(),
                "preprocess needs --tokenizer-type (GPT2BPETokenizer, HuggingFaceTokenizer, "
                "SentencePieceTokenizer or NullTokenizer)");
  data::PreprocessConfig cfg = a.cfg;
  static const std::map<std::string, data::TextDocuments> rules = {
      {"blank-line", data::TextDocuments::kBlankLine},
      {"line", data::TextDocuments::kLine},
      {"file", data::TextDocuments::kFile}};
  cfg.text_documents = rules.at(a.text_documents);
  const data::PreprocessStats s = data::preprocess(cfg);
  for (const std::string& out : s.outputs) log::info("preprocess: wrote ", out, ".{bin,idx}");
  char line[256];
  std::snprintf(line, sizeof line,
                "preprocess: %lld documents, %lld tokens, %.1f MB in %.2f s (%.0f docs/s, "
                "%.2f MB/s, %.0f tokens/s, workers: %d)",
                static_cast<long long>(s.documents), static_cast<long long>(s.tokens),
                s.bytes / 1e6, s.seconds, s.documents / s.seconds, s.bytes / 1e6 / s.seconds,
                s.tokens / s.seconds, cfg.workers);
  log::info(line);
}

}  // namespace

void register_preprocess(CLI::App& app) {
  auto args = std::make_shared<PreprocessArgs>();
  CLI::App* sub = app.add_subcommand(
      "preprocess",
      "Tokenize .jsonl/.json/.txt into Megatron .bin/.idx ({output-prefix}_{key}_document), or "
      "concatenate datasets with --merge-datasets");
  data::PreprocessConfig& c = args->cfg;
  sub->add_option("--input", c.inputs,
                  "Input files: .jsonl/.json (one JSON object per line) or .txt")
      ->check(CLI::ExistingFile);
  sub->add_option("--output-prefix", c.output_prefix, "Output path prefix")->required();
  sub->add_option("--json-keys", c.json_keys, "JSON keys to tokenize, one output per key")
      ->capture_default_str();
  sub->add_flag("--append-eod", c.append_eod, "Append the end-of-document token to each document");
  sub->add_option("--workers", c.workers, "Tokenizing threads (output is the same for any count)")
      ->capture_default_str();
  sub->add_option("--tokenizer-type", c.tokenizer.type,
                  "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, NullTokenizer");
  sub->add_option("--vocab-file", c.tokenizer.vocab_file, "vocab.json (GPT2BPETokenizer)");
  sub->add_option("--merge-file", c.tokenizer.merge_file, "merges.txt (GPT2BPETokenizer)");
  sub->add_option("--tokenizer-model", c.tokenizer.model_file,
                  "tokenizer.json (HuggingFaceTokenizer) or .model (SentencePieceTokenizer)");
  sub->add_option("--vocab-size", c.tokenizer.vocab_size, "Vocabulary size (NullTokenizer)");
  sub->add_option("--text-documents", args->text_documents,
                  "How .txt input is cut into documents: blank-line (blocks between blank "
                  "lines), line, or file")
      ->check(CLI::IsMember({"blank-line", "line", "file"}))
      ->capture_default_str();
  sub->add_option("--progress-interval", c.progress_interval_s,
                  "Seconds between progress lines (0: only the summary line)")
      ->capture_default_str();
  sub->add_option("--merge-datasets", args->merge,
                  "Concatenate these dataset prefixes (P.bin/P.idx) into --output-prefix instead "
                  "of tokenizing");
  sub->callback([args] { run_preprocess(*args); });
}

}  // namespace trident::tools
