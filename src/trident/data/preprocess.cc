// preprocess: a reader thread cuts inputs into batches of documents, N workers parse and tokenize
// them, and the batches are written in input order, so output never depends on N. At most
// 2N + 2 batches (about 1 MiB of text each) are in flight: memory stays flat for any input size.
#include "trident/data/preprocess.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/timer.h"
#include "trident/data/indexed_dataset.h"
#include "trident/data/json_io.h"

namespace trident::data {

using core::DataError;
using core::InvalidArgument;
using core::str;

namespace {

constexpr std::size_t kBatchBytes = 1 << 20;
constexpr std::size_t kBatchRecords = 4096;

enum class InputKind { kJsonLines, kText };

InputKind input_kind(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".jsonl" || ext == ".json") return InputKind::kJsonLines;
  if (ext == ".txt") return InputKind::kText;
  throw InvalidArgument(str("--input ", path, ": unsupported file type '", ext,
                            "'; use .jsonl or .json (one JSON object per line) or .txt"));
}

// One document's raw text (a JSON line, or a text block) inside a batch buffer.
struct Record {
  std::size_t offset = 0, size = 0;
  std::int64_t line = 0;  // 1-based line where the record starts
};

struct Batch {
  std::string data;
  std::vector<Record> records;
  InputKind kind = InputKind::kJsonLines;
  std::string path;
};

// Tokens of one batch, per json key: all tokens back to back, the length of every sequence, and
// how many sequences each document has (0 for a document that tokenized to nothing).
struct BatchResult {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::vector<std::int32_t>> seq_lengths;
  std::vector<std::vector<std::int32_t>> doc_seqs;
  std::int64_t bytes = 0;
};

// Reads lines from a file in large blocks; a line spanning blocks is carried over.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) throw DataError(str("cannot open --input ", path, ": ", std::strerror(errno)));
  }
  ~LineReader() { std::fclose(f_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\n' (a '\r' before it is kept), or false at end of file.
  bool next(std::string_view& line, std::int64_t& line_no) {
    while (true) {
      const char* nl =
          static_cast<const char*>(std::memchr(buf_.data() + pos_, '\n', buf_.size() - pos_));
      if (nl) {
        const std::size_t end = static_cast<std::size_t>(nl - buf_.data());
        line = std::string_view(buf_.data() + pos_, end - pos_);
        pos_ = end + 1;
        line_no = ++line_no_;
        return true;
      }
      if (eof_) {
        if (pos_ == buf_.size()) return false;
        line = std::string_view(buf_.data() + pos_, buf_.size() - pos_);
        pos_ = buf_.size();
        line_no = ++line_no_;
        return true;
      }
      buf_.erase(0, pos_);
      pos_ = 0;
      const std::size_t old = buf_.size();
      buf_.resize(old + (1 << 20));
      const std::size_t got = std::fread(buf_.data() + old, 1, 1 << 20, f_);
      buf_.resize(old + got);
      if (got == 0) {
        if (std::ferror(f_)) throw DataError(str("error while reading --input ", path_));
        eof_ = true;
      }
    }
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  std::string buf_;
  std::size_t pos_ = 0;
  std::int64_t line_no_ = 0;
  bool eof_ = false;
};

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

// Cuts one input file into batches. next() returns false after the last batch.
class BatchReader {
 public:
  BatchReader(const std::string& path, TextDocuments rule)
      : path_(path), kind_(input_kind(path)), rule_(rule), lines_(path) {}

  bool next(Batch& b) {
    b = Batch{};
    b.kind = kind_, b.path = path_;
    std::string_view line;
    std::int64_t line_no = 0;
    while (b.data.size() < kBatchBytes && b.records.size() < kBatchRecords) {
      if (!lines_.next(line, line_no)) {
        flush_block(b);
        break;
      }
      if (kind_ == InputKind::kJsonLines || rule_ == TextDocuments::kLine) {
        if (is_blank(line)) continue;  // blank lines (e.g. a trailing one) hold no document
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        add(b, line, line_no);
      } else if (rule_ == TextDocuments::kBlankLine) {
        if (is_blank(line)) {
          flush_block(b);
          continue;
        }
        if (block_.empty()) block_line_ = line_no;
        if (!block_.empty()) block_ += '\n';
        block_ += line;
      } else {  // whole file
        if (line_no == 1) block_line_ = 1;
        if (line_no > 1) block_ += '\n';
        block_ += line;
      }
    }
    return !b.records.empty();
  }

 private:
  static void add(Batch& b, std::string_view text, std::int64_t line_no) {
    b.records.push_back({b.data.size(), text.size(), line_no});
    b.data.append(text);
  }
  // Ends the current text block (its final line break excluded, "\r\n" included).
  void flush_block(Batch& b) {
    if (block_.empty()) return;
    if (block_.back() == '\r') block_.pop_back();
    if (rule_ == TextDocuments::kBlankLine || !is_blank(block_)) add(b, block_, block_line_);
    block_.clear();
  }

  std::string path_;
  InputKind kind_;
  TextDocuments rule_;
  LineReader lines_;
  std::string block_;
  std::int64_t block_line_ = 0;
};

BatchResult process_batch(const Batch& b, const Tokenizer& tok, const PreprocessConfig& cfg) {
  const std::size_t nkeys = cfg.json_keys.size();
  BatchResult r;
  r.tokens.resize(nkeys), r.seq_lengths.resize(nkeys), r.doc_seqs.resize(nkeys);
  for (std::size_t k = 0; k < nkeys; ++k) {
    r.tokens[k].reserve(b.data.size() / (3 * nkeys) + 16);
    r.doc_seqs[k].reserve(b.records.size());
  }
  std::vector<std::string_view> sentences;
  nlohmann::json obj;
  for (const Record& rec : b.records) {
    const std::string_view raw(b.data.data() + rec.offset, rec.size);
    r.bytes += static_cast<std::int64_t>(rec.size);
    if (b.kind == InputKind::kJsonLines) {
      if (rec.line == 1 && raw.find_first_not_of(" \t") != std::string_view::npos &&
          raw[raw.find_first_not_of(" \t")] == '[' && !nlohmann::json::accept(raw)) {
        throw DataError(str(b.path,
                            ":1: the file looks like one JSON array; trident (like "
                            "Megatron) expects one JSON object per line (JSON Lines)"));
      }
      // A key read given twice in a line is an error (which text was meant?); other duplicates
      // keep the last value, as Megatron's json.loads does.
      obj = parse_json_line(raw, b.path, rec.line, cfg.json_keys);
    }
    for (std::size_t k = 0; k < nkeys; ++k) {
      sentences.clear();
      if (b.kind == InputKind::kText) {
        sentences.push_back(raw);
      } else {
        const auto it = obj.find(cfg.json_keys[k]);
        if (it == obj.end()) {
          std::string present;
          for (auto p = obj.begin(); p != obj.end(); ++p) {
            present += str(present.empty() ? "" : ", ", "\"", p.key(), "\"");
          }
          throw DataError(str(
              b.path, ":", rec.line, ": key \"", cfg.json_keys[k], "\" not found (the object has ",
              present.empty() ? "no keys" : present, "); choose the key with --json-keys"));
        }
        if (it->is_string()) {
          sentences.push_back(it->get_ref<const std::string&>());
        } else if (it->is_array() && std::all_of(it->begin(), it->end(),
                                                 [](const auto& s) { return s.is_string(); })) {
          for (const auto& s : *it) sentences.push_back(s.template get_ref<const std::string&>());
        } else {
          throw DataError(str(b.path, ":", rec.line, ": key \"", cfg.json_keys[k],
                              "\" holds a JSON ", it->type_name(),
                              "; expected a string (or a list of strings, one per sentence)"));
        }
      }
      // Megatron's Encoder.encode: empty sentences are dropped, EOD extends the last one.
      std::vector<std::int32_t>& toks = r.tokens[k];
      std::int32_t nseq = 0;
      for (std::string_view s : sentences) {
        const std::size_t before = toks.size();
        try {
          tok.encode_append(s, toks);
        } catch (const core::Error& e) {
          throw DataError(
              str(b.path, ":", rec.line, ": key \"", cfg.json_keys[k], "\": ", e.what()));
        }
        if (toks.size() > before) {
          r.seq_lengths[k].push_back(static_cast<std::int32_t>(toks.size() - before));
          ++nseq;
        }
      }
      if (nseq > 0 && cfg.append_eod) {
        toks.push_back(tok.eod());
        ++r.seq_lengths[k].back();
      }
      r.doc_seqs[k].push_back(nseq);
    }
  }
  return r;
}

// A fixed pool of threads running queued tasks in FIFO order.
class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

void check_config(const PreprocessConfig& cfg) {
  TRIDENT_CHECK(!cfg.inputs.empty(), "preprocess needs at least one --input file");
  TRIDENT_CHECK(!cfg.output_prefix.empty(), "preprocess needs --output-prefix");
  TRIDENT_CHECK(cfg.workers >= 1 && cfg.workers <= 1024, "--workers must be in 1..1024, got ",
                cfg.workers);
  TRIDENT_CHECK(!cfg.json_keys.empty(), "--json-keys needs at least one key");
  for (std::size_t i = 0; i < cfg.json_keys.size(); ++i) {
    TRIDENT_CHECK(!cfg.json_keys[i].empty(), "--json-keys: empty key");
    for (std::size_t j = 0; j < i; ++j) {
      TRIDENT_CHECK(cfg.json_keys[i] != cfg.json_keys[j], "--json-keys: '", cfg.json_keys[i],
                    "' given twice");
    }
  }
  for (const std::string& in : cfg.inputs) {
    if (input_kind(in) == InputKind::kText) {
      TRIDENT_CHECK(cfg.json_keys.size() == 1 && cfg.json_keys[0] == "text", "--input ", in,
                    " is a .txt file, whose documents go to the key \"text\"; "
                    "drop --json-keys (or give only 'text')");
    }
    if (!std::filesystem::is_regular_file(in)) {
      throw DataError(str("--input ", in, ": no such file"));
    }
  }
}

}  // namespace

PreprocessStats preprocess(const PreprocessConfig& cfg) {
  check_config(cfg);
  const core::Timer timer;
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(cfg.tokenizer);
  if (cfg.append_eod) tok->eod();  // fail now, not in a worker, if there is no eod token
  const TokenDType dtype = optimal_token_dtype(tok->vocab_size());

  PreprocessStats stats;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const std::string& key : cfg.json_keys) {
    stats.outputs.push_back(str(cfg.output_prefix, "_", key, "_document"));
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(stats.outputs.back(), dtype));
  }

  auto write = [&](const BatchResult& r) {
    for (std::size_t k = 0; k < builders.size(); ++k) {
      const std::int32_t* t = r.tokens[k].data();
      std::size_t s = 0;
      for (std::int32_t nseq : r.doc_seqs[k]) {
        for (std::int32_t q = 0; q < nseq; ++q, ++s) {
          const auto len = static_cast<std::size_t>(r.seq_lengths[k][s]);
          builders[k]->add_sequence(std::span<const std::int32_t>(t, len));
          t += len;
        }
        builders[k]->end_document();
      }
      stats.tokens += static_cast<std::int64_t>(r.tokens[k].size());
    }
    stats.documents += static_cast<std::int64_t>(r.doc_seqs[0].size());
    stats.bytes += r.bytes;
  };

  core::Timer since_progress;
  auto progress = [&] {
    if (cfg.progress_interval_s <= 0 || since_progress.elapsed_s() < cfg.progress_interval_s) {
      return;
    }
    since_progress.reset();
    const double s = std::max(timer.elapsed_s(), 1e-9);
    char line[200];
    std::snprintf(line, sizeof line,
                  "preprocess: %lld documents, %lld tokens (%.0f docs/s, "
                  "%.2f MB/s, %.0f tokens/s)",
                  static_cast<long long>(stats.documents), static_cast<long long>(stats.tokens),
                  stats.documents / s, stats.bytes / 1e6 / s, stats.tokens / s);
    log::info(line);
  };

  {
    ThreadPool pool(cfg.workers);
    std::deque<std::future<BatchResult>> in_flight;
    const std::size_t max_in_flight = 2 * static_cast<std::size_t>(cfg.workers) + 2;
    try {
      for (const std::string& path : cfg.inputs) {
        BatchReader reader(path, cfg.text_documents);
        auto batch = std::make_shared<Batch>();
        while (reader.next(*batch)) {
          auto task = std::make_shared<std::packaged_task<BatchResult()>>(
              [batch, &tok, &cfg] { return process_batch(*batch, *tok, cfg); });
          in_flight.push_back(task->get_future());
          pool.submit([task] { (*task)(); });
          batch = std::make_shared<Batch>();
          while (in_flight.size() >= max_in_flight) {
            write(in_flight.front().get());
            in_flight.pop_front();
            progress();
          }
        }
      }
      while (!in_flight.empty()) {
        write(in_flight.front().get());
        in_flight.pop_front();
        progress();
      }
    } catch (...) {
      for (auto& f : in_flight) {  // let workers finish before the pool goes away
        if (f.valid()) f.wait();
      }
      throw;
    }
  }
  std::string inputs;
  for (const std::string& in : cfg.inputs) inputs += str(inputs.empty() ? "" : ", ", in);
  if (stats.documents == 0) {
    throw DataError(str("empty corpus: no documents in ", inputs,
                        " (JSON lines need one object per line; blank lines are skipped)"));
  }
  if (stats.tokens == 0) {
    throw DataError(str("empty corpus: ", stats.documents, " documents in ", inputs,
                        " but every one tokenized to nothing"));
  }
  for (auto& b : builders) b->finalize();
  stats.seconds = timer.elapsed_s();
  return stats;
}

std::int64_t merge_datasets(const std::vector<std::string>& prefixes,
                            const std::string& output_prefix) {
  TRIDENT_CHECK(!prefixes.empty(), "--merge-datasets needs at least one dataset prefix");
  TRIDENT_CHECK(!output_prefix.empty(), "--merge-datasets needs --output-prefix");
  for (const std::string& p : prefixes) {
    TRIDENT_CHECK(p != output_prefix, "--output-prefix ", output_prefix,
                  " is also an input of --merge-datasets; write to a new prefix");
  }
  std::vector<std::unique_ptr<IndexedDataset>> inputs;
  for (const std::string& p : prefixes) inputs.push_back(std::make_unique<IndexedDataset>(p));
  IndexedDatasetBuilder builder(output_prefix, inputs.front()->dtype());
  std::int64_t sequences = 0;
  for (const auto& d : inputs) {
    builder.add_dataset(*d);
    sequences += d->num_sequences();
  }
  builder.finalize();
  return sequences;
}

}  // namespace trident::data
