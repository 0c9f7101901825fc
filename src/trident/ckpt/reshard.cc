#include "trident/ckpt/reshard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trident/ckpt/detail.h"
#include "trident/core/error.h"

namespace trident::ckpt {

namespace fs = std::filesystem;
using core::DataError;
using core::str;

namespace {

// One rank shard of the source checkpoint: its stored ranges, memory-mapped lazily.
class SourceShard {
 public:
  SourceShard(const fs::path& it_dir, int rank) : rank_(rank) {
    json_path_ = (it_dir / detail::rank_name(rank, "json")).string();
    bin_path_ = (it_dir / detail::rank_name(rank, "bin")).string();
    json_ = detail::parse_shard_json(json_path_);
    std::error_code ec;
    const auto bin_bytes = static_cast<std::int64_t>(fs::file_size(bin_path_, ec));
    try {
      tp_rank_ = json_.at("tp_rank");
      numel_ = json_.at("numel");
      for (const nlohmann::json& t : json_.at("tensors")) {
        const std::string k = t.at("tensor");
        Tensor& x = tensors_[k];
        x.begin = t.at("begin");
        x.end = t.at("end");
        x.offset = t.at("file_offset");
        x.bytes = t.at("bytes");
        x.sum = t.at("fnv1a64").get<std::string>();
        x.present = true;
        // Validated here, before anything is mapped or indexed with them: the ranges must
        // fit the rank's layout and the shard file.
        if (numel_ < 0 || x.begin < 0 || x.begin > x.end || x.end > numel_ ||
            (!ec && (x.end - x.begin) > (bin_bytes - 8) / 4)) {
          throw CorruptCheckpoint(str(
              json_path_, ": ", k, " elements [", x.begin, ", ", x.end, ") of a layout of ", numel_,
              " elements", ec ? "" : str(" do not fit it or the ", bin_bytes, "-byte shard file"),
              " (the checkpoint is corrupt; load an earlier iteration)"));
        }
        if (x.bytes != (x.end - x.begin) * 4) {
          throw CorruptCheckpoint(str(json_path_, ": tensor ", k, " has ", x.bytes, " bytes for ",
                                      x.end - x.begin, " elements (the checkpoint is corrupt)"));
        }
      }
    } catch (const nlohmann::json::exception& e) {
      throw CorruptCheckpoint(str(json_path_, ": malformed shard description (", e.what(), ")"));
    }
  }
  ~SourceShard() {
    if (map_ != nullptr) ::munmap(map_, map_size_);
  }
  SourceShard(const SourceShard&) = delete;
  SourceShard& operator=(const SourceShard&) = delete;

  int rank() const { return rank_; }
  int tp_rank() const { return tp_rank_; }
  std::int64_t numel() const { return numel_; }
  const nlohmann::json& json() const { return json_; }
  const std::string& json_path() const { return json_path_; }
  // Whether tensor k stores flat element `at` of the rank's layout.
  bool holds(const std::string& k, std::int64_t at) const {
    const auto it = tensors_.find(k);
    return it != tensors_.end() && it->second.present && at >= it->second.begin &&
           at < it->second.end;
  }
  std::int64_t begin(const std::string& k) const { return tensors_.at(k).begin; }
  // The stored elements of tensor k, checksummed on first use.
  const float* data(const std::string& k) {
    Tensor& x = tensors_.at(k);
    if (!x.verified) {
      map();
      if (x.offset < 8 || x.offset + x.bytes > static_cast<std::int64_t>(map_size_)) {
        throw CorruptCheckpoint(str(bin_path_, ": truncated: tensor ", k, " needs ", x.bytes,
                                    " bytes at offset ", x.offset, ", the file has ", map_size_));
      }
      const char* p = static_cast<const char*>(map_) + x.offset;
      if (str(std::hex, detail::fnv1a(p, static_cast<std::size_t>(x.bytes))) != x.sum) {
        throw CorruptCheckpoint(str(bin_path_, ": checksum mismatch in tensor ", k,
                                    " (the file is corrupt; load an earlier iteration)"));
      }
      x.verified = true;
    }
    return reinterpret_cast<const float*>(static_cast<const char*>(map_) + x.offset);
  }

 private:
  struct Tensor {
    std::int64_t begin = 0, end = 0, offset = 0, bytes = 0;
    std::string sum;
    bool present = false, verified = false;
  };
  void map() {
    if (map_ != nullptr) return;
    const int fd = ::open(bin_path_.c_str(), O_RDONLY);
    if (fd < 0) throw CorruptCheckpoint(str(bin_path_, ": missing shard file"));
    struct stat st {};
    ::fstat(fd, &st);
    map_size_ = static_cast<std::size_t>(st.st_size);
    if (map_size_ < 8) {
      ::close(fd);
      throw CorruptCheckpoint(str(bin_path_, ": truncated (", map_size_, " bytes)"));
    }
    map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      throw CorruptCheckpoint(str(bin_path_, ": cannot map: ", std::strerror(errno)));
    }
    if (std::memcmp(map_, detail::kShardMagic, 8) != 0) {
      throw CorruptCheckpoint(str(bin_path_, ": bad magic at byte 0 (expected TRCKPT01)"));
    }
  }

