// Internals shared by the checkpoint files (not a public interface).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace trident::ckpt::detail {

inline constexpr char kShardMagic[8] = {'T', 'R', 'C', 'K', 'P', 'T', '0', '1'};
inline constexpr std::uint64_t kFnvBasis = 1469598103934665603ull;

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = kFnvBasis);
// Throw CorruptCheckpoint naming the file when it is missing or not JSON.
std::string read_text(const std::string& path);
nlohmann::json parse_json_file(const std::string& path);
std::string rank_name(int rank, const char* ext);  // "rank_00003.json"
// A rank's shard header: parse_json_file, and CorruptCheckpoint for any float in it (headers hold
// integers, strings and booleans only).
nlohmann::json parse_shard_json(const std::string& path);

}  // namespace trident::ckpt::detail
