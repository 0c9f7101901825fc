// `trident convert --from-hf DIR --save CKPT` and `trident convert --load CKPT --to-hf DIR`
// (convert_hf.cc): Hugging Face transformers model directories <-> trident checkpoints.
#pragma once

#include <cstdint>
#include <string>

namespace trident::tools {

struct HfImportArgs {
  std::string from_hf, save;
  std::int64_t seq_length = 0;  // 0: the model's max_position_embeddings (BLOOM: 2048)
  std::string tokenizer_dir;    // where the tokenizer files go ("": <save>/hf_tokenizer)
};
// Writes a one-rank trident checkpoint at iteration 0 (Adam moments zero) holding the HF model's
// weights; any training layout loads it (checkpoints reshard on load), `trident convert` reshards
// it offline.
void import_from_hf(const HfImportArgs& a);

struct HfExportArgs {
  std::string load, to_hf;
  std::int64_t iteration = -1;
  std::int64_t max_shard_bytes = std::int64_t{5} << 30;  // transformers' default "5GB" (5 GiB)
  std::string dtype;  // float32, bfloat16, float16; "": as imported (float32 for trident's own)
};
// Writes config.json, the weights as safetensors shards (+ index) and the tokenizer files, from
// a checkpoint of any layout (ZeRO shards included).
void export_to_hf(const HfExportArgs& a);

}  // namespace trident::tools
