#include "trident/ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "trident/ckpt/detail.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/ckpt/reshard.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/data/json_io.h"

namespace trident::ckpt {

namespace fs = std::filesystem;
using core::DataError;
using core::Error;
using core::str;

namespace detail {

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  // Eight independent lanes would be faster; one lane is ~1 GB/s, enough next to disk speed.
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CorruptCheckpoint(str("checkpoint: cannot read ", path));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

nlohmann::json parse_json_file(const std::string& path) {
  try {
    return data::parse_json_strict(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw CorruptCheckpoint(str(path, ": corrupt JSON (", e.what(), ")"));
  }
}

std::string rank_name(int rank, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.%s", rank, ext);
  return buf;
}

namespace {

// A shard header holds only integers, strings and booleans. nlohmann converts a float such as
// 1e300 to an integer with undefined behaviour, so a float anywhere in one is corruption.
void require_no_floats(const nlohmann::json& j, const std::string& path) {
  if (j.is_number_float()) {
    throw CorruptCheckpoint(str(path, ": unexpected number ", j.dump(),
                                " where integers are expected"
                                " (the checkpoint is corrupt; load an earlier iteration)"));
  }
  if (j.is_structured()) {
    for (const nlohmann::json& v : j) require_no_floats(v, path);
  }
}

}  // namespace

nlohmann::json parse_shard_json(const std::string& path) {
  nlohmann::json j = parse_json_file(path);
  require_no_floats(j, path);
  return j;
}

}  // namespace detail

namespace {

using detail::fnv1a;
using detail::kShardMagic;
using detail::parse_json_file;
using detail::parse_shard_json;
using detail::rank_name;
using detail::read_text;

std::string errno_text() { return std::strerror(errno); }

// Fault injection for the tests of failed saves: with TRIDENT_TEST_CKPT_FAIL_ITER=k, the save of
// iteration k fails with ENOSPC after TRIDENT_TEST_CKPT_WRITE_LIMIT bytes (default 0) of a
// rank's shard (on rank TRIDENT_TEST_CKPT_FAIL_RANK only, when set): as a disk filling up would.
// With TRIDENT_TEST_CKPT_PAUSE_ITER=k, the save of iteration k stops for
// TRIDENT_TEST_CKPT_PAUSE_S seconds (default 60) after the shard's parameters are written, so that
// a test can kill the job in the middle of a save.
thread_local std::int64_t t_write_budget = -1;
thread_local bool t_pause = false;

void arm_fault_injection(std::int64_t iteration, int rank) {
  t_write_budget = -1;
  const char* pause = std::getenv("TRIDENT_TEST_CKPT_PAUSE_ITER");
  t_pause = pause != nullptr && std::atoll(pause) == iteration;
  const char* it = std::getenv("TRIDENT_TEST_CKPT_FAIL_ITER");
  if (it == nullptr || std::atoll(it) != iteration) return;
  const char* on_rank = std::getenv("TRIDENT_TEST_CKPT_FAIL_RANK");
  if (on_rank != nullptr && std::atoi(on_rank) != rank) return;
  const char* limit = std::getenv("TRIDENT_TEST_CKPT_WRITE_LIMIT");
  t_write_budget = limit ? std::atoll(limit) : 0;
}

// Writes `n` bytes or throws SaveError naming the file (ENOSPC says the disk is full).
void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    std::size_t chunk = n;
    std::int64_t& budget = t_write_budget;
    if (budget >= 0 && static_cast<std::int64_t>(chunk) > budget) chunk = budget;
    ssize_t w = chunk > 0 ? ::write(fd, p, chunk) : -1;
    if (chunk == 0) errno = ENOSPC;
    if (w < 0) {
      if (errno == EINTR) continue;
      throw SaveError(
          str("checkpoint: writing ", path, " failed: ", errno_text(),
              errno == ENOSPC ? " (the disk is full: free space or change --save)" : ""));
    }
    if (budget >= 0) budget -= w;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw SaveError(str("checkpoint: cannot open ", path, " to sync: ", errno_text()));
  if (::fsync(fd) != 0) {
    ::close(fd);
    throw SaveError(str("checkpoint: fsync of ", path, " failed: ", errno_text()));
  }
  ::close(fd);
}

void write_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw SaveError(str("checkpoint: cannot create ", path, ": ", errno_text()));
  try {
    write_all(fd, text.data(), text.size(), path);
    if (::fsync(fd) != 0)
      throw SaveError(str("checkpoint: fsync of ", path, " failed: ", errno_text()));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) {
    throw SaveError(str("checkpoint: closing ", path, " failed: ", errno_text()));
  }
}

nlohmann::json table_json(const model::ParamTable& t, std::int64_t base) {
  nlohmann::json params = nlohmann::json::array();
  for (const model::ParamSpec& p : t.params) {
    nlohmann::json e = {{"name", p.name},
                        {"shape", p.shape},
                        {"global_shape", p.global_shape},
                        {"tp_split_dim", p.tp_split_dim},
                        {"shared", p.shared},
                        {"offset", base + p.offset},
                        {"numel", p.numel}};
    if (p.ep_size > 1) {  // the rank's block of experts (dim 0)
      e["ep_size"] = p.ep_size;
      e["ep_rank"] = p.ep_rank;
    }
    if (p.tp_replicas > 1) {  // partly replicated (key/value heads shared by tp ranks)
      e["tp_replicas"] = p.tp_replicas;
      e["split_rows"] = p.split_rows;
      e["block_rows"] = p.block_rows;
    }
    params.push_back(std::move(e));
  }
  return {{"total_numel", t.total_numel}, {"base", base}, {"params", params}};
}

nlohmann::json tables_json(const std::vector<TableRef>& tables) {
  nlohmann::json j = nlohmann::json::array();
  for (const TableRef& t : tables) j.push_back(table_json(*t.table, t.base));
  return j;
}

// Every rank learns whether every rank succeeded; the failures' messages are not shared, so each
// failing rank reports its own and the others name the failing ranks' count. `E` is thrown.
template <class E>
void agree_or_throw(comm::Communicator& world, const std::string& my_error, const char* what) {
  std::int64_t failed = my_error.empty() ? 0 : 1;
  if (world.size() > 1) world.all_reduce(&failed, 1, comm::Datatype::kI64, comm::ReduceOp::kSum);
  if (!my_error.empty()) throw E(my_error);
  if (failed > 0) {
    throw E(str("checkpoint: ", what, " failed on ", failed, " other rank(s); see their errors"));
  }
}

// Mapped slices (offloaded optimizer state) are read and written in pieces of this many bytes,
// each piece's pages dropped from the process afterwards: no copy of the state stays resident.
constexpr std::int64_t kMappedPiece = 32ll << 20;

void drop_mapped(const char* p, std::int64_t n, bool written) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<std::uintptr_t>(p) & ~(page - 1);
  const auto hi = reinterpret_cast<std::uintptr_t>(p + n);
  // The pages of a shared file mapping: dropping them keeps their contents in the file.
  if (written) ::msync(reinterpret_cast<void*>(lo), hi - lo, MS_ASYNC);
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

// Reads this rank's shard (json + bin) into the given buffers; checks sizes and checksums.
void read_shard(const fs::path& it_dir, int rank, CheckpointState& s) {
  const std::int64_t numel = s.numel;
  const std::string json_path = (it_dir / rank_name(rank, "json")).string();
  const std::string path = (it_dir / rank_name(rank, "bin")).string();
  const nlohmann::json shard = parse_shard_json(json_path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CorruptCheckpoint(str(path, ": missing shard file"));
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, kShardMagic, 8) != 0) {
    throw CorruptCheckpoint(str(path, ": bad magic at byte 0 (expected TRCKPT01)"));
  }
  try {
    std::vector<std::string> read;
    for (const nlohmann::json& t : shard.at("tensors")) {
      const std::string tensor = t.at("tensor");
      const CheckpointState::Slice* wanted = s.find(tensor);
      if (wanted == nullptr && tensor != "params" && !s.wants_optimizer_state()) {
        continue;  // weights only (--finetune, generation): another rule's state is not read
      }
      if (wanted == nullptr) {
        throw CorruptCheckpoint(str(path, ": unknown tensor '", tensor,
                                    "' (neither the parameters nor this run's optimizer state)"));
      }
      const CheckpointState::Slice& slice = *wanted;
      if (slice.data == nullptr) continue;  // not wanted (e.g. generation skips Adam state)
      read.push_back(tensor);
      const std::int64_t begin = t.at("begin"), end = t.at("end");
      const std::int64_t bytes = t.at("bytes"), offset = t.at("file_offset");
      if (begin < 0 || end > numel || begin > end || bytes != (end - begin) * 4 ||
          begin != slice.begin || end != slice.end) {
        throw CorruptCheckpoint(str(path, ": tensor ", tensor, " holds elements [", begin, ", ",
                                    end, ") of the rank's ", numel, "; this run expects [",
                                    slice.begin, ", ", slice.end, ")"));
      }
      in.seekg(offset);
      std::uint64_t h = detail::kFnvBasis;
      for (std::int64_t at = 0; at < bytes;) {
        const std::int64_t piece = slice.mapped ? std::min(bytes - at, kMappedPiece) : bytes;
        char* p = reinterpret_cast<char*>(slice.data) + at;
        in.read(p, piece);
        if (!in) {
          throw CorruptCheckpoint(str(path, ": truncated: tensor ", tensor, " needs ", bytes,
                                      " bytes at offset ", offset));
        }
        h = fnv1a(p, static_cast<std::size_t>(piece), h);
        if (slice.mapped) drop_mapped(p, piece, /*written=*/true);
        at += piece;
      }
      const std::string sum = str(std::hex, h);
      if (sum != t.at("fnv1a64").get<std::string>()) {
        throw CorruptCheckpoint(str(path, ": checksum mismatch in tensor ", tensor,
                                    " (the file is corrupt; load an earlier iteration)"));
      }
    }
    // Every tensor this run loads must have been in the shard.
    for (const auto& [name, slice] : s.tensors()) {
      if (slice->data != nullptr && std::find(read.begin(), read.end(), name) == read.end()) {
        throw CorruptCheckpoint(
            str(json_path, ": no tensor '", name,
                "' (saved by another optimizer, or the checkpoint is corrupt)"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptCheckpoint(str(json_path, ": malformed shard description (", e.what(), ")"));
  }
}

// Reads `path` back and checks that bytes [offset, offset + bytes) hash to `sum`.
void verify_written(int fd, const std::string& path, std::int64_t offset, std::int64_t bytes,
                    std::uint64_t sum) {
  std::vector<char> buf(std::size_t{1} << 20);
  std::uint64_t h = detail::kFnvBasis;
  while (bytes > 0) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::int64_t>(bytes, buf.size()));
    const ssize_t r = ::pread(fd, buf.data(), want, offset);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      throw SaveError(str("checkpoint: reading back ", path,
                          " failed: ", r < 0 ? errno_text() : std::string("short file")));
    }
    h = fnv1a(buf.data(), static_cast<std::size_t>(r), h);
    offset += r;
    bytes -= r;
  }
  if (h != sum) {
    throw SaveError(str("checkpoint: ", path,
                        " reads back different bytes than were written (broken storage)"));
  }
}

std::string tracker_path(const std::string& dir) {
  return (fs::path(dir) / "latest_checkpointed_iteration.txt").string();
}

// Rank 0, after the tracker names `saved`: keeps `saved` and the retain - 1 newest older
// checkpoints, deletes the older rest. Newer directories (an abandoned timeline) are left alone.
void apply_retention(const std::string& dir, std::int64_t saved, int retain) {
  if (retain <= 0) return;
  std::vector<std::int64_t> older;
  for (std::int64_t it : list_iterations(dir))
    if (it < saved) older.push_back(it);
  const std::int64_t keep_older = retain - 1;
  const std::int64_t drop = static_cast<std::int64_t>(older.size()) - keep_older;
  for (std::int64_t i = 0; i < drop; ++i) {
    const fs::path victim = fs::path(dir) / iteration_dir_name(older[static_cast<std::size_t>(i)]);
    std::error_code ec;
    fs::remove_all(victim, ec);
    if (ec) {
      log::warn("ckpt: --save-retain: could not delete ", victim.string(), ": ", ec.message());
    } else {
      log::info("ckpt: --save-retain ", retain, ": deleted ", victim.string());
    }
  }
}

void finish_on_rank0(const std::string& dir, const std::string& tmp_dir, const CheckpointState& s,
                     int world_size, const SaveOptions& options) {
  const std::string final_dir = (fs::path(dir) / iteration_dir_name(s.iteration)).string();
  try {
    nlohmann::json manifest;
    manifest["format"] = "trident-checkpoint";
    manifest["format_version"] = kFormatVersion;
    manifest["iteration"] = s.iteration;
    manifest["consumed_train_samples"] = s.consumed_train_samples;
    manifest["consumed_valid_samples"] = s.consumed_valid_samples;
    manifest["config"] = s.config;
    manifest["layout"] = s.layout;
    manifest["world_size"] = world_size;
    if (s.experts != nullptr) manifest["expert_shards"] = world_size;
    manifest["trainer_state"] = s.trainer_state;
    write_file((fs::path(tmp_dir) / "manifest.json").string(), manifest.dump(1));
    fsync_path(tmp_dir, true);
    // Replace an existing checkpoint of the same iteration only once the new one is complete.
    const std::string old_dir = tmp_dir + ".old";
    const bool had_old = fs::exists(final_dir);
    if (had_old) fs::rename(final_dir, old_dir);
    fs::rename(tmp_dir, final_dir);
    fsync_path(dir, true);
    std::error_code ec;
    if (had_old) fs::remove_all(old_dir, ec);
    const std::string tracker = tracker_path(dir);
    write_file(tracker + ".tmp", std::to_string(s.iteration) + "\n");
    fs::rename(tracker + ".tmp", tracker);
    fsync_path(dir, true);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    fs::remove(tracker_path(dir) + ".tmp", ec);
    throw SaveError(str("checkpoint: finishing ", final_dir, " failed: ", e.what()));
  }
  apply_retention(dir, s.iteration, options.retain);
}

}  // namespace

