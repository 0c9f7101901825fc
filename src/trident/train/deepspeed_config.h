// Megatron-DeepSpeed's --deepspeed --deepspeed_config FILE: the DeepSpeed JSON sets the batch
// sizes, gradient accumulation, clipping, ZeRO stage and buckets, bf16 / fp16 with DeepSpeed's
// dynamic loss scaler, and Adam's betas and epsilon. Keys trident ignores get one warning line
// each; values that contradict flags given explicitly are refused. See docs/training.md.
#pragma once

#include <nlohmann/json_fwd.hpp>

namespace trident::train {

struct TrainConfig;

// Applies cfg.deepspeed_config (when cfg.deepspeed) to cfg; world_size gives the data-parallel
// size for train_batch_size = micro x gradient_accumulation_steps x dp. Throws InvalidArgument.
void apply_deepspeed_config(TrainConfig& cfg, int world_size);

// The same, from parsed JSON (`source` names it in messages).
void apply_deepspeed_json(TrainConfig& cfg, const nlohmann::json& ds, int world_size,
                          const char* source);

}  // namespace trident::train
