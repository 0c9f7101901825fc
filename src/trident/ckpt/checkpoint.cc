#include "trident/ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident::ckpt {

namespace fs = std::filesystem;
using core::DataError;
using core::Error;
using core::str;

namespace {

constexpr char kShardMagic[8] = {'T', 'R', 'C', 'K', 'P', 'T', '0', '1'};
const char* const kTensors[] = {"params", "exp_avg", "exp_avg_sq"};

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  // Eight independent lanes would be faster; one lane is ~1 GB/s, enough next to disk speed.
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string errno_text() { return std::strerror(errno); }

// Writes `n` bytes or throws naming the file (ENOSPC says the disk is full).
void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(str("checkpoint: writing ", path, " failed: ", errno_text(),
                      errno == ENOSPC ? " (the disk is full: free space or change --save)" : ""));
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error(str("checkpoint: cannot open ", path, " to sync: ", errno_text()));
  if (::fsync(fd) != 0) {
    ::close(fd);
    throw Error(str("checkpoint: fsync of ", path, " failed: ", errno_text()));
  }
  ::close(fd);
}

void write_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(str("checkpoint: cannot create ", path, ": ", errno_text()));
  try {
    write_all(fd, text.data(), text.size(), path);
    if (::fsync(fd) != 0) throw Error(str("checkpoint: fsync of ", path, " failed: ", errno_text()));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error(str("checkpoint: closing ", path, " failed: ", errno_text()));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(str("checkpoint: cannot read ", path));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

nlohmann::json table_json(const model::ParamTable& t) {
  nlohmann::json params = nlohmann::json::array();
  for (const model::ParamSpec& p : t.params) {
    params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset},
                      {"numel", p.numel}});
  }
  return {{"total_numel", t.total_numel}, {"params", params}};
}

}  // namespace

