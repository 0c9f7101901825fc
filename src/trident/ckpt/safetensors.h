// safetensors files (Hugging Face's tensor format): an 8-byte little-endian header length, a JSON
// header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// tensors' bytes. Read by memory mapping (a tensor is a view into the mapping, converted to FP32
// on demand), written one tensor at a time into shards of bounded size with the index file
// transformers reads (model.safetensors.index.json). Supported dtypes: F32, BF16, F16.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace trident::ckpt {

enum class StDType : std::uint8_t { kF32, kBF16, kF16 };
const char* st_dtype_name(StDType t);
// Throws DataError naming the dtype for anything but F32, BF16, F16.
StDType parse_st_dtype(const std::string& name, const std::string& where);
std::int64_t st_dtype_bytes(StDType t);

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<std::int64_t> shape;
  std::int64_t numel() const;
};

// One memory-mapped safetensors file.
class SafetensorsFile {
 public:
  // Throws DataError naming the file and the fault (truncated, malformed header, offsets outside
  // the file or overlapping, unsupported dtype, size not matching the shape).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StTensorInfo>& tensors() const { return infos_; }
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  const StTensorInfo& info(const std::string& name) const;
  // The tensor's raw bytes in the mapping.
  std::span<const std::byte> bytes(const std::string& name) const;
  // The tensor converted to FP32 (exact for every supported dtype).
  void read_f32(const std::string& name, float* out) const;
  const nlohmann::json& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  const std::byte* data_ = nullptr;  // start of the byte buffer
  std::vector<StTensorInfo> infos_;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges_;
  std::map<std::string, std::size_t> index_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

// A Hugging Face model directory's weights: model.safetensors, or the shards listed by
// model.safetensors.index.json (each mapped once).
class SafetensorsModel {
 public:
  explicit SafetensorsModel(const std::string& dir);
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  const SafetensorsFile& file_of(const std::string& name) const;  // DataError when absent
  std::vector<std::string> names() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// Writes tensors in order into <dir>/model-0000i-of-0000n.safetensors shards of at most
// max_shard_bytes each (a tensor never splits; one file named model.safetensors when everything
// fits in one), then the index. The tensor list is declared first (names, dtypes, shapes), so the
// shard plan and headers are known before any data: each tensor's data is produced by a callback
// when its turn comes and written straight to its file (the model is never held twice).
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string dir, std::int64_t max_shard_bytes);
  void declare(StTensorInfo info);
  // Calls fill(i, out) for every declared tensor i in order, out = its numel FP32 values, which
  // are converted to the tensor's dtype (round to nearest even). Returns the files written.
  std::vector<std::string> write(const std::function<void(std::size_t, std::span<float>)>& fill,
                                 const nlohmann::json& metadata = {{"format", "pt"}});

 private:
  std::string dir_;
  std::int64_t max_shard_bytes_;
  std::vector<StTensorInfo> infos_;
};

}  // namespace trident::ckpt
