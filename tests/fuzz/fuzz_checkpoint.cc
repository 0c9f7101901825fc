// Fuzz target: reading a checkpoint directory (ckpt/checkpoint.h). The input is manifest.json,
// rank_00000.json (the shard header: tables, tensors, byte ranges, checksums), rank_00000.bin and
// latest_checkpointed_iteration.txt, joined by fuzz_util.h's separator; they are laid out as
// <scratch>/ckpt/iter_0000001/. The reader runs as generation (load_full_params) and as a resuming
// single-process run of a tiny model (load_checkpoint). Everything it may do with bad bytes is
// throw DataError (or InvalidArgument); it must never write outside the buffers it was given.
// TRIDENT_FUZZ_DUMP_SEED=<file> writes a valid checkpoint of this model as a seed and exits.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/comm/self_communicator.h"
#include "trident/model/param_table.h"

namespace {

using namespace trident;
namespace fs = std::filesystem;

struct Setup {
  model::ParamTable table;
  nlohmann::json config, layout;
  std::string dir;
};

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

ckpt::CheckpointState make_state(const Setup& s, std::vector<float>& buf) {
  const std::int64_t n = s.table.total_numel;
  buf.assign(static_cast<std::size_t>(3 * n), 0.0f);
  ckpt::CheckpointState st;
  st.config = s.config;
  st.layout = s.layout;
  st.coords = {{"tp", 0}, {"pp", 0}, {"dp", 0}};
  st.tables.push_back({&s.table, 0});
  st.numel = n;
  st.params = {buf.data(), 0, n};
  st.optimizer_state = {{"exp_avg", {buf.data() + n, 0, n}},
                        {"exp_avg_sq", {buf.data() + 2 * n, 0, n}}};
  return st;
}

const Setup& setup() {
  static const Setup s = [] {
    Setup r;
    model::ModelConfig mc;
    mc.num_layers = 1;
    mc.hidden_size = 8;
    mc.num_attention_heads = 2;
    mc.seq_length = 4;
    mc.vocab_size = 10;
    mc.make_vocab_size_divisible_by = 4;
    r.table = model::build_gpt_param_table(mc);
    r.config = {{"num_layers", 1},
                {"hidden_size", 8},
                {"num_attention_heads", 2},
                {"ffn_hidden_size", 32},
                {"seq_length", 4},
                {"max_position_embeddings", 4},
                {"vocab_size", 10},
                {"make_vocab_size_divisible_by", 4},
                {"position_embedding_type", "learned_absolute"},
                {"embed_layernorm", false}};
    r.layout = {{"tp", 1}, {"pp", 1}, {"dp", 1}, {"zero_stage", 0}};
    r.dir = fuzz::scratch_path("ckpt");
    if (const char* seed = std::getenv("TRIDENT_FUZZ_DUMP_SEED")) {
      std::vector<float> buf;
      ckpt::CheckpointState st = make_state(r, buf);
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = 0.001f * static_cast<float>(i % 97);
      st.iteration = 1;
      st.consumed_train_samples = 8;
      comm::SelfCommunicator world;
      ckpt::save_checkpoint(r.dir, st, world);
      const fs::path it = fs::path(r.dir) / "iter_0000001";
      std::ofstream out(seed, std::ios::binary);
      out << read_all(it / "manifest.json") << fuzz::kSeparator << read_all(it / "rank_00000.json")
          << fuzz::kSeparator << read_all(it / "rank_00000.bin") << fuzz::kSeparator
          << read_all(fs::path(r.dir) / "latest_checkpointed_iteration.txt");
      out.close();
      std::error_code ec;
      std::filesystem::remove_all(fuzz::scratch_dir(), ec);
      std::_Exit(out ? 0 : 1);  // not exit(): libFuzzer reports an exit inside a run
    }
    fs::create_directories(fs::path(r.dir) / "iter_0000001");
    return r;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Setup& s = setup();
  const auto parts = fuzz::split_input(data, size, 4);
  const fs::path it = fs::path(s.dir) / "iter_0000001";
  fuzz::write_file((it / "manifest.json").string(), parts[0]);
  fuzz::write_file((it / "rank_00000.json").string(), parts[1]);
  fuzz::write_file((it / "rank_00000.bin").string(), parts[2]);
  fuzz::write_file((fs::path(s.dir) / "latest_checkpointed_iteration.txt").string(), parts[3]);
  fuzz::expect_clean_errors("fuzz_checkpoint", [&] {
    (void)ckpt::latest_iteration(s.dir);
    (void)ckpt::read_manifest(s.dir, -1);
  });
  fuzz::expect_clean_errors("fuzz_checkpoint", [&] {
    std::vector<float> flat(static_cast<std::size_t>(s.table.total_numel));
    (void)ckpt::load_full_params(s.dir, -1, s.table, flat.data());
  });
  fuzz::expect_clean_errors("fuzz_checkpoint", [&] {
    std::vector<float> buf;
    ckpt::CheckpointState st = make_state(s, buf);
    comm::SelfCommunicator world;
    (void)ckpt::load_checkpoint(s.dir, -1, st, world);
  });
  return 0;
}
