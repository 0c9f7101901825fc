// ZeroPolicy: the one place a ZeRO stage number becomes properties (Rajbhandari et al.; DeepSpeed;
// Megatron's --use-distributed-optimizer = stage 1). Each part of the data-parallel optimizer
// picks its strategy from these once, at construction:
//
//   stage 0: nothing sharded. Gradient buckets all-reduced (optim/grad_sync.h).
//   stage 1: optimizer state (and the FP32 weights it updates) sharded over dp; buckets
//            reduce-scattered; updated weights all-gathered (optim/distributed_optimizer.h).
//   stage 2: also the gradients: each layer's gradient reduce-scattered right after its backward
//            in every micro-batch, only this rank's shard kept.
//   stage 3: also the weights: each rank keeps its shard of the FP32 weights; layers are gathered
//            just in time (optim/zero3_gather.h).
#pragma once

#include "trident/core/error.h"

namespace trident::optim {

struct ZeroPolicy {
  int stage = 0;

  // The optimizer state and the update are this rank's shard (else the whole buffer).
  bool shards_optimizer() const { return stage >= 1; }
  // Gradients are reduce-scattered layer by layer and kept as a shard.
  bool shards_gradients() const { return stage >= 2; }
  // Weights are kept as a shard and gathered per layer.
  bool shards_parameters() const { return stage >= 3; }
  // After the sharded update the whole weights are rebuilt by an all-gather (stages 1-2).
  bool gathers_updated_parameters() const { return shards_optimizer() && !shards_parameters(); }
};

inline ZeroPolicy zero_policy(int stage) {
  TRIDENT_CHECK(stage >= 0 && stage <= 3, "--zero-stage must be 0, 1, 2 or 3, got ", stage);
  return {stage};
}

}  // namespace trident::optim
