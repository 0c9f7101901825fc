// ZeRO-3 parameter gathering: each rank keeps only its shard of the FP32 weights (the master
// shard); the whole weights of a layer exist only while it runs, all-gathered into one of two
// staging slots, with the layer the pass visits next prefetched (non-blocking) into the other.
// Embedding and head weights are gathered once per iteration. Under --bf16 each gathered layer
// is converted into the slot's BF16 copy for the matmuls.
//
// The gatherer hands out where a layer's weights are (StagedLayer); the model is given those
// pointers explicitly by the composition (train/zero_optimizer.h).
#pragma once

#include <cstdint>

#include "trident/comm/communicator.h"
#include "trident/core/exec_context.h"
#include "trident/optim/comm_counters.h"
#include "trident/optim/param_buffers.h"

namespace trident::optim {

struct StagedLayer {
  int slot = 0;
  const float* params = nullptr;            // the layer's flat range, element range.begin first
  const core::bf16* params_bf16 = nullptr;  // --bf16 copy, else null
};

class Zero3ParamGatherer {
 public:
  Zero3ParamGatherer(ParamGradBuffers& buffers, comm::Communicator& dp, CommCounters& counters);
  Zero3ParamGatherer(const Zero3ParamGatherer&) = delete;
  Zero3ParamGatherer& operator=(const Zero3ParamGatherer&) = delete;

  // Start of an iteration: gathers the embedding and head weights (and their BF16 copies) and
  // forgets what the slots held (the shard changed in the last step).
  void begin_iteration(const core::ExecContext& ctx);
  // Layer unit `u` is about to run: returns its weights in slot `slot` (gathering now unless it
  // was prefetched), then starts gathering unit `next` (-1: none) into the other slot.
  StagedLayer acquire(const core::ExecContext& ctx, int u, int slot, int next);
  // Waits for any prefetch in flight (before the master shard is updated).
  void drain();

 private:
  void gather_into(int u, int slot, bool async);

  ParamGradBuffers& buf_;
  comm::Communicator& dp_;
  CommCounters& counters_;
  int slot_unit_[2] = {-1, -1};
  comm::Request slot_request_[2];
};

}  // namespace trident::optim
