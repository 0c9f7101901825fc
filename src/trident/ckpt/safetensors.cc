#include "trident/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "trident/core/bf16.h"
#include "trident/core/error.h"
#include "trident/data/json_io.h"

namespace trident::ckpt {

namespace fs = std::filesystem;
using core::DataError;
using core::str;

namespace {

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

// Round to nearest even; overflow to inf, NaN stays NaN.
std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (ax < 0x38800000u) {                                // below 2^-14: subnormal half (or zero)
    const float v = std::bit_cast<float>(ax) * 0x1p24f;  // in units of 2^-24
    const float r = std::nearbyint(v);                   // ties to even (default rounding mode)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(r));
  }
  const std::uint32_t mant = ax & 0x7fffffu, exp = (ax >> 23) - 112;
  std::uint32_t h = (exp << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
  return static_cast<std::uint16_t>(sign | h);
}

// A JSON array of non-negative integers (a shape or data_offsets): floats, negatives and values
// beyond int64 are refused here, before any conversion.
std::vector<std::int64_t> int_list(const nlohmann::json& j, const std::string& where,
                                   const char* key) {
  if (!j.is_array()) throw DataError(str(where, ": ", key, " must be a list of integers"));
  std::vector<std::int64_t> v;
  for (const nlohmann::json& x : j) {
    if (!x.is_number_unsigned() || x.get<std::uint64_t>() > (std::uint64_t{1} << 62)) {
      throw DataError(
          str(where, ": ", key, " ", j.dump(), " must hold non-negative integers (below 2^62)"));
    }
    v.push_back(static_cast<std::int64_t>(x.get<std::uint64_t>()));
  }
  return v;
}

}  // namespace

const char* st_dtype_name(StDType t) {
  switch (t) {
    case StDType::kF32:
      return "F32";
    case StDType::kBF16:
      return "BF16";
    case StDType::kF16:
      return "F16";
  }
  return "?";
}

StDType parse_st_dtype(const std::string& name, const std::string& where) {
  if (name == "F32") return StDType::kF32;
  if (name == "BF16") return StDType::kBF16;
  if (name == "F16") return StDType::kF16;
  throw DataError(
      str(where, ": dtype ", name, " is not supported (trident reads F32, BF16 and F16 weights)"));
}

std::int64_t st_dtype_bytes(StDType t) { return t == StDType::kF32 ? 4 : 2; }

std::int64_t StTensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw DataError(str(path, ": cannot open (", std::strerror(errno), ")"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError(str(path, ": cannot stat"));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw DataError(str(path, ": ", size_, " bytes is too short for a safetensors file"));
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw DataError(str(path, ": cannot map (", std::strerror(errno), ")"));
  }
  try {
    const auto* base = static_cast<const std::byte*>(map_);
    std::uint64_t header = 0;
    std::memcpy(&header, base, 8);  // little-endian (x86-64)
    if (header > size_ - 8 || header > (std::uint64_t{100} << 20)) {
      throw DataError(str(path, ": header length ", header, " exceeds the file (", size_,
                          " bytes): not a safetensors file or truncated"));
    }
    nlohmann::json h;
    try {
      h = data::parse_json_strict(std::string_view(reinterpret_cast<const char*>(base + 8),
                                                   static_cast<std::size_t>(header)));
    } catch (const nlohmann::json::exception& e) {
      throw DataError(str(path, ": malformed safetensors header (", e.what(), ")"));
    }
    if (!h.is_object()) throw DataError(str(path, ": the safetensors header is not an object"));
    data_ = base + 8 + header;
    const std::int64_t buffer = static_cast<std::int64_t>(size_ - 8 - header);
    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it.key() == "__metadata__") {
        metadata_ = it.value();
        continue;
      }
      const std::string where = str(path, ": tensor ", it.key());
      const nlohmann::json& t = it.value();
      try {
        StTensorInfo info;
        info.name = it.key();
        if (!t.is_object()) throw DataError(str(where, ": the entry is not an object"));
        info.dtype = parse_st_dtype(t.at("dtype").get<std::string>(), where);
        info.shape = int_list(t.at("shape"), where, "shape");
        const auto off = int_list(t.at("data_offsets"), where, "data_offsets");
        if (off.size() != 2 || off[1] < off[0] || off[1] > buffer) {
          throw DataError(str(where, ": data_offsets outside the file's ", buffer, " data bytes (",
                              t.at("data_offsets").dump(), ")"));
        }
        // The byte count the shape implies, without overflow (a dimension may be 0).
        std::int64_t bytes = st_dtype_bytes(info.dtype);
        bool fits = true;
        for (std::int64_t d : info.shape) fits = fits && !__builtin_mul_overflow(bytes, d, &bytes);
        if (!fits || off[1] - off[0] != bytes) {
          throw DataError(str(where, ": ", off[1] - off[0], " bytes for shape ",
                              t.at("shape").dump(), " of ", st_dtype_name(info.dtype)));
        }
        index_[info.name] = infos_.size();
        infos_.push_back(std::move(info));
        ranges_.emplace_back(off[0], off[1]);
      } catch (const nlohmann::json::exception& e) {
        throw DataError(str(where, ": malformed entry (", e.what(), ")"));
      }
    }
    // Tensors may not share bytes (safetensors' own rule; a reader would alias two weights).
    std::vector<std::size_t> order(ranges_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return ranges_[a] < ranges_[b]; });
    std::size_t last = order.size();  // the non-empty tensor ending furthest so far
    for (const std::size_t i : order) {
      const auto [b, e] = ranges_[i];
      if (b == e) continue;
      if (last != order.size() && b < ranges_[last].second) {
        throw DataError(str(path, ": tensors ", infos_[last].name, " and ", infos_[i].name,
                            " overlap (data_offsets [", ranges_[last].first, ", ",
                            ranges_[last].second, "] and [", b, ", ", e,
                            "]): the file is corrupt"));
      }
      if (last == order.size() || e > ranges_[last].second) last = i;
    }
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const StTensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw DataError(str(path_, ": no tensor named ", name));
  return infos_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw DataError(str(path_, ": no tensor named ", name));
  const auto [b, e] = ranges_[it->second];
  return {data_ + b, static_cast<std::size_t>(e - b)};
}

