// Checkpoints: one directory per iteration, <save>/iter_0000100/, holding manifest.json (format
// version, run configuration, parallel layout, iteration, consumed samples, the list of rank
// shards) and, for every rank, rank_00003.json (its coordinates, its parameter tables with global
// shapes and tensor-parallel split dims, byte ranges and FNV-1a checksums) and rank_00003.bin
// (its FP32 master parameters and both Adam moments). Written under a temporary name, fsynced,
// read back and verified, renamed; <save>/latest_checkpointed_iteration.txt (Megatron's tracker
// file) is replaced last. Any layout loads into any other (ckpt/reshard.h).
// Layout and guarantees: docs/formats/checkpoint.md, docs/failures-and-recovery.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/error.h"
#include "trident/model/param_table.h"

namespace trident::ckpt {

inline constexpr int kFormatVersion = 2;

// A save failed for lack of space, permissions or an I/O error (`trident train` exits with
// ExitCode::kSaveFailed): every earlier checkpoint and the tracker are intact and the failed
// save's temporary directory is removed.
class SaveError : public core::Error {
 public:
  using core::Error::Error;
};

// A checkpoint is incomplete or corrupt (missing file, truncated, checksum mismatch, malformed
// JSON): loading the latest falls back to an earlier one on this error, never on a mismatch.
class CorruptCheckpoint : public core::DataError {
 public:
  using core::DataError::DataError;
};

// One rank's parameter table and where it sits in the rank's flat buffers.
struct TableRef {
  const model::ParamTable* table = nullptr;
  std::int64_t base = 0;
};

// What a checkpoint holds for this rank, as views into the trainer's buffers (loaded in place).
struct CheckpointState {
  std::int64_t iteration = 0;
  std::int64_t consumed_train_samples = 0;
  std::int64_t consumed_valid_samples = 0;
  nlohmann::json config;  // TrainConfig::to_json(): architecture and hyper-parameters
  nlohmann::json layout;  // {"tp": T, "pp": P, "dp": D, ...}
  nlohmann::json coords;  // this rank's {"tp": t, "pp": p, "dp": d}
  nlohmann::json trainer_state = nlohmann::json::object();  // loss scaler, skip counters...
  int tp_rank = 0;
  std::vector<TableRef> tables;
  std::int64_t numel = 0;  // elements of the rank's flat layout
  // The elements this rank stores of each tensor: data[i] is flat element begin + i (a ZeRO
  // shard, or the whole [0, numel)). On load, a null data pointer skips the tensor.
  struct Slice {
    float* data = nullptr;
    std::int64_t begin = 0, end = 0;
    // data is a shared mapping of a file (--offload-optimizer nvme): saves and loads of the same
    // layout go through it in pieces and drop each piece's pages from memory after it.
    bool mapped = false;
  };
  Slice params;
  // The optimizer's state arrays over the same flat elements, by the names its update rule gives
  // them (AdamW: "exp_avg", "exp_avg_sq"; Lion: "exp_avg"), saved and loaded as `params` is; the
  // rule is the config's "optimizer" (a load refuses another rule's state by that name). A load
  // fills the slices listed here with a data pointer and ignores the rest of a checkpoint's
  // tensors.
  struct NamedSlice {
    std::string name;
    Slice slice;
  };
  std::vector<NamedSlice> optimizer_state;
  // Expert parallelism: the rank's experts, kept in buffers of their own (their tables, flat
  // layout, slices and coordinates), saved as the extra shard `experts_first_shard + rank` (the
  // manifest's "expert_shards" counts them) and loaded from it, or resharded by global index like
  // any other shard. Null without expert parallelism. Not owned.
  CheckpointState* experts = nullptr;
  int experts_first_shard = 0;

