// TensorBoard event files written directly: TFRecord framing (length, masked CRC-32C of the
// length, the record, masked CRC-32C of the record) around tensorflow.Event protocol buffers
// (wall_time, step, file_version or a Summary with one simple_value), encoded by hand. The file
// is events.out.tfevents.<seconds>.<host>.<pid> in the --tensorboard-dir, as TensorBoard expects;
// every event is flushed as it is written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace trident::train {

// CRC-32C (Castagnoli), as TFRecord uses it, and TFRecord's masking of it.
std::uint32_t crc32c(const void* data, std::size_t n);
std::uint32_t masked_crc32c(const void* data, std::size_t n);

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  // Creates `dir` and the event file; empty `dir`: writes nothing. Throws core::Error.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  bool enabled() const { return file_ != nullptr; }
  void add_scalar(std::string_view tag, double value, std::int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace trident::train