void SafetensorsFile::read_f32(const std::string& name, float* out) const {
  const StTensorInfo& t = info(name);
  const std::span<const std::byte> b = bytes(name);
  const std::int64_t n = t.numel();
  if (n == 0) return;  // an empty tensor: `out` may be null (found by fuzz_safetensors)
  switch (t.dtype) {
    case StDType::kF32:
      std::memcpy(out, b.data(), b.size());
      return;
    case StDType::kBF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, b.data() + 2 * i, 2);
        out[i] = core::bf16::from_bits(v).to_float();
      }
      return;
    case StDType::kF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, b.data() + 2 * i, 2);
        out[i] = f16_to_f32(v);
      }
      return;
  }
}

SafetensorsModel::SafetensorsModel(const std::string& dir) : dir_(dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      std::ifstream in(index);
      j = data::parse_json_strict(in);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(str(index.string(), ": malformed index (", e.what(), ")"));
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw DataError(str(index.string(), ": no weight_map object"));
    }
    std::map<std::string, const SafetensorsFile*> by_file;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        throw DataError(str(index.string(), ": weight_map[\"", it.key(), "\"] is ",
                            it.value().dump(), ", not a shard file name"));
      }
      const std::string file = it.value().get<std::string>();
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
        throw DataError(str(index.string(), ": shard name ", file, " is not a file of ", dir));
      }
      if (!by_file.count(file)) {
        files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / file).string()));
        by_file[file] = files_.back().get();
      }
      const SafetensorsFile* f = by_file[file];
      if (!f->has(it.key())) {
        throw DataError(str(index.string(), ": ", it.key(), " is listed in ", file,
                            ", which does not hold it"));
      }
      where_[it.key()] = f;
    }
  } else if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const StTensorInfo& t : files_.back()->tensors()) where_[t.name] = files_.back().get();
  } else {
    throw DataError(str(dir,
                        ": neither model.safetensors nor model.safetensors.index.json "
                        "(PyTorch .bin weights are not read: convert them with "
                        "transformers' save_pretrained(..., safe_serialization=True))"));
  }
}

