// SelfCommunicator: every collective of a one-rank group is its identity (a copy when out != in).
#include "trident/comm/self_communicator.h"

#include <cstring>

namespace trident::comm {

namespace {
void copy_if_distinct(void* out, const void* in, std::int64_t bytes) {
  if (out != in && bytes > 0) std::memmove(out, in, static_cast<std::size_t>(bytes));
}
}  // namespace

SelfCommunicator::SelfCommunicator(std::string name, int global_rank, const WaitPolicy& policy)
    : Communicator(GroupInfo{.name = std::move(name), .global_ranks = {global_rank}}, 0, policy) {}

Communicator::ImplPtr SelfCommunicator::post_all_reduce(void*, std::int64_t, Datatype, ReduceOp) {
  return nullptr;
}

Communicator::ImplPtr SelfCommunicator::post_reduce_scatter(const void* in, void* out,
                                                            std::int64_t count, Datatype dtype,
                                                            ReduceOp) {
  copy_if_distinct(out, in, count * size_of(dtype));
  return nullptr;
}

Communicator::ImplPtr SelfCommunicator::post_reduce_scatter_v(const void* in, void* out,
                                                              std::span<const std::int64_t> counts,
                                                              Datatype dtype, ReduceOp) {
  copy_if_distinct(out, in, counts[0] * size_of(dtype));
  return nullptr;
}

Communicator::ImplPtr SelfCommunicator::post_all_gather(const void* in, void* out,
                                                        std::int64_t count, Datatype dtype) {
  copy_if_distinct(out, in, count * size_of(dtype));
  return nullptr;
}

Communicator::ImplPtr SelfCommunicator::post_all_gather_v(const void* in, void* out,
                                                          std::span<const std::int64_t> counts,
                                                          Datatype dtype) {
  copy_if_distinct(out, in, counts[0] * size_of(dtype));
  return nullptr;
}

Communicator::ImplPtr SelfCommunicator::post_all_to_all_v(
    const void* in, std::span<const std::int64_t> send_counts, void* out,
    std::span<const std::int64_t> /*recv_counts*/, Datatype dtype) {
  copy_if_distinct(out, in, send_counts[0] * size_of(dtype));
  return nullptr;
}

Communicator::ImplPtr SelfCommunicator::post_broadcast(void*, std::int64_t, Datatype, int) {
  return nullptr;
}

// Unreachable: the front end rejects a peer equal to this rank, the only rank there is.
Communicator::ImplPtr SelfCommunicator::post_send(const void*, std::int64_t, Datatype, int, int) {
  TRIDENT_ASSERT(false, "SelfCommunicator::post_send reached");
  return nullptr;
}

Communicator::ImplPtr SelfCommunicator::post_recv(void*, std::int64_t, Datatype, int, int) {
  TRIDENT_ASSERT(false, "SelfCommunicator::post_recv reached");
  return nullptr;
}

Communicator::ImplPtr SelfCommunicator::post_barrier() { return nullptr; }

std::unique_ptr<Communicator> SelfCommunicator::do_split(int color, int,
                                                         const std::string& new_name) {
  if (color == kNoColor) return nullptr;
  return std::make_unique<SelfCommunicator>(new_name, global_rank(), wait_policy());
}

}  // namespace trident::comm