std::string iteration_dir_name(std::int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

std::vector<std::pair<std::string, const CheckpointState::Slice*>> CheckpointState::tensors()
    const {
  std::vector<std::pair<std::string, const Slice*>> all{{"params", &params}};
  for (const NamedSlice& n : optimizer_state) all.emplace_back(n.name, &n.slice);
  return all;
}

bool CheckpointState::wants_optimizer_state() const {
  return std::any_of(optimizer_state.begin(), optimizer_state.end(),
                     [](const NamedSlice& n) { return n.slice.data != nullptr; });
}

CheckpointState::Slice* CheckpointState::find(const std::string& name) {
  if (name == "params") return &params;
  for (NamedSlice& n : optimizer_state)
    if (n.name == name) return &n.slice;
  return nullptr;
}

bool architecture_matches(const nlohmann::json& a, const nlohmann::json& b, std::string* why) {
  const std::string diff = architecture_diff(a, b);
  if (why) *why = diff;
  return diff.empty();
}

std::int64_t shard_bytes(const CheckpointState& s) {
  std::int64_t elements = 0;
  for (const auto& [name, sl] : s.tensors()) elements += sl->end - sl->begin;
  return static_cast<std::int64_t>(sizeof(kShardMagic)) + elements * 4 +
         (s.experts != nullptr ? shard_bytes(*s.experts) : 0);
}

std::string begin_save(const std::string& dir, const CheckpointState& s,
                       comm::Communicator& world) {
  for (const CheckpointState* part : {&s, static_cast<const CheckpointState*>(s.experts)}) {
    if (part == nullptr) continue;
    for (const auto& [name, sl] : part->tensors()) {
      TRIDENT_ASSERT(sl->data != nullptr, "incomplete checkpoint state: no ", name);
    }
  }
  const std::string final_dir = (fs::path(dir) / iteration_dir_name(s.iteration)).string();
  // One temporary name for the whole job: rank 0's pid, broadcast.
  std::int64_t token = ::getpid();
  if (world.size() > 1) world.broadcast(&token, 1, comm::Datatype::kI64, 0);
  const std::string tmp_dir = final_dir + ".tmp." + std::to_string(token);
  // The bytes of the whole checkpoint (every shard, plus a margin for the JSON files).
  std::int64_t needed = shard_bytes(s) + (std::int64_t{1} << 16);
  if (world.size() > 1) world.all_reduce(&needed, 1, comm::Datatype::kI64, comm::ReduceOp::kSum);

  std::string error;
  if (world.rank() == 0) {
    try {
      fs::create_directories(dir);
      // Temporary directories of saves that died (kill -9 during a save): this job holds the
      // save directory's lock, so nobody else is writing them.
      static const std::regex tmp_name(R"(iter_\d{7}\.tmp\.\d+(\.old)?)");
      for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (std::regex_match(name, tmp_name) && e.path().string() != tmp_dir) {
          log::warn("ckpt: removing ", e.path().string(), ", left behind by a save that died");
          fs::remove_all(e.path());
        }
      }
      struct statvfs st {};
      if (::statvfs(dir.c_str(), &st) == 0) {
        const std::int64_t free_bytes =
            static_cast<std::int64_t>(st.f_bavail) * static_cast<std::int64_t>(st.f_frsize);
        if (free_bytes < needed) {
          error = str("checkpoint: not enough space in ", dir, " for ", final_dir, ": it needs ",
                      needed, " bytes, ", free_bytes,
                      " are free (free space, point --save elsewhere, or keep fewer checkpoints "
                      "with --save-retain)");
        } else if (free_bytes - needed < needed) {
          log::warn("ckpt: ", dir, " has ", free_bytes, " bytes free; after this checkpoint (",
                    needed,
                    " bytes) the next one will not fit unless older ones are removed "
                    "(--save-retain)");
        }
      }
      if (error.empty()) {
        fs::remove_all(tmp_dir);
        fs::create_directories(tmp_dir);
      }
    } catch (const fs::filesystem_error& e) {
      error = str("checkpoint: cannot create ", tmp_dir, " (--save ", dir, "): ", e.what());
    }
  }
  agree_or_throw<SaveError>(world, error, "creating the checkpoint directory");
  return tmp_dir;
}

