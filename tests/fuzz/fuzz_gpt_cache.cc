// Fuzz target: loading a GPTDataset's index cache (document_index.npy, sample_index.npy,
// shuffle_index.npy next to a matching description.txt) that another run or tool wrote. The input
// is the three .npy files joined by fuzz_util.h's separator. A cache that is accepted must give
// every sample without reading outside the dataset; a corrupt one is rejected with DataError
// (CacheMode::kLoadOnly) instead of being rebuilt.
// TRIDENT_FUZZ_DUMP_SEED=<file> writes the valid cache of this setup as a seed and exits.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/data/gpt_dataset.h"
#include "trident/data/indexed_dataset.h"

namespace {

using namespace trident;

struct Setup {
  std::shared_ptr<const data::IndexedDataset> ds;
  data::GPTDatasetConfig cfg;
  std::string stem;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

const Setup& setup() {
  static const Setup s = [] {
    Setup r;
    const std::string prefix = fuzz::scratch_path("corpus");
    {
      data::IndexedDatasetBuilder b(prefix, data::TokenDType::kU16);
      const std::int32_t lengths[] = {5, 1, 9, 3, 12, 2, 7, 4};
      std::int32_t tok = 0;
      for (const std::int32_t n : lengths) {
        std::vector<std::int32_t> seq(static_cast<std::size_t>(n));
        for (auto& t : seq) t = tok++ % 50;
        b.add_sequence(seq);
        b.end_document();
      }
      b.finalize();
    }
    r.ds = std::make_shared<data::IndexedDataset>(prefix);
    r.cfg.dataset_path = prefix;
    r.cfg.index_split = data::Split::kTrain;
    r.cfg.num_samples = 11;  // more than one epoch: two epochs, the last one separate
    r.cfg.sequence_length = 6;
    r.cfg.cache_dir = fuzz::scratch_path("cache");
    r.cfg.pad_id = 99;
    // Build once (writes a valid cache), then only load.
    const data::GPTDataset built(r.ds, 0, r.ds->num_sequences(), r.cfg);
    r.stem = built.cache_file_stem();
    r.cfg.cache_mode = data::CacheMode::kLoadOnly;
    if (const char* seed = std::getenv("TRIDENT_FUZZ_DUMP_SEED")) {
      std::ofstream out(seed, std::ios::binary);
      out << read_all(r.stem + "document_index.npy") << fuzz::kSeparator
          << read_all(r.stem + "sample_index.npy") << fuzz::kSeparator
          << read_all(r.stem + "shuffle_index.npy");
      out.close();
      std::error_code ec;
      std::filesystem::remove_all(fuzz::scratch_dir(), ec);
      std::_Exit(out ? 0 : 1);  // not exit(): libFuzzer reports an exit inside a run
    }
    return r;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Setup& s = setup();
  const auto parts = fuzz::split_input(data, size, 3);
  fuzz::write_file(s.stem + "document_index.npy", parts[0]);
  fuzz::write_file(s.stem + "sample_index.npy", parts[1]);
  fuzz::write_file(s.stem + "shuffle_index.npy", parts[2]);
  fuzz::expect_clean_errors("fuzz_gpt_cache", [&] {
    const data::GPTDataset ds(s.ds, 0, s.ds->num_sequences(), s.cfg);
    std::vector<std::int32_t> out(static_cast<std::size_t>(ds.seq_length() + 1));
    for (std::int64_t i = 0; i < ds.num_samples(); ++i) {
      ds.sample(i, out);
      for (const std::int32_t t : out) {
        if (t != s.cfg.pad_id && (t < 0 || t >= 50)) __builtin_trap();
      }
    }
  });
  return 0;
}
