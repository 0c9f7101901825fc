// ZeRO-3 parameter gathering: each rank keeps only its shard of the FP32 weights (the master
// shard); the whole weights of a layer exist only while it runs, all-gathered into one of two
// staging slots, with the layer the pass visits next prefetched (non-blocking) into the other.
// Embedding and head weights are gathered once per iteration. Under --bf16 each gathered layer
// is converted into the slot's BF16 copy for the matmuls.
//
// --offload-params nvme (docs/offload.md): the master shard is an array of an OffloadStore on
// disk. A layer's piece of it is read into one of kFetchBuffers read-ahead buffers and all-gathered
// from there. The reads follow the gather order of the previous iteration (recorded acquire by
// acquire: forward, backward, recompute, pipeline interleaving included), kReadAhead layers
// beyond the one being gathered; when this iteration departs from the record (the first one,
// a changed schedule), the piece is read when its gather starts. The embedding and head pieces
// are read through the same buffers at the start of the iteration.
//
// The gatherer hands out where a layer's weights are (StagedLayer); the model is given those
// pointers explicitly by the composition (train/zero_optimizer.h).
#pragma once

#include <cstdint>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/exec_context.h"
#include "trident/optim/comm_counters.h"
#include "trident/optim/offload.h"
#include "trident/optim/param_buffers.h"

namespace trident::optim {

struct StagedLayer {
  int slot = 0;
  const float* params = nullptr;            // the layer's flat range, element range.begin first
  const core::bf16* params_bf16 = nullptr;  // --bf16 copy, else null
};

class Zero3ParamGatherer {
 public:
  static constexpr int kFetchBuffers = 3;  // one feeding the gather in flight, two read ahead
  static constexpr int kReadAhead = 2;

  // `store`: --offload-params nvme, the master shard is its array `array` (null: in memory).
  Zero3ParamGatherer(ParamGradBuffers& buffers, comm::Communicator& dp, CommCounters& counters,
                     OffloadStore* store = nullptr, int array = -1);
  ~Zero3ParamGatherer();
  Zero3ParamGatherer(const Zero3ParamGatherer&) = delete;
  Zero3ParamGatherer& operator=(const Zero3ParamGatherer&) = delete;

  // Start of an iteration: gathers the embedding and head weights (and their BF16 copies) and
  // forgets what the slots held (the shard changed in the last step). An evaluation pass
  // (training = false) neither follows nor records the training iterations' gather order.
  void begin_iteration(const core::ExecContext& ctx, bool training = true);
  // Layer unit `u` is about to run: returns its weights in slot `slot` (gathering now unless it
  // was prefetched), then starts gathering unit `next` (-1: none) into the other slot.
  StagedLayer acquire(const core::ExecContext& ctx, int u, int slot, int next);
  // Waits for any prefetch and read in flight (before the master shard is updated).
  void drain();

  // --offload-params nvme: the read-ahead buffers' bytes, as allocated (fetch_window_bytes).
  std::int64_t fetch_bytes() const { return fetch_bytes_; }
  // What the read-ahead buffers of any rank of this layout take.
  static std::int64_t fetch_window_bytes(const FlatLayout& layout, const parallel::ShardPlan& plan);

 private:
  struct Fetch {
    int unit = -1;
    bool pending = false;  // read submitted, not waited for
    int pinned_by = -1;    // the slot whose gather in flight reads it
    const float* data = nullptr;
  };
  void gather_into(int u, int slot, bool async);
  void release_slot(int slot);  // after its gather finished: its fetch buffer is free
  const float* shard_piece(int u, int slot, bool async);
  // The buffer holding (or reading) unit u's piece, reading it into a free one if none does;
  // -1 when every free buffer holds a piece the trace needs soon (demand: evict one anyway).
  int fetch(int u, bool demand);
  void read_ahead();
  void forget_fetches();
  void read_rest_piece(Range piece, float* out);

  ParamGradBuffers& buf_;
  comm::Communicator& dp_;
  CommCounters& counters_;
  int slot_unit_[2] = {-1, -1};
  comm::Request slot_request_[2];

  OffloadStore* store_ = nullptr;
  int array_ = -1;
  std::int64_t fetch_bytes_ = 0, fetch_each_ = 0;
  void* fetch_mem_ = nullptr;
  Fetch fetch_[kFetchBuffers];
  int slot_fetch_[2] = {-1, -1};
  std::vector<int> trace_, recording_;  // the previous / this iteration's acquired units
  std::size_t pos_ = 0;                 // acquires so far this iteration
  bool on_trace_ = false;
  bool recording_on_ = true;  // off during evaluation passes
};

}  // namespace trident::optim
