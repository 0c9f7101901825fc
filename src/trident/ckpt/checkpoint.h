// Checkpoints: one directory per iteration, <save>/iter_0000100/, holding manifest.json (format
// version, config, iteration, consumed samples, the parameter table, the shard list with sizes and
// checksums) and shard files of the flat FP32 buffers (master parameters and the two Adam
// moments) with their global element ranges. Written under a temporary name, fsynced, renamed;
// <save>/latest_checkpointed_iteration.txt (Megatron's tracker file) is replaced last.
// Layout in docs/formats/checkpoint.md.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "trident/model/param_table.h"

namespace trident::ckpt {

inline constexpr int kFormatVersion = 1;

// What a checkpoint holds, as views into the trainer's buffers (loaded in place).
struct CheckpointState {
  std::int64_t iteration = 0;
  std::int64_t consumed_train_samples = 0;
  std::int64_t consumed_valid_samples = 0;
  nlohmann::json config;  // TrainConfig::to_json(): architecture and hyper-parameters
  const model::ParamTable* table = nullptr;
  // Flat buffers of table->total_numel elements (load: exp_avg / exp_avg_sq may be null to skip).
  float* params = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

// Writes <dir>/iter_XXXXXXX and then updates the tracker file. Throws core::Error naming the path
// on any I/O failure (disk full...), leaving the previous checkpoints and tracker untouched.
void save_checkpoint(const std::string& dir, const CheckpointState& state);

// The iteration named by <dir>/latest_checkpointed_iteration.txt, or -1 when there is none.
// Throws DataError for a corrupt tracker file.
std::int64_t latest_iteration(const std::string& dir);

// Loads iteration `iteration` (or the latest when < 0) of <dir> into state's buffers, after
// checking the format version, that the architecture in the manifest equals state.config's,
// the parameter table, every shard's size and checksum. Throws DataError with the file and the
// mismatch. Fills iteration / consumed counters; returns the manifest.
nlohmann::json load_checkpoint(const std::string& dir, std::int64_t iteration,
                               CheckpointState& state);

// The keys of TrainConfig::to_json() that must match between a checkpoint and a resuming run.
bool architecture_matches(const nlohmann::json& a, const nlohmann::json& b, std::string* why);

std::string iteration_dir_name(std::int64_t iteration);  // "iter_0000100"

}  // namespace trident::ckpt
