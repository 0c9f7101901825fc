// Checkpoint saving for the trainer, synchronous or in the background (--async-save).
//
// Async: the save copies this rank's three tensors (FP32 weights, both Adam moments) into host
// buffers it owns — the only part training waits for, besides creating the directory — and a
// background thread writes, fsyncs and verifies the shard while training continues. At most one
// save is in flight: poll() after every iteration finishes it (collectively: the tracker is
// replaced only when every rank's shard is on disk) and a new save or the end of the run waits
// for it. The background thread never communicates; everything collective stays on the training
// thread. The guarantees are those of a synchronous save (ckpt/checkpoint.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "trident/ckpt/checkpoint.h"
#include "trident/comm/communicator.h"

namespace trident::train {

class CheckpointSaver {
 public:
  CheckpointSaver(std::string dir, bool async, ckpt::SaveOptions options)
      : dir_(std::move(dir)), async_(async), options_(options) {}
  ~CheckpointSaver();  // joins a writer still running (its save is abandoned, not finished)

  // Collective: saves `state` (synchronously, or starts a background save after finishing the
  // one in flight). Returns the milliseconds training was blocked. Throws ckpt::SaveError.
  double save(const ckpt::CheckpointState& state, comm::Communicator& world);
  // Collective when a save is in flight: finishes it once every rank's writer is done (block:
  // waits for them). Returns the milliseconds it blocked. Throws ckpt::SaveError.
  double poll(comm::Communicator& world, bool block = false);

 private:
  std::string dir_;
  bool async_ = false;
  ckpt::SaveOptions options_;
  ckpt::CheckpointState copy_;          // the state being written, pointing into the buffers below
  ckpt::CheckpointState experts_copy_;  // its experts' part (expert parallelism)
  std::vector<std::vector<float>> buffers_;  // one per tensor of the state
  std::string tmp_dir_, error_;
  std::thread writer_;
  std::atomic<bool> done_{false};
  double write_ms_ = 0;
};

}  // namespace trident::train
