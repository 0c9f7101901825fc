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
    if (::fsync(fd) != 0)
      throw Error(str("checkpoint: fsync of ", path, " failed: ", errno_text()));
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

nlohmann::json table_json(const model::ParamTable& t, std::int64_t base) {
  nlohmann::json params = nlohmann::json::array();
  for (const model::ParamSpec& p : t.params) {
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"global_shape", p.global_shape},
                      {"tp_split_dim", p.tp_split_dim},
                      {"shared", p.shared},
                      {"offset", base + p.offset},
                      {"numel", p.numel}});
  }
  return {{"total_numel", t.total_numel}, {"base", base}, {"params", params}};
}

nlohmann::json tables_json(const std::vector<TableRef>& tables) {
  nlohmann::json j = nlohmann::json::array();
  for (const TableRef& t : tables) j.push_back(table_json(*t.table, t.base));
  return j;
}

std::string rank_name(int rank, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.%s", rank, ext);
  return buf;
}

nlohmann::json parse_json_file(const std::string& path) {
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str(path, ": corrupt JSON (", e.what(), ")"));
  }
}

// A shard header holds only integers, strings and booleans. nlohmann converts a float such as
// 1e300 to an integer with undefined behaviour, so a float anywhere in one is corruption.
void require_no_floats(const nlohmann::json& j, const std::string& path) {
  if (j.is_number_float()) {
    throw DataError(str(path, ": unexpected number ", j.dump(),
                        " where integers are expected"
                        " (the checkpoint is corrupt; load an earlier iteration)"));
  }
  if (j.is_structured()) {
    for (const nlohmann::json& v : j) require_no_floats(v, path);
  }
}

nlohmann::json parse_shard_json(const std::string& path) {
  nlohmann::json j = parse_json_file(path);
  require_no_floats(j, path);
  return j;
}

// Every rank learns whether every rank succeeded; the failures' messages are not shared, so each
// failing rank reports its own and the others name the failing ranks' count.
void agree_or_throw(comm::Communicator& world, const std::string& my_error, const char* what) {
  std::int64_t failed = my_error.empty() ? 0 : 1;
  if (world.size() > 1) world.all_reduce(&failed, 1, comm::Datatype::kI64, comm::ReduceOp::kSum);
  if (!my_error.empty()) throw Error(my_error);
  if (failed > 0) {
    throw Error(
        str("checkpoint: ", what, " failed on ", failed, " other rank(s); see their errors"));
  }
}

