// Fuzz target: Hugging Face safetensors weights as `trident convert --from-hf` reads them
// (ckpt::SafetensorsModel). One input is either a single model.safetensors, or (when it holds
// the file separator) model.safetensors.index.json followed by the two shards it may name,
// model-00001-of-00002.safetensors and model-00002-of-00002.safetensors. Every tensor a model
// opens with must be readable: its byte span is exactly numel x dtype size, lies in the file, and
// converts to FP32 (every byte is touched).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trident/ckpt/safetensors.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  const std::string dir = fuzz::scratch_path("hf");
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const bool sharded = all.find(fuzz::kSeparator) != std::string_view::npos;
  if (sharded) {
    const auto parts = fuzz::split_input(data, size, 3);
    fuzz::write_file(dir + "/model.safetensors.index.json", parts[0]);
    fuzz::write_file(dir + "/model-00001-of-00002.safetensors", parts[1]);
    fuzz::write_file(dir + "/model-00002-of-00002.safetensors", parts[2]);
  } else {
    fuzz::write_file(dir + "/model.safetensors", all);
  }
  fuzz::expect_clean_errors("fuzz_safetensors", [&] {
    const ckpt::SafetensorsModel model(dir);
    std::vector<float> buf;
    for (const std::string& name : model.names()) {
      const ckpt::SafetensorsFile& f = model.file_of(name);
      const ckpt::StTensorInfo& info = f.info(name);
      const auto bytes = f.bytes(name);
      const std::int64_t n = info.numel();
      if (n < 0 || static_cast<std::int64_t>(bytes.size()) != n * ckpt::st_dtype_bytes(info.dtype))
        __builtin_trap();                         // the span disagrees with the shape
      if (bytes.size() > size) __builtin_trap();  // more bytes than the input holds
      buf.assign(static_cast<std::size_t>(n), 0.0f);
      f.read_f32(name, buf.data());
    }
  });
  return 0;
}
