// Checkpoints: one directory per iteration, <save>/iter_0000100/, holding manifest.json (format
// version, run configuration, parallel layout, iteration, consumed samples, the list of rank
// shards) and, for every rank, rank_00003.json (its coordinates, its parameter tables with global
// shapes and tensor-parallel split dims, byte ranges and FNV-1a checksums) and rank_00003.bin
// (its FP32 master parameters and both Adam moments). Written under a temporary name, fsynced,
// renamed; <save>/latest_checkpointed_iteration.txt (Megatron's tracker file) is replaced last.
// Layout: docs/formats/checkpoint.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/model/param_table.h"

namespace trident::ckpt {

inline constexpr int kFormatVersion = 2;

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
  nlohmann::json layout;  // {"tp": T, "pp": P, "dp": D, ...}: must match to resume
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
  };
  Slice params, exp_avg, exp_avg_sq;
};

// Collective over `world`: writes <dir>/iter_XXXXXXX and then updates the tracker file. Every rank
// writes its own shard. Throws core::Error naming the path on any I/O failure on any rank (disk
// full...), on every rank, leaving the previous checkpoints and the tracker untouched.
void save_checkpoint(const std::string& dir, const CheckpointState& state,
                     comm::Communicator& world);

// The iteration named by <dir>/latest_checkpointed_iteration.txt, or -1 when there is none.
// Throws DataError for a corrupt tracker file.
std::int64_t latest_iteration(const std::string& dir);

// Collective over `world`: loads iteration `iteration` (or the latest when < 0) of <dir> into this
// rank's buffers, after checking the format version, that the architecture and the parallel
// layout equal the run's, this rank's parameter tables, and every shard's size and checksum.
// Throws DataError naming the file and the mismatch. Fills iteration and consumed counters;
// returns the manifest.
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

// The keys of TrainConfig::to_json() that must match between a checkpoint and a resuming run.
bool architecture_matches(const nlohmann::json& a, const nlohmann::json& b, std::string* why);

std::string iteration_dir_name(std::int64_t iteration);  // "iter_0000100"

}  // namespace trident::ckpt