// Reads this rank's shard (json + bin) into the given buffers; checks sizes and checksums.
void read_shard(const fs::path& it_dir, int rank, std::int64_t numel,
                const CheckpointState::Slice* const slices[3]) {
  const std::string json_path = (it_dir / rank_name(rank, "json")).string();
  const std::string path = (it_dir / rank_name(rank, "bin")).string();
  const nlohmann::json shard = parse_shard_json(json_path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(str(path, ": missing shard file"));
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, kShardMagic, 8) != 0) {
    throw DataError(str(path, ": bad magic at byte 0 (expected TRCKPT01)"));
  }
  try {
    for (const nlohmann::json& t : shard.at("tensors")) {
      const std::string tensor = t.at("tensor");
      int which = -1;
      for (int k = 0; k < 3; ++k)
        if (tensor == kTensors[k]) which = k;
      if (which < 0) throw DataError(str(path, ": unknown tensor '", tensor, "'"));
      const CheckpointState::Slice& slice = *slices[which];
      if (slice.data == nullptr) continue;  // not wanted (e.g. generation skips Adam state)
      const std::int64_t begin = t.at("begin"), end = t.at("end");
      const std::int64_t bytes = t.at("bytes"), offset = t.at("file_offset");
      if (begin < 0 || end > numel || begin > end || bytes != (end - begin) * 4 ||
          begin != slice.begin || end != slice.end) {
        throw DataError(str(path, ": tensor ", tensor, " holds elements [", begin, ", ", end,
                            ") of the rank's ", numel, "; this run expects [", slice.begin, ", ",
                            slice.end, ")"));
      }
      in.seekg(offset);
      in.read(reinterpret_cast<char*>(slice.data), bytes);
      if (!in) {
        throw DataError(str(path, ": truncated: tensor ", tensor, " needs ", bytes,
                            " bytes at offset ", offset));
      }
      const std::string sum = str(std::hex, fnv1a(slice.data, static_cast<std::size_t>(bytes)));
      if (sum != t.at("fnv1a64").get<std::string>()) {
        throw DataError(str(path, ": checksum mismatch in tensor ", tensor,
                            " (the file is corrupt; load an earlier iteration)"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str(json_path, ": malformed shard description (", e.what(), ")"));
  }
}

// A shard header's parameter entry, before load_full_params indexes with it: its slice must be a
// tensor-parallel slice of the model's parameter (global_shape == dst.shape was checked) that lies
// in the rank's layout of n elements.
void check_param_slice(const model::ParamSpec& src, const model::ParamSpec& dst,
                       std::int64_t offset, std::int64_t n, int tp_rank, const std::string& where) {
  const auto fail = [&](const char* what) {
    throw DataError(str(where, ": parameter ", dst.name, ": ", what, " (shape ",
                        nlohmann::json(src.shape).dump(), ", tp_split_dim ", src.tp_split_dim,
                        ", tp_rank ", tp_rank, ", offset ", offset, ", numel ", src.numel,
                        "); the checkpoint is corrupt"));
  };
  if (src.shape.size() != dst.shape.size()) fail("local and global shapes differ in rank");
  std::int64_t numel = 1;
  for (std::size_t d = 0; d < src.shape.size(); ++d) {
    if (src.shape[d] < 1 || src.shape[d] > dst.shape[d]) fail("a local dimension out of range");
    numel *= src.shape[d];  // <= dst.numel: no overflow
  }
  if (numel != src.numel) fail("numel is not the product of the shape");
  if (offset < 0 || offset > n || src.numel > n - offset) fail("slice outside the rank's layout");
  if (tp_rank < 0) fail("negative tp_rank");
  const int split = src.tp_split_dim;
  if (split < -1 || split >= static_cast<int>(src.shape.size()) || split > 1) {
    fail("tp_split_dim is not -1, 0 or 1 of the shape");
  }
  for (std::size_t d = 0; d < src.shape.size(); ++d) {
    if (static_cast<int>(d) != split && src.shape[d] != dst.shape[d]) {
      fail("an unsplit dimension differs from the model's");
    }
  }
  if (split >= 0) {
    const std::int64_t local = src.shape[static_cast<std::size_t>(split)];
    if (tp_rank >= dst.shape[static_cast<std::size_t>(split)] / local ||
        dst.shape[static_cast<std::size_t>(split)] % local != 0) {
      fail("the split dimension is not this tp_rank's slice of the model's");
    }
  }
}

}  // namespace

std::string iteration_dir_name(std::int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

bool architecture_matches(const nlohmann::json& a, const nlohmann::json& b, std::string* why) {
  static const char* const kKeys[] = {"num_layers",
                                      "hidden_size",
                                      "num_attention_heads",
                                      "ffn_hidden_size",
                                      "seq_length",
                                      "max_position_embeddings",
                                      "vocab_size",
                                      "make_vocab_size_divisible_by",
                                      "position_embedding_type",
                                      "embed_layernorm"};
  std::ostringstream diff;
  for (const char* key : kKeys) {
    const nlohmann::json va = a.contains(key) ? a[key] : nlohmann::json();
    const nlohmann::json vb = b.contains(key) ? b[key] : nlohmann::json();
    if (va != vb)
      diff << " " << key << ": checkpoint " << va.dump() << " vs run " << vb.dump() << ";";
  }
  if (why) *why = diff.str();
  return diff.str().empty();
}

void save_checkpoint(const std::string& dir, const CheckpointState& s, comm::Communicator& world) {
  TRIDENT_ASSERT(s.params.data && s.exp_avg.data && s.exp_avg_sq.data,
                 "incomplete checkpoint state");
  const std::string name = iteration_dir_name(s.iteration);
  const std::string final_dir = (fs::path(dir) / name).string();
  // One temporary name for the whole job: rank 0's pid, broadcast.
  std::int64_t token = ::getpid();
  if (world.size() > 1) world.broadcast(&token, 1, comm::Datatype::kI64, 0);
  const std::string tmp_dir = final_dir + ".tmp." + std::to_string(token);
  std::error_code ec;

  std::string error;
  if (world.rank() == 0) {
    try {
      fs::create_directories(dir);
      fs::remove_all(tmp_dir);
      fs::create_directories(tmp_dir);
    } catch (const fs::filesystem_error& e) {
      error = str("checkpoint: cannot create ", tmp_dir, " (--save ", dir, "): ", e.what());
    }
  }
  agree_or_throw(world, error, "creating the checkpoint directory");

  // Every rank writes its shard.
  try {
    const std::int64_t n = s.numel;
    const std::string shard_path = (fs::path(tmp_dir) / rank_name(world.rank(), "bin")).string();
    const int fd = ::open(shard_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw Error(str("checkpoint: cannot create ", shard_path, ": ", errno_text()));
    nlohmann::json tensors = nlohmann::json::array();
    try {
      write_all(fd, kShardMagic, sizeof(kShardMagic), shard_path);
      std::int64_t offset = sizeof(kShardMagic);
      const CheckpointState::Slice* slices[] = {&s.params, &s.exp_avg, &s.exp_avg_sq};
      for (int t = 0; t < 3; ++t) {
        const CheckpointState::Slice& sl = *slices[t];
        TRIDENT_ASSERT(0 <= sl.begin && sl.begin <= sl.end && sl.end <= n, "bad slice");
        const std::size_t bytes = static_cast<std::size_t>(sl.end - sl.begin) * sizeof(float);
        write_all(fd, sl.data, bytes, shard_path);
        tensors.push_back({{"tensor", kTensors[t]},
                           {"begin", sl.begin},
                           {"end", sl.end},
                           {"file_offset", offset},
                           {"bytes", bytes},
                           {"fnv1a64", str(std::hex, fnv1a(sl.data, bytes))}});
        offset += static_cast<std::int64_t>(bytes);
      }
      if (::fsync(fd) != 0) {
        throw Error(str("checkpoint: fsync of ", shard_path, " failed: ", errno_text()));
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) {
      throw Error(str("checkpoint: closing ", shard_path, " failed: ", errno_text()));
    }
    nlohmann::json shard = {{"rank", world.rank()},
                            {"coords", s.coords},
                            {"tp_rank", s.tp_rank},
                            {"numel", s.numel},
                            {"tables", tables_json(s.tables)},
                            {"file", rank_name(world.rank(), "bin")},
                            {"tensors", tensors}};
    write_file((fs::path(tmp_dir) / rank_name(world.rank(), "json")).string(), shard.dump(1));
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(world, error, "writing a shard");

  if (world.rank() == 0) {
    try {
      nlohmann::json manifest;
      manifest["format"] = "trident-checkpoint";
      manifest["format_version"] = kFormatVersion;
      manifest["iteration"] = s.iteration;
      manifest["consumed_train_samples"] = s.consumed_train_samples;
      manifest["consumed_valid_samples"] = s.consumed_valid_samples;
      manifest["config"] = s.config;
      manifest["layout"] = s.layout;
      manifest["world_size"] = world.size();
      manifest["trainer_state"] = s.trainer_state;
      write_file((fs::path(tmp_dir) / "manifest.json").string(), manifest.dump(1));
      fsync_path(tmp_dir, true);
      // Replace an existing checkpoint of the same iteration only once the new one is complete.
      const std::string old_dir = final_dir + ".old." + std::to_string(token);
      const bool had_old = fs::exists(final_dir);
      if (had_old) fs::rename(final_dir, old_dir);
      fs::rename(tmp_dir, final_dir);
      fsync_path(dir, true);
      if (had_old) fs::remove_all(old_dir, ec);
      const std::string tracker = (fs::path(dir) / "latest_checkpointed_iteration.txt").string();
      write_file(tracker + ".tmp", std::to_string(s.iteration) + "\n");
      fs::rename(tracker + ".tmp", tracker);
      fsync_path(dir, true);
    } catch (const std::exception& e) {
      error = str("checkpoint: finishing ", final_dir, " failed: ", e.what());
      fs::remove_all(tmp_dir, ec);
    }
  }
  agree_or_throw(world, error, "finishing the checkpoint");
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

nlohmann::json read_manifest(const std::string& dir, std::int64_t iteration) {
  if (!fs::is_directory(dir)) throw DataError(str("--load ", dir, ": no such directory"));
  if (iteration < 0) iteration = latest_iteration(dir);
  if (iteration < 0) {
    throw DataError(str("--load ", dir,
                        ": no latest_checkpointed_iteration.txt (not a checkpoint "
                        "directory, or no checkpoint finished)"));
  }
  const std::string path =
      (fs::path(dir) / iteration_dir_name(iteration) / "manifest.json").string();
  nlohmann::json m = parse_json_file(path);
  if (!m.is_object() || !m.contains("format") || m["format"] != "trident-checkpoint" ||
      !m.contains("format_version") || m["format_version"] != kFormatVersion) {
    throw DataError(str(path, ": not a trident checkpoint of format version ", kFormatVersion));
  }
  for (const char* key :
       {"iteration", "world_size", "consumed_train_samples", "consumed_valid_samples"}) {
    if (!m.contains(key)) continue;  // a missing key is reported where it is read
    if (!m[key].is_number_integer()) {
      throw DataError(str(path, ": \"", key, "\" is ", m[key].dump().substr(0, 40),
                          ", not an integer (the checkpoint is corrupt; load an earlier "
                          "iteration)"));
    }
  }
  return m;
}

nlohmann::json load_checkpoint(const std::string& dir, std::int64_t iteration, CheckpointState& s,
                               comm::Communicator& world) {
  TRIDENT_ASSERT(s.params.data, "incomplete checkpoint state");
  std::string error;
  nlohmann::json m;
  try {
    m = read_manifest(dir, iteration);
    const std::int64_t it = m.at("iteration");
    const fs::path it_dir = fs::path(dir) / iteration_dir_name(it);
    const std::string manifest_path = (it_dir / "manifest.json").string();
    std::string why;
    if (!architecture_matches(m.at("config"), s.config, &why)) {
      throw DataError(str(manifest_path, ": the checkpoint's model differs from this run's:", why,
                          " (use the checkpoint's settings)"));
    }
    if (m.at("layout") != s.layout || m.at("world_size").get<int>() != world.size()) {
      throw DataError(str(manifest_path, ": saved with layout ", m.at("layout").dump(), " on ",
                          m.at("world_size").get<int>(), " ranks; this run has ", s.layout.dump(),
                          " on ", world.size(), " (resume with the same layout)"));
    }
    const nlohmann::json shard =
        parse_shard_json((it_dir / rank_name(world.rank(), "json")).string());
    if (shard.at("tables") != tables_json(s.tables) || shard.at("numel") != s.numel) {
      throw DataError(str(it_dir.string(), "/", rank_name(world.rank(), "json"),
                          ": this rank's parameter tables differ from the run's model"));
    }
    const CheckpointState::Slice* slices[] = {&s.params, &s.exp_avg, &s.exp_avg_sq};
    read_shard(it_dir, world.rank(), s.numel, slices);
    s.iteration = it;
    s.consumed_train_samples = m.at("consumed_train_samples");
    s.consumed_valid_samples = m.value("consumed_valid_samples", 0);
    s.trainer_state = m.value("trainer_state", nlohmann::json::object());
  } catch (const nlohmann::json::exception& e) {
    error = str("--load ", dir, ": malformed manifest (", e.what(), ")");
  } catch (const std::exception& e) {
    error = e.what();
  }
  try {
    agree_or_throw(world, error, "loading");
  } catch (const Error& e) {
    throw DataError(e.what());
  }
  log::info("ckpt: loaded ", dir, "/", iteration_dir_name(s.iteration), " (iteration ", s.iteration,
            ")");
  return m;
}

nlohmann::json load_full_params(const std::string& dir, std::int64_t iteration,
                                const model::ParamTable& full, float* flat) {
  const nlohmann::json m = read_manifest(dir, iteration);
  if (!m.contains("iteration")) {
    throw DataError(str(dir, ": malformed manifest (no \"iteration\")"));
  }
  const fs::path it_dir = fs::path(dir) / iteration_dir_name(m.at("iteration").get<std::int64_t>());
  std::vector<char> filled(static_cast<std::size_t>(full.total_numel), 0);
  try {
    const int world = m.at("world_size");
    for (int r = 0; r < world; ++r) {
      const nlohmann::json shard = parse_shard_json((it_dir / rank_name(r, "json")).string());
      const std::int64_t n = shard.at("numel");
      // The parameter elements this rank stored (all of its layout, or its ZeRO-3 shard).
      std::int64_t begin = 0, end = n;
      for (const nlohmann::json& t : shard.at("tensors")) {
        if (t.at("tensor") == "params") {
          begin = t.at("begin");
          end = t.at("end");
        }
      }
      // Validate before allocating: the header's ranges must fit the layout and the file.
      const std::string bin_path = (it_dir / rank_name(r, "bin")).string();
      std::error_code ec;
      const auto bin_bytes = static_cast<std::int64_t>(fs::file_size(bin_path, ec));
      if (n < 0 || begin < 0 || begin > end || end > n ||
          (!ec && (end - begin) > (bin_bytes - 8) / 4)) {
        throw DataError(str(it_dir.string(), "/", rank_name(r, "json"), ": params elements [",
                            begin, ", ", end, ") of a layout of ", n, " elements",
                            ec ? "" : str(" do not fit it or the ", bin_bytes, "-byte shard file"),
                            " (the checkpoint is corrupt; load an earlier iteration)"));
      }
      std::vector<float> held(static_cast<std::size_t>(end - begin));
      const CheckpointState::Slice want{held.data(), begin, end}, none{};
      const CheckpointState::Slice* slices[] = {&want, &none, &none};
      read_shard(it_dir, r, n, slices);
      const int tp_rank = shard.at("tp_rank");
      for (const nlohmann::json& table : shard.at("tables")) {
        for (const nlohmann::json& p : table.at("params")) {
          const std::string name = p.at("name");
          const model::ParamSpec& dst = full.find(name);
          model::ParamSpec src;
          src.shape = p.at("shape").get<std::vector<std::int64_t>>();
          src.global_shape = p.at("global_shape").get<std::vector<std::int64_t>>();
          src.tp_split_dim = p.at("tp_split_dim");
          src.numel = p.at("numel");
          if (src.global_shape != dst.shape) {
            throw DataError(str(it_dir.string(), ": parameter ", name, " has global shape ",
                                p.at("global_shape").dump(), ", the model expects ",
                                nlohmann::json(dst.shape).dump()));
          }
          const std::int64_t offset = p.at("offset");
          check_param_slice(src, dst, offset, n, tp_rank, it_dir.string());
          for (std::int64_t i = 0; i < src.numel; ++i) {
            const std::int64_t at = offset + i;
            if (at < begin || at >= end) continue;  // another data-parallel rank's shard
            const std::int64_t g = src.global_index(i, tp_rank);
            flat[dst.offset + g] = held[static_cast<std::size_t>(at - begin)];
            filled[static_cast<std::size_t>(dst.offset + g)] = 1;
          }
        }
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(str(it_dir.string(), ": malformed shard description (", e.what(), ")"));
  }
  for (const model::ParamSpec& p : full.params) {
    for (std::int64_t i = 0; i < p.numel; ++i) {
      if (!filled[static_cast<std::size_t>(p.offset + i)]) {
        throw DataError(str(it_dir.string(), ": no shard holds element ", i, " of ", p.name));
      }
    }
  }
  return m;
}

}  // namespace trident::ckpt
