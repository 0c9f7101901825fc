// Fuzz target: the two model-architecture readers. The first byte picks one:
//   even  a Hugging Face config.json (ckpt::hf_config_to_trident, `trident convert --from-hf`),
//         then the HF weight list the import checks the safetensors against (ckpt::hf_tensors);
//   odd   a trident checkpoint's "config" (ckpt::model_config_from_json, `trident generate`,
//         `trident convert --to-hf`), validated as the commands do.
// The rest is the JSON text. A config that is accepted must describe a model whose parameter
// count fits (the import allocates it) and whose HF tensors index inside their parameters.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "trident/ckpt/hf_model.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/data/json_io.h"
#include "trident/model/param_table.h"

namespace {

// Parses like tools/convert_hf.cc's read_json (a malformed file is a DataError there).
nlohmann::json parse(std::string_view text) {
  try {
    return trident::data::parse_json_strict(text);
  } catch (const nlohmann::json::exception& e) {
    throw trident::core::DataError(std::string("config.json: malformed JSON (") + e.what() + ")");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  if (size == 0) return 0;
  const bool hf = data[0] % 2 == 0;
  const std::int64_t seq = (data[0] >> 1) % 4 == 0 ? 0 : 16 << ((data[0] >> 1) % 4);
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::expect_clean_errors("fuzz_model_config", [&] {
    const nlohmann::json j = parse(text);
    model::ModelConfig m;
    if (hf) {
      const ckpt::HfImport imp = ckpt::hf_config_to_trident(j, seq);
      m = imp.model;
      const model::ParamTable table = model::build_gpt_param_table(m);
      if (table.total_numel < m.num_parameters()) __builtin_trap();
      for (const ckpt::HfTensor& t : ckpt::hf_tensors(m, imp.arch)) {
        const model::ParamSpec& p = table.find(t.trident_name);
        const std::int64_t n = t.numel();
        if (n <= 0 || n > p.numel) __builtin_trap();
        // The first and last elements (the import writes every one; these bound the mapping).
        for (const std::int64_t i : {std::int64_t{0}, n - 1}) {
          const std::int64_t at = t.index(i);
          if (at < 0 || at >= p.numel) __builtin_trap();
        }
      }
      (void)ckpt::trident_to_hf_config(m, imp.arch, imp.dtype).dump();
    } else {
      m = ckpt::model_config_from_json(j);
      m.validate();
      (void)ckpt::hf_arch_of(m);
    }
  });
  return 0;
}