std::string iteration_dir_name(std::int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

bool architecture_matches(const nlohmann::json& a, const nlohmann::json& b, std::string* why) {
  static const char* const kKeys[] = {"num_layers", "hidden_size", "num_attention_heads",
                                      "ffn_hidden_size", "seq_length", "max_position_embeddings",
                                      "vocab_size", "make_vocab_size_divisible_by"};
  std::ostringstream diff;
  for (const char* key : kKeys) {
    const nlohmann::json va = a.contains(key) ? a[key] : nlohmann::json();
    const nlohmann::json vb = b.contains(key) ? b[key] : nlohmann::json();
    if (va != vb) diff << " " << key << ": checkpoint " << va.dump() << " vs run " << vb.dump() << ";";
  }
  if (why) *why = diff.str();
  return diff.str().empty();
}

void save_checkpoint(const std::string& dir, const CheckpointState& s) {
  TRIDENT_ASSERT(s.table && s.params && s.exp_avg && s.exp_avg_sq, "incomplete checkpoint state");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str("checkpoint: cannot create --save directory ", dir, ": ", ec.message()));
  const std::string name = iteration_dir_name(s.iteration);
  const std::string final_dir = (fs::path(dir) / name).string();
  const std::string tmp_dir = final_dir + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) throw Error(str("checkpoint: cannot create ", tmp_dir, ": ", ec.message()));

  try {
    const std::int64_t n = s.table->total_numel;
    const std::string shard_name = "model_optim_rank0000.bin";
    const std::string shard_path = (fs::path(tmp_dir) / shard_name).string();
    const int fd = ::open(shard_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw Error(str("checkpoint: cannot create ", shard_path, ": ", errno_text()));
    nlohmann::json tensors = nlohmann::json::array();
    try {
      write_all(fd, kShardMagic, sizeof(kShardMagic), shard_path);
      std::int64_t offset = sizeof(kShardMagic);
      const float* buffers[] = {s.params, s.exp_avg, s.exp_avg_sq};
      for (int t = 0; t < 3; ++t) {
        const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
        write_all(fd, buffers[t], bytes, shard_path);
        tensors.push_back({{"tensor", kTensors[t]}, {"begin", 0}, {"end", n},
                           {"file_offset", offset}, {"bytes", bytes},
                           {"fnv1a64", str(std::hex, fnv1a(buffers[t], bytes))}});
        offset += static_cast<std::int64_t>(bytes);
      }
      if (::fsync(fd) != 0) throw Error(str("checkpoint: fsync of ", shard_path, " failed: ", errno_text()));
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw Error(str("checkpoint: closing ", shard_path, " failed: ", errno_text()));

    nlohmann::json manifest;
    manifest["format"] = "trident-checkpoint";
    manifest["format_version"] = kFormatVersion;
    manifest["iteration"] = s.iteration;
    manifest["consumed_train_samples"] = s.consumed_train_samples;
    manifest["consumed_valid_samples"] = s.consumed_valid_samples;
    manifest["config"] = s.config;
    manifest["param_table"] = table_json(*s.table);
    manifest["shards"] = {{{"file", shard_name}, {"rank", 0}, {"tensors", tensors}}};
    write_file((fs::path(tmp_dir) / "manifest.json").string(), manifest.dump(1));
    fsync_path(tmp_dir, true);

    // Replace an existing checkpoint of the same iteration only once the new one is complete.
    const std::string old_dir = final_dir + ".old." + std::to_string(::getpid());
    const bool had_old = fs::exists(final_dir);
    if (had_old) fs::rename(final_dir, old_dir);
    fs::rename(tmp_dir, final_dir);
    fsync_path(dir, true);
    if (had_old) fs::remove_all(old_dir, ec);

    const std::string tracker = (fs::path(dir) / "latest_checkpointed_iteration.txt").string();
    write_file(tracker + ".tmp", std::to_string(s.iteration) + "\n");
    fs::rename(tracker + ".tmp", tracker);
    fsync_path(dir, true);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp_dir, ec);
    throw Error(str("checkpoint: saving to ", dir, " failed: ", e.what()));
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
}

std::int64_t latest_iteration(const std::string& dir) {
  const std::string tracker = (fs::path(dir) / "latest_checkpointed_iteration.txt").string();
  if (!fs::exists(tracker)) return -1;
  const std::string text = read_text(tracker);
  std::size_t used = 0;
  long long it = -1;
  try {
    it = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  while (used < text.size() && std::isspace(static_cast<unsigned char>(text[used]))) ++used;
  if (used != text.size() || it < 0) {
    throw DataError(str(tracker, ": expected an iteration number, found '", text,
                        "' (fix or delete the file)"));
  }
  return it;
}

nlohmann::json load_checkpoint(const std::string& dir, std::int64_t iteration,
                               CheckpointState& s) {
  TRIDENT_ASSERT(s.table && s.params, "incomplete checkpoint state");
  if (!fs::is_directory(dir)) {
    throw DataError(str("--load ", dir, ": no such directory"));
  }
  if (iteration < 0) iteration = latest_iteration(dir);
  if (iteration < 0) {
    throw DataError(str("--load ", dir, ": no latest_checkpointed_iteration.txt (not a checkpoint "
                        "directory, or no checkpoint finished)"));
  }
  const fs::path it_dir = fs::path(dir) / iteration_dir_name(iteration);
  const std::string manifest_path = (it_dir / "manifest.json").string();
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_text(manifest_path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str(manifest_path, ": corrupt manifest (", e.what(), ")"));
  }
  try {
    if (m.value("format", "") != "trident-checkpoint" ||
        m.value("format_version", -1) != kFormatVersion) {
      throw DataError(str(manifest_path, ": not a trident checkpoint of format version ",
                          kFormatVersion));
    }
    std::string why;
    if (!architecture_matches(m.at("config"), s.config, &why)) {
      throw DataError(str(manifest_path, ": the checkpoint's model differs from this run's:", why,
                          " (use the checkpoint's settings)"));
    }
    if (m.at("param_table") != table_json(*s.table)) {
      throw DataError(str(manifest_path, ": parameter table differs from this run's model"));
    }
    const std::int64_t n = s.table->total_numel;
    float* buffers[] = {s.params, s.exp_avg, s.exp_avg_sq};
    for (const nlohmann::json& shard : m.at("shards")) {
      const std::string path = (it_dir / shard.at("file").get<std::string>()).string();
      std::ifstream in(path, std::ios::binary);
      if (!in) throw DataError(str(path, ": missing shard file"));
      char magic[8];
      in.read(magic, 8);
      if (!in || std::memcmp(magic, kShardMagic, 8) != 0) {
        throw DataError(str(path, ": bad magic at byte 0 (expected TRCKPT01)"));
      }
      for (const nlohmann::json& t : shard.at("tensors")) {
        const std::string tensor = t.at("tensor");
        int which = -1;
        for (int k = 0; k < 3; ++k)
          if (tensor == kTensors[k]) which = k;
        if (which < 0) throw DataError(str(path, ": unknown tensor '", tensor, "'"));
        if (buffers[which] == nullptr) continue;  // not wanted (e.g. generation skips Adam state)
        const std::int64_t begin = t.at("begin"), end = t.at("end");
        const std::int64_t bytes = t.at("bytes"), offset = t.at("file_offset");
        if (begin < 0 || end > n || begin > end || bytes != (end - begin) * 4) {
          throw DataError(str(path, ": tensor ", tensor, " range [", begin, ", ", end,
                              ") does not fit the model's ", n, " elements"));
        }
        in.seekg(offset);
        in.read(reinterpret_cast<char*>(buffers[which] + begin), bytes);
        if (!in) {
          throw DataError(str(path, ": truncated: tensor ", tensor, " needs ", bytes,
                              " bytes at offset ", offset));
        }
        const std::string sum = str(std::hex, fnv1a(buffers[which] + begin, static_cast<std::size_t>(bytes)));
        if (sum != t.at("fnv1a64").get<std::string>()) {
          throw DataError(str(path, ": checksum mismatch in tensor ", tensor,
                              " (the file is corrupt; load an earlier iteration)"));
        }
      }
    }
    s.iteration = m.at("iteration");
    s.consumed_train_samples = m.at("consumed_train_samples");
    s.consumed_valid_samples = m.value("consumed_valid_samples", 0);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str(manifest_path, ": malformed manifest (", e.what(), ")"));
  }
  log::info("ckpt: loaded ", it_dir.string(), " (iteration ", s.iteration, ")");
  return m;
}

}  // namespace trident::ckpt
