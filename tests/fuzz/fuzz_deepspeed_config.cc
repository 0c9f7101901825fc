// Fuzz target: Megatron-DeepSpeed's --deepspeed --deepspeed_config FILE.json, read by
// TrainConfig::finalize (train::apply_deepspeed_config) as `trident train` does. The first byte
// picks the world size (1, 2, 4 or 8 processes) and which flags count as given explicitly (the
// JSON may contradict them: a refusal naming both); the rest is the JSON file. A config that is
// accepted must serialize (the checkpoint manifest) and give a micro-batch count.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_util.h"
#include "trident/train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace trident;
  if (size == 0) return 0;
  const int world = 1 << (data[0] % 4);
  const std::uint8_t given = data[0] >> 2;
  const std::string path = fuzz::scratch_path("ds_config.json");
  fuzz::write_file(path, {reinterpret_cast<const char*>(data) + 1, size - 1});
  fuzz::expect_clean_errors("fuzz_deepspeed_config", [&] {
    train::TrainConfig cfg;
    // The settings of a small run (as tests/fuzz/corpus/fuzz_train_args/basic.args).
    cfg.model.num_layers = 2;
    cfg.model.hidden_size = 64;
    cfg.model.num_attention_heads = 4;
    cfg.model.seq_length = 32;
    cfg.model.max_position_embeddings = 64;
    cfg.data_path = {"corpus"};
    cfg.tokenizer_type = "NullTokenizer";
    cfg.null_tokenizer_vocab_size = 64;
    cfg.deepspeed = true;
    cfg.deepspeed_config = path;
    if (given & 1) cfg.given.insert("--micro-batch-size"), cfg.micro_batch_size = 2;
    if (given & 2) cfg.given.insert("--global-batch-size"), cfg.global_batch_size = 8;
    if (given & 4) cfg.given.insert("--zero-stage"), cfg.zero_stage = 1;
    if (given & 8) cfg.given.insert("--bf16"), cfg.bf16 = true;
    if (given & 16) cfg.given.insert("--fp16"), cfg.fp16 = true;
    if (given & 32) cfg.given.insert("--clip-grad"), cfg.optimizer.clip_grad = 1.0;
    cfg.finalize(world);
    (void)cfg.to_json().dump();
    (void)cfg.num_micro_batches(world);
  });
  return 0;
}