const SafetensorsFile& SafetensorsModel::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw DataError(str(dir_, ": the weights have no tensor ", name));
  return *it->second;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> v;
  for (const auto& [k, f] : where_) v.push_back(k);
  return v;
}

SafetensorsWriter::SafetensorsWriter(std::string dir, std::int64_t max_shard_bytes)
    : dir_(std::move(dir)), max_shard_bytes_(max_shard_bytes) {
  TRIDENT_CHECK(max_shard_bytes_ > 0, "safetensors shard size must be positive");
}

void SafetensorsWriter::declare(StTensorInfo info) { infos_.push_back(std::move(info)); }

std::vector<std::string> SafetensorsWriter::write(
    const std::function<void(std::size_t, std::span<float>)>& fill,
    const nlohmann::json& metadata) {
  // Plan the shards: consecutive tensors while the shard stays within the bound.
  std::vector<std::vector<std::size_t>> shards;
  std::int64_t in_shard = 0;
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    const std::int64_t b = infos_[i].numel() * st_dtype_bytes(infos_[i].dtype);
    if (shards.empty() || (in_shard > 0 && in_shard + b > max_shard_bytes_)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
  }
  fs::create_directories(dir_);
  std::vector<std::string> files;
  nlohmann::json weight_map = nlohmann::json::object();
  std::int64_t total = 0;
  std::vector<float> f32;
  std::vector<std::uint16_t> half;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    if (shards.size() == 1) {
      std::snprintf(name, sizeof(name), "model.safetensors");
    } else {
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    }
    nlohmann::json header = nlohmann::json::object();
    header["__metadata__"] = metadata;
    std::int64_t offset = 0;
    for (std::size_t i : shards[s]) {
      const StTensorInfo& t = infos_[i];
      const std::int64_t b = t.numel() * st_dtype_bytes(t.dtype);
      header[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                        {"shape", t.shape},
                        {"data_offsets", {offset, offset + b}}};
      offset += b;
      weight_map[t.name] = name;
      total += b;
    }
    std::string text = header.dump();
    while ((text.size() + 8) % 8 != 0) text += ' ';  // the data starts 8-byte aligned
    const fs::path path = fs::path(dir_) / name;
    const std::string tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) throw core::Error(str("cannot create ", tmp));
      const std::uint64_t len = text.size();
      out.write(reinterpret_cast<const char*>(&len), 8);
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      for (std::size_t i : shards[s]) {
        const StTensorInfo& t = infos_[i];
        f32.assign(static_cast<std::size_t>(t.numel()), 0.0f);
        fill(i, f32);
        if (t.dtype == StDType::kF32) {
          out.write(reinterpret_cast<const char*>(f32.data()),
                    static_cast<std::streamsize>(f32.size() * 4));
          continue;
        }
        half.resize(f32.size());
        for (std::size_t k = 0; k < f32.size(); ++k) {
          half[k] =
              t.dtype == StDType::kBF16 ? core::bf16::from_float(f32[k]).bits : f32_to_f16(f32[k]);
        }
        out.write(reinterpret_cast<const char*>(half.data()),
                  static_cast<std::streamsize>(half.size() * 2));
      }
      out.flush();
      if (!out) throw core::Error(str("cannot write ", tmp, " (disk full?)"));
    }
    fs::rename(tmp, path);
    files.push_back(path.string());
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    std::ofstream out(fs::path(dir_) / "model.safetensors.index.json");
    out << index.dump(2) << "\n";
    files.push_back((fs::path(dir_) / "model.safetensors.index.json").string());
  }
  return files;
}

}  // namespace trident::ckpt
