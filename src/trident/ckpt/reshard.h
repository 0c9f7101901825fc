// Resharding: fills one rank's checkpoint state (its layout's parameter tables and stored slices)
// from a checkpoint saved in any other layout. Every element of every tensor is named by
// (parameter name, global flat index) on both sides: a destination element is mapped to its global
// index through its tensor-parallel split, and read from the first source rank shard that holds
// that global index in its stored slice (a tensor-parallel slice, a pipeline stage's parameters, a
// ZeRO shard). Source shards are memory-mapped and each tensor used is checksummed once.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

#include "trident/ckpt/checkpoint.h"

namespace trident::ckpt {

// Fills the slices of `state` with non-null data (padding between parameters zeroed). The
// vocabulary's rows (word embedding, untied output layer) may be padded to another count than the
// checkpoint's: its padding rows beyond the destination's are dropped, and destination rows beyond
// its are copies of its last row (weights and Adam moments), as Megatron's checkpoint converters
// pad; the caller says so. Throws CorruptCheckpoint for a missing, truncated or corrupt source
// shard, DataError when a parameter is missing from the checkpoint or its global shape differs
// otherwise.
void load_resharded(const std::filesystem::path& it_dir, const nlohmann::json& manifest,
                    CheckpointState& state);

}  // namespace trident::ckpt
