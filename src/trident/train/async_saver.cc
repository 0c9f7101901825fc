#include "trident/train/async_saver.h"

#include <algorithm>

#include "trident/core/log.h"
#include "trident/core/timer.h"

namespace trident::train {

namespace {

void copy_slice(const ckpt::CheckpointState::Slice& from, std::vector<float>& buf,
                ckpt::CheckpointState::Slice& to) {
  buf.resize(static_cast<std::size_t>(from.end - from.begin));
  std::copy(from.data, from.data + (from.end - from.begin), buf.data());
  to = {buf.data(), from.begin, from.end};
}

}  // namespace

CheckpointSaver::~CheckpointSaver() {
  if (writer_.joinable()) writer_.join();
}

double CheckpointSaver::save(const ckpt::CheckpointState& state, comm::Communicator& world) {
  core::Timer t;
  if (!async_) {
    ckpt::save_checkpoint(dir_, state, world, options_);
    return t.elapsed_ms();
  }
  poll(world, /*block=*/true);  // at most one save in flight
  tmp_dir_ = ckpt::begin_save(dir_, state, world);
  copy_ = state;
  const auto parts = static_cast<std::size_t>(state.experts != nullptr ? 2 : 1);
  buffers_.assign(parts * (1 + state.optimizer_state.size()), {});
  std::size_t next = 0;
  const auto copy_part = [&](const ckpt::CheckpointState& from, ckpt::CheckpointState& to) {
    copy_slice(from.params, buffers_[next++], to.params);
    for (std::size_t i = 0; i < from.optimizer_state.size(); ++i) {
      copy_slice(from.optimizer_state[i].slice, buffers_[next++], to.optimizer_state[i].slice);
    }
  };
  copy_part(state, copy_);
  if (state.experts != nullptr) {
    experts_copy_ = *state.experts;
    copy_part(*state.experts, experts_copy_);
    copy_.experts = &experts_copy_;
  }
  done_ = false;
  error_.clear();
  const int rank = world.rank();
  writer_ = std::thread([this, rank] {
    core::Timer w;
    error_ = ckpt::write_shard(tmp_dir_, rank, copy_);
    write_ms_ = w.elapsed_ms();
    done_ = true;
  });
  return t.elapsed_ms();
}

double CheckpointSaver::poll(comm::Communicator& world, bool block) {
  // Every rank starts and finishes saves together, so "in flight" is the same on every rank.
  if (!async_ || !writer_.joinable()) return 0;
  core::Timer t;
  if (block) writer_.join();
  std::int64_t done = block || done_ ? 1 : 0;
  if (world.size() > 1) world.all_reduce(&done, 1, comm::Datatype::kI64, comm::ReduceOp::kMin);
  if (done == 0) return t.elapsed_ms();
  if (writer_.joinable()) writer_.join();
  ckpt::finish_save(dir_, tmp_dir_, copy_, world, error_, options_);
  log::info("ckpt: saved iteration ", copy_.iteration, " to ", dir_, " in the background (",
            write_ms_, " ms writing this rank's shard)");
  return t.elapsed_ms();
}

}  // namespace trident::train