  int rank_ = 0, tp_rank_ = 0;
  std::int64_t numel_ = 0;
  std::string json_path_, bin_path_;
  nlohmann::json json_;
  std::map<std::string, Tensor> tensors_;  // by name: "params", "exp_avg", ...
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
};

// The parameters whose rows are the vocabulary, padded (the word embedding, an untied output
// layer).
bool vocabulary_rows(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

// One source rank's copy of a parameter (a tensor-parallel slice, or a replica).
struct SourceParam {
  SourceShard* shard = nullptr;
  model::ParamSpec spec;  // shape, global_shape, tp_split_dim, numel
  std::int64_t offset = 0;
};

// A shard header's parameter entry, before load_resharded indexes with it: its slice must be a
// tensor-parallel slice of the model's parameter of `global_shape` that lies in the rank's layout
// of n elements.
void check_param_slice(const model::ParamSpec& src, const std::vector<std::int64_t>& global_shape,
                       std::int64_t offset, std::int64_t n, int tp_rank, const std::string& where) {
  const auto fail = [&](const char* what) {
    throw CorruptCheckpoint(str(where, ": parameter ", src.name, ": ", what, " (shape ",
                                nlohmann::json(src.shape).dump(), ", tp_split_dim ",
                                src.tp_split_dim, ", tp_rank ", tp_rank, ", offset ", offset,
                                ", numel ", src.numel, "); the checkpoint is corrupt"));
  };
  if (src.shape.size() != global_shape.size()) fail("local and global shapes differ in rank");
  if (src.ep_size < 1 || src.ep_rank < 0 || src.ep_rank >= src.ep_size) {
    fail("ep_rank is not a rank of ep_size");
  }
  if (src.ep_size > 1) {
    // A block of experts (dim 0): checked against the whole parameter's block of that size.
    if (src.shape.empty() || global_shape[0] % src.ep_size != 0 || src.tp_split_dim == 0 ||
        src.tp_replicas != 1) {
      fail("the expert-parallel split is not a block of dim 0");
    }
    std::vector<std::int64_t> block = global_shape;
    block[0] /= src.ep_size;
    model::ParamSpec whole = src;
    whole.ep_size = 1;
    whole.ep_rank = 0;
    check_param_slice(whole, block, offset, n, tp_rank, where);
    return;
  }
  std::int64_t numel = 1;
  for (std::size_t d = 0; d < src.shape.size(); ++d) {
    if (src.shape[d] < 1 || src.shape[d] > global_shape[d]) fail("a local dimension out of range");
    numel *= src.shape[d];  // <= the global numel: no overflow
  }
  if (numel != src.numel) fail("numel is not the product of the shape");
  if (offset < 0 || offset > n || src.numel > n - offset) fail("slice outside the rank's layout");
  if (tp_rank < 0) fail("negative tp_rank");
  const int split = src.tp_split_dim;
  if (split < -1 || split >= static_cast<int>(src.shape.size())) {
    fail("tp_split_dim is not -1 or a dimension of the shape");
  }
  for (std::size_t d = 0; d < src.shape.size(); ++d) {
    if (static_cast<int>(d) != split && src.shape[d] != global_shape[d]) {
      fail("an unsplit dimension differs from the model's");
    }
  }
  if (src.tp_replicas < 1) fail("tp_replicas is below 1");
  if (src.tp_replicas > 1) {
    // Blocks of block_rows rows, split_rows of them split over tp_replicas ranks (param_table.h).
    const std::int64_t r = src.tp_replicas, S = src.split_rows, B = src.block_rows;
    if (split != 0 || S < 1 || B <= S || S % r != 0 || global_shape[0] % B != 0 ||
        src.shape[0] != S / r + B - S || tp_rank >= global_shape[0] / B * r) {
      fail("the replicated split is not this tp_rank's rows of the model's");
    }
    return;
  }
  if (split >= 0) {
    const auto sd = static_cast<std::size_t>(split);
    if (global_shape[sd] % src.shape[sd] != 0 || tp_rank >= global_shape[sd] / src.shape[sd]) {
      fail("the split dimension is not this tp_rank's slice of the model's");
    }
  }
}

}  // namespace

void load_resharded(const fs::path& it_dir, const nlohmann::json& manifest,
                    CheckpointState& state) {
  std::vector<std::unique_ptr<SourceShard>> shards;
  std::map<std::string, std::vector<SourceParam>> by_name;
  try {
    // Every rank's shard, then the expert-parallel runs' expert shards (checkpoint.h).
    const int world = manifest.at("world_size");
    const int expert_shards = manifest.value("expert_shards", 0);
    if (expert_shards != 0 && expert_shards != world) {
      throw CorruptCheckpoint(str(it_dir.string(), ": manifest names ", expert_shards,
                                  " expert shards for ", world,
                                  " ranks (the checkpoint is corrupt)"));
    }
    for (int r = 0; r < world + expert_shards; ++r) {
      shards.push_back(std::make_unique<SourceShard>(it_dir, r));
      SourceShard& sh = *shards.back();
      for (const nlohmann::json& table : sh.json().at("tables")) {
        for (const nlohmann::json& p : table.at("params")) {
          SourceParam sp;
          sp.shard = &sh;
          sp.spec.name = p.at("name");
          sp.spec.shape = p.at("shape").get<std::vector<std::int64_t>>();
          sp.spec.global_shape = p.at("global_shape").get<std::vector<std::int64_t>>();
          sp.spec.tp_split_dim = p.at("tp_split_dim");
          sp.spec.numel = p.at("numel");
          sp.spec.tp_replicas = p.value("tp_replicas", 1);
          sp.spec.split_rows = p.value("split_rows", std::int64_t{0});
          sp.spec.block_rows = p.value("block_rows", std::int64_t{0});
          sp.spec.ep_size = p.value("ep_size", 1);
          sp.spec.ep_rank = p.value("ep_rank", 0);
          sp.offset = p.at("offset");
          by_name[sp.spec.name].push_back(sp);
        }
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw CorruptCheckpoint(str(it_dir.string(), ": malformed shard description (", e.what(), ")"));
  }

  for (const auto& [k, slice] : state.tensors()) {
    CheckpointState::Slice& dst = *state.find(k);
    if (dst.data == nullptr) continue;
    std::fill(dst.data, dst.data + (dst.end - dst.begin), 0.0f);
    for (const TableRef& t : state.tables) {
      for (const model::ParamSpec& p : t.table->params) {
        const std::int64_t at0 = t.base + p.offset;
        const std::int64_t lo = std::max(dst.begin, at0), hi = std::min(dst.end, at0 + p.numel);
        if (lo >= hi) continue;
        const auto found = by_name.find(p.name);
        if (found == by_name.end()) {
          throw DataError(str(it_dir.string(), ": the checkpoint has no parameter ", p.name,
                              " (saved from another model?)"));
        }
        std::vector<SourceParam>& cands = found->second;
        const std::vector<std::int64_t>& src_shape = cands.front().spec.global_shape;
        // The vocabulary's rows padded otherwise (another tensor-parallel size): the source's
        // padding rows beyond ours are dropped, ours beyond its are copies of its last row.
        const bool vocab_rows = vocabulary_rows(p.name) && src_shape.size() == 2 &&
                                p.global_shape.size() == 2 && src_shape[1] == p.global_shape[1] &&
                                src_shape[0] >= 1 && src_shape != p.global_shape;
        if (src_shape != p.global_shape && !vocab_rows) {
          throw DataError(str(it_dir.string(), ": parameter ", p.name, " has global shape ",
                              nlohmann::json(cands.front().spec.global_shape).dump(),
                              ", this run expects ", nlohmann::json(p.global_shape).dump()));
        }
        for (const SourceParam& sp : cands) {
          if (sp.spec.global_shape != src_shape) {
            throw CorruptCheckpoint(
                str(sp.shard->json_path(), ": parameter ", p.name, " has global shape ",
                    nlohmann::json(sp.spec.global_shape).dump(), " where another rank's has ",
                    nlohmann::json(cands.front().spec.global_shape).dump()));
          }
          check_param_slice(sp.spec, src_shape, sp.offset, sp.shard->numel(), sp.shard->tp_rank(),
                            sp.shard->json_path());
        }
        std::size_t last = 0;  // the candidate that served the previous element
        for (std::int64_t at = lo; at < hi; ++at) {
          std::int64_t g = p.global_index(at - at0, state.tp_rank);
          if (vocab_rows) {
            const std::int64_t cols = p.global_shape[1];
            g = std::min(g / cols, src_shape[0] - 1) * cols + g % cols;
          }
          bool done = false;
          for (std::size_t n = 0; n < cands.size() && !done; ++n) {
            const std::size_t c = (last + n) % cands.size();
            SourceParam& sp = cands[c];
            const std::int64_t j = sp.spec.local_index(g, sp.shard->tp_rank());
            if (j < 0) continue;  // another tp rank's slice
            const std::int64_t src_at = sp.offset + j;
            if (!sp.shard->holds(k, src_at)) continue;
            // data(k)[0] is the shard's stored element begin(k).
            dst.data[at - dst.begin] = sp.shard->data(k)[src_at - sp.shard->begin(k)];
            done = true;
            last = c;
          }
          if (!done) {
            throw CorruptCheckpoint(str(it_dir.string(), ": no rank shard holds element ", g,
                                        " of ", p.name, " (", k, ")"));
          }
        }
      }
    }
  }
}

}  // namespace trident::ckpt