  // Every tensor a shard holds: "params", then optimizer_state in order.
  std::vector<std::pair<std::string, const Slice*>> tensors() const;
  // The tensor named `name` (params or an optimizer state array); null when the state has none.
  Slice* find(const std::string& name);
  // Some optimizer state array is to be loaded (a resume; --finetune and generation load only
  // the weights, and then a checkpoint of another update rule is fine).
  bool wants_optimizer_state() const;
};

struct SaveOptions {
  // Keep this many checkpoints (the one just saved and the newest older ones); 0 keeps all.
  // Only checkpoints older than a verified newer one are ever deleted.
  int retain = 0;
};

// Collective over `world`: writes <dir>/iter_XXXXXXX and then updates the tracker file. Every rank
// writes its own shard. Checks the free space first (SaveError naming the bytes needed when the
// checkpoint cannot fit; a warning when the next one will not). Throws SaveError naming the path
// on any I/O failure on any rank, on every rank, after removing the temporary directory.
void save_checkpoint(const std::string& dir, const CheckpointState& state,
                     comm::Communicator& world, const SaveOptions& options = {});

// The same save in three phases, for saving in the background (train/async_saver.h):
//   begin_save (collective): free-space check, temporary directory; returns its path.
//   write_shard (local, no communication, any thread): rank `rank`'s files, fsynced, read back and
//     verified; returns "" or the error message.
//   finish_save (collective): agrees on every rank's write_shard result, then rank 0 writes the
//     manifest, renames the directory into place, replaces the tracker and applies retention;
//     on failure the temporary directory is removed and SaveError is thrown on every rank.
std::string begin_save(const std::string& dir, const CheckpointState& state,
                       comm::Communicator& world);
std::string write_shard(const std::string& tmp_dir, int rank, const CheckpointState& state);
void finish_save(const std::string& dir, const std::string& tmp_dir, const CheckpointState& state,
                 comm::Communicator& world, const std::string& shard_error,
                 const SaveOptions& options = {});
// Non-collective finish for tools that write every rank's shard themselves (`trident convert`).
void finish_save_local(const std::string& dir, const std::string& tmp_dir,
                       const CheckpointState& state, int world_size,
                       const SaveOptions& options = {});

// The bytes rank shards of `state`'s sizes take on disk.
std::int64_t shard_bytes(const CheckpointState& state);

// The iteration named by <dir>/latest_checkpointed_iteration.txt, or -1 when there is none.
// Throws DataError for a corrupt tracker file.
std::int64_t latest_iteration(const std::string& dir);

// Whether <dir> has a tracker file or any complete checkpoint directory.
bool has_checkpoint(const std::string& dir);

// The iterations of the complete (renamed into place) checkpoint directories in <dir>, ascending.
std::vector<std::int64_t> list_iterations(const std::string& dir);

// Collective over `world`: loads iteration `iteration` (or the latest when < 0) of <dir> into this
// rank's buffers, after checking the format version, that the architecture equals the run's and
// every shard's size and checksum. A checkpoint of the same layout is read directly (bitwise);
// one of any other layout (TP, PP, DP, ZeRO stage, virtual stages, SP) is resharded by global
// parameter names and indices. When the latest is incomplete or corrupt, the next older complete
// checkpoint is tried, loudly (never when `iteration` names one). Throws DataError naming the file
// and the mismatch. Fills iteration and consumed counters; returns the manifest.
nlohmann::json load_checkpoint(const std::string& dir, std::int64_t iteration,
                               CheckpointState& state, comm::Communicator& world);

// Reads the parameters of a checkpoint saved in any parallel layout into the flat buffer of a
// single-rank table `full` (every parameter whole): each element is taken from the rank shard
// that holds it (tensor-parallel slices reassembled by global index). For generation, conversion
// and equivalence tests. Returns the manifest.
nlohmann::json load_full_params(const std::string& dir, std::int64_t iteration,
                                const model::ParamTable& full, float* flat);

// The manifest of <dir>'s iteration (latest when < 0), parsed; DataError when absent or corrupt.
nlohmann::json read_manifest(const std::string& dir, std::int64_t iteration);

// Whether a checkpoint's config `a` and a run's `b` (TrainConfig::to_json()) have the same model
// (ckpt/model_config_json.h, architecture_diff: the padded vocabulary is checked through the
// parameters' global shapes instead); `why` gets the per-key diff.
bool architecture_matches(const nlohmann::json& a, const nlohmann::json& b, std::string* why);

std::string iteration_dir_name(std::int64_t iteration);  // "iter_0000100"

}  // namespace trident::ckpt