std::string write_shard(const std::string& tmp_dir, int rank, const CheckpointState& s) {
  if (s.experts != nullptr) {  // the experts' shard after this rank's own
    CheckpointState dense = s;
    dense.experts = nullptr;
    std::string error = write_shard(tmp_dir, rank, dense);
    if (error.empty()) {
      CheckpointState e = *s.experts;
      e.iteration = s.iteration;
      e.experts = nullptr;
      error = write_shard(tmp_dir, s.experts_first_shard + rank, e);
    }
    return error;
  }
  arm_fault_injection(s.iteration, rank);
  try {
    const std::int64_t n = s.numel;
    const std::string shard_path = (fs::path(tmp_dir) / rank_name(rank, "bin")).string();
    const int fd = ::open(shard_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      throw SaveError(str("checkpoint: cannot create ", shard_path, ": ", errno_text()));
    }
    nlohmann::json tensors = nlohmann::json::array();
    try {
      write_all(fd, kShardMagic, sizeof(kShardMagic), shard_path);
      std::int64_t offset = sizeof(kShardMagic);
      const auto slices = s.tensors();
      std::vector<std::uint64_t> sums;
      for (std::size_t t = 0; t < slices.size(); ++t) {
        const CheckpointState::Slice& sl = *slices[t].second;
        TRIDENT_ASSERT(0 <= sl.begin && sl.begin <= sl.end && sl.end <= n, "bad slice");
        const std::size_t bytes = static_cast<std::size_t>(sl.end - sl.begin) * sizeof(float);
        std::uint64_t h = detail::kFnvBasis;
        for (std::size_t at = 0; at < bytes;) {
          const std::size_t piece =
              sl.mapped ? std::min(bytes - at, static_cast<std::size_t>(kMappedPiece)) : bytes;
          const char* p = reinterpret_cast<const char*>(sl.data) + at;
          write_all(fd, p, piece, shard_path);
          h = fnv1a(p, piece, h);
          if (sl.mapped) drop_mapped(p, static_cast<std::int64_t>(piece), /*written=*/false);
          at += piece;
        }
        sums.push_back(h);
        tensors.push_back({{"tensor", slices[t].first},
                           {"begin", sl.begin},
                           {"end", sl.end},
                           {"file_offset", offset},
                           {"bytes", bytes},
                           {"fnv1a64", str(std::hex, sums.back())}});
        offset += static_cast<std::int64_t>(bytes);
        if (t == 0 && t_pause) {
          const char* secs = std::getenv("TRIDENT_TEST_CKPT_PAUSE_S");
          ::sleep(static_cast<unsigned>(secs ? std::atoi(secs) : 60));
        }
      }
      if (::fsync(fd) != 0) {
        throw SaveError(str("checkpoint: fsync of ", shard_path, " failed: ", errno_text()));
      }
      // Read back what the storage holds: a checkpoint is verified before it replaces anything.
      for (std::size_t t = 0; t < slices.size(); ++t) {
        verify_written(fd, shard_path, tensors[t]["file_offset"], tensors[t]["bytes"], sums[t]);
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) {
      throw SaveError(str("checkpoint: closing ", shard_path, " failed: ", errno_text()));
    }
    nlohmann::json shard = {{"rank", rank},
                            {"coords", s.coords},
                            {"tp_rank", s.tp_rank},
                            {"numel", s.numel},
                            {"tables", tables_json(s.tables)},
                            {"file", rank_name(rank, "bin")},
                            {"tensors", tensors}};
    write_file((fs::path(tmp_dir) / rank_name(rank, "json")).string(), shard.dump(1));
  } catch (const std::exception& e) {
    t_write_budget = -1;
    return e.what();
  }
  t_write_budget = -1;
  return {};
}

void finish_save(const std::string& dir, const std::string& tmp_dir, const CheckpointState& s,
                 comm::Communicator& world, const std::string& shard_error,
                 const SaveOptions& options) {
  std::int64_t failed = shard_error.empty() ? 0 : 1;
  if (world.size() > 1) world.all_reduce(&failed, 1, comm::Datatype::kI64, comm::ReduceOp::kSum);
  std::string error;
  if (failed > 0) {
    // Some rank could not write its shard: the save is abandoned and its directory removed.
    if (world.rank() == 0) {
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
      if (ec) log::warn("ckpt: could not remove ", tmp_dir, ": ", ec.message());
    }
    error = shard_error.empty() ? str("checkpoint: writing a shard failed on ", failed,
                                      " other rank(s); see their errors")
                                : shard_error;
    error += str(" [", tmp_dir, " removed; the checkpoints before iteration ", s.iteration,
                 " and the tracker are intact]");
  } else if (world.rank() == 0) {
    try {
      finish_on_rank0(dir, tmp_dir, s, world.size(), options);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_or_throw<SaveError>(world, error, "finishing the checkpoint");
}

void finish_save_local(const std::string& dir, const std::string& tmp_dir,
                       const CheckpointState& state, int world_size, const SaveOptions& options) {
  finish_on_rank0(dir, tmp_dir, state, world_size, options);
}

void save_checkpoint(const std::string& dir, const CheckpointState& s, comm::Communicator& world,
                     const SaveOptions& options) {
  const std::string tmp_dir = begin_save(dir, s, world);
  const std::string error = write_shard(tmp_dir, world.rank(), s);
  finish_save(dir, tmp_dir, s, world, error, options);
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

std::vector<std::int64_t> list_iterations(const std::string& dir) {
  std::vector<std::int64_t> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex name_re(R"(iter_(\d{7,}))");
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec) && std::regex_match(name, m, name_re)) out.push_back(std::stoll(m[1]));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool has_checkpoint(const std::string& dir) {
  return fs::exists(tracker_path(dir)) || !list_iterations(dir).empty();
}

namespace {

// Loads iteration `it` into this rank's buffers (no communication). Throws CorruptCheckpoint or
// DataError.
nlohmann::json load_one(const std::string& dir, std::int64_t it, CheckpointState& s, int rank,
                        int world_size) {
  const nlohmann::json m = read_manifest(dir, it);
  try {
    const fs::path it_dir = fs::path(dir) / iteration_dir_name(it);
    const std::string manifest_path = (it_dir / "manifest.json").string();
    if (m.at("iteration").get<std::int64_t>() != it) {
      throw CorruptCheckpoint(str(manifest_path, ": names iteration ", m.at("iteration").dump()));
    }
    std::string why;
    if (!architecture_matches(m.at("config"), s.config, &why)) {
      throw DataError(str(manifest_path, ": the checkpoint's model differs from this run's:", why,
                          " (use the checkpoint's settings)"));
    }
    // The optimizer state is the update rule's: another rule's arrays cannot continue it.
    const std::string saved_rule = m.at("config").value("optimizer", "adam");
    const std::string this_rule = s.config.value("optimizer", "adam");
    if (s.wants_optimizer_state() && saved_rule != this_rule) {
      throw DataError(str(manifest_path, ": the checkpoint was trained with --optimizer ",
                          saved_rule, ", this run asks for --optimizer ", this_rule,
                          ": resume with --optimizer ", saved_rule,
                          ", or start from its weights with a fresh optimizer (--finetune)"));
    }
    bool same_layout = m.at("layout") == s.layout && m.at("world_size").get<int>() == world_size;
    const int expert_shards = m.value("expert_shards", 0);
    same_layout = same_layout && (s.experts != nullptr) == (expert_shards > 0);
    const auto same_shard = [&](int shard_rank, const CheckpointState& part) {
      const nlohmann::json shard =
          parse_shard_json((it_dir / rank_name(shard_rank, "json")).string());
      return shard.at("tables") == tables_json(part.tables) && shard.at("numel") == part.numel;
    };
    if (same_layout) {
      same_layout = same_shard(rank, s) &&
                    (s.experts == nullptr || same_shard(world_size + rank, *s.experts));
    }
    if (same_layout) {
      read_shard(it_dir, rank, s);
      if (s.experts != nullptr) read_shard(it_dir, world_size + rank, *s.experts);
    } else {
      if (rank == 0) {
        log::info("ckpt: resharding ", it_dir.string(), " from layout ", m.at("layout").dump(),
                  " on ", m.at("world_size").get<int>(), " ranks to ", s.layout.dump(), " on ",
                  world_size);
      }
      load_resharded(it_dir, m, s);
      if (s.experts != nullptr) load_resharded(it_dir, m, *s.experts);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptCheckpoint(str("--load ", dir, ": malformed manifest (", e.what(), ")"));
  }
  return m;
}

}  // namespace

nlohmann::json load_checkpoint(const std::string& dir, std::int64_t iteration, CheckpointState& s,
                               comm::Communicator& world) {
  TRIDENT_ASSERT(s.params.data, "incomplete checkpoint state");
  if (!fs::is_directory(dir)) throw DataError(str("--load ", dir, ": no such directory"));
  // The candidates, newest first, decided by rank 0: the one asked for; or the tracker's, then
  // every older complete checkpoint (fallback when the newest is incomplete or corrupt).
  std::vector<std::int64_t> cands;
  std::string tracker_problem;
  if (world.rank() == 0) {
    if (iteration >= 0) {
      cands.push_back(iteration);
    } else {
      std::int64_t latest = -1;
      try {
        latest = latest_iteration(dir);
      } catch (const DataError& e) {
        tracker_problem = e.what();
      }
      const std::vector<std::int64_t> all = list_iterations(dir);
      if (latest >= 0) cands.push_back(latest);
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        if (latest < 0 || *it < latest) cands.push_back(*it);
      }
      if (!tracker_problem.empty()) {
        log::error("ckpt: ", tracker_problem, "; trying the newest complete checkpoint instead");
      }
    }
  }
  std::int64_t count = static_cast<std::int64_t>(cands.size());
  if (world.size() > 1) world.broadcast(&count, 1, comm::Datatype::kI64, 0);
  cands.resize(static_cast<std::size_t>(count));
  if (world.size() > 1 && count > 0) world.broadcast(cands.data(), count, comm::Datatype::kI64, 0);
  if (count == 0) {
    throw DataError(str("--load ", dir,
                        ": no checkpoint (no latest_checkpointed_iteration.txt and no iter_* "
                        "directory; not a checkpoint directory, or no checkpoint finished)"));
  }

  nlohmann::json m;
  for (std::size_t c = 0; c < cands.size(); ++c) {
    const std::int64_t it = cands[c];
    std::string error;
    std::int64_t kind = 0;  // 0 loaded, 1 incomplete or corrupt, 2 a mismatch (bad input)
    try {
      m = load_one(dir, it, s, world.rank(), world.size());
    } catch (const CorruptCheckpoint& e) {
      error = e.what();
      kind = 1;
    } catch (const std::exception& e) {
      error = e.what();
      kind = 2;
    }
    std::int64_t worst = kind;
    if (world.size() > 1) world.all_reduce(&worst, 1, comm::Datatype::kI64, comm::ReduceOp::kMax);
    if (worst == 0) {
      s.iteration = it;
      s.consumed_train_samples = m.at("consumed_train_samples");
      s.consumed_valid_samples = m.value("consumed_valid_samples", 0);
      s.trainer_state = m.value("trainer_state", nlohmann::json::object());
      if (c > 0) {
        log::warn("ckpt: *** resumed from ", dir, "/", iteration_dir_name(it),
                  ", NOT the newest checkpoint (", iteration_dir_name(cands[0]),
                  " is incomplete or corrupt); iterations after ", it, " are trained again ***");
      } else {
        log::info("ckpt: loaded ", dir, "/", iteration_dir_name(it), " (iteration ", it, ")");
      }
      return m;
    }
    const bool last = c + 1 == cands.size() || iteration >= 0 || worst == 2;
    if (!error.empty()) {
      if (kind == 1) {
        log::error("ckpt: *** CHECKPOINT ", dir, "/", iteration_dir_name(it),
                   " IS INCOMPLETE OR CORRUPT: ", error, " ***",
                   last ? "" : str(" falling back to ", iteration_dir_name(cands[c + 1])));
      }
      if (last) throw DataError(error);
    }
    if (last) {
      throw DataError(str("--load ", dir, "/", iteration_dir_name(it),
                          ": loading failed on other rank(s); see their errors"));
    }
  }
  TRIDENT_ASSERT(false, "unreachable");
}

nlohmann::json load_full_params(const std::string& dir, std::int64_t iteration,
                                const model::ParamTable& full, float* flat) {
  const nlohmann::json m = read_manifest(dir, iteration);
  if (!m.contains("iteration")) {
    throw DataError(str(dir, ": malformed manifest (no \"iteration\")"));
  }
  const fs::path it_dir = fs::path(dir) / iteration_dir_name(m.at("iteration").get<std::int64_t>());
  CheckpointState s;
  s.tables.push_back({&full, 0});
  s.numel = full.total_numel;
  s.params = {flat, 0, full.total_numel};
  load_resharded(it_dir, m, s);
  return m;
}

}  // namespace trident::ckpt
