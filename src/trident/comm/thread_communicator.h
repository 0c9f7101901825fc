// ThreadCommunicator: ranks as threads of one process, meeting in a shared-memory rendezvous.
// It exists for tests (dist-thread tier: collectives, tp layers, pipeline, ZeRO on 1..8 ranks in
// one process) and checks more than MPI does: mismatched collectives and message sizes fail with
// a message naming both ranks, and a rank that throws or returns early fails its peers at once
// instead of leaving them to the timeout.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/communicator.h"

namespace trident::comm {

namespace detail {
struct ThreadGroupState;
}

// Semantics are those of Communicator. Collectives complete when every rank of the group has
// posted them; the rank that first finds the operation complete computes the result (sums in
// rank order 0..n-1, so every rank gets bitwise-identical values), and each rank copies its part
// out. send completes when the matching recv is posted (synchronous send), so code that would
// deadlock under MPI without eager buffering deadlocks here too — and times out with a message.
class ThreadCommunicator final : public Communicator {
 public:
  // One communicator per rank of a new world (group 'world', global ranks 0..world_size-1).
  // Hand element r to thread r.
  static std::vector<std::unique_ptr<ThreadCommunicator>> create_world(
      int world_size, const WaitPolicy& policy = {});

  // Marks the world failed: every rank waiting in (or later calling) any operation of any group
  // of this world throws CommError naming `global_rank` and `reason`. Used by run_on_threads.
  void abort_world(const std::string& reason);
  // Records that this rank's thread is done: operations that still wait for it fail at once.
  void mark_exited();

 protected:
  ImplPtr post_all_reduce(void* buf, std::int64_t count, Datatype dtype, ReduceOp op) override;
  ImplPtr post_reduce_scatter(const void* in, void* out, std::int64_t count, Datatype dtype,
                              ReduceOp op) override;
  ImplPtr post_reduce_scatter_v(const void* in, void* out, std::span<const std::int64_t> counts,
                                Datatype dtype, ReduceOp op) override;
  ImplPtr post_all_gather(const void* in, void* out, std::int64_t count, Datatype dtype) override;
  ImplPtr post_all_gather_v(const void* in, void* out, std::span<const std::int64_t> counts,
                            Datatype dtype) override;
  ImplPtr post_all_to_all_v(const void* in, std::span<const std::int64_t> send_counts, void* out,
                            std::span<const std::int64_t> recv_counts, Datatype dtype) override;
  ImplPtr post_broadcast(void* buf, std::int64_t count, Datatype dtype, int root) override;
  ImplPtr post_send(const void* buf, std::int64_t count, Datatype dtype, int peer,
                    int tag) override;
  ImplPtr post_recv(void* buf, std::int64_t count, Datatype dtype, int peer, int tag) override;
  ImplPtr post_barrier() override;
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& new_name) override;

 private:
  struct CollectiveArgs;
  ThreadCommunicator(std::shared_ptr<detail::ThreadGroupState> state, int rank,
                     const WaitPolicy& policy);
  ImplPtr post_collective(const CollectiveArgs& args);

  std::shared_ptr<detail::ThreadGroupState> state_;
  std::int64_t next_seq_ = 0;  // this rank's count of collectives posted on the group
};

// Runs fn(world) on `world_size` threads, rank r on thread r, and returns when all have ended.
// If a rank throws, the world is aborted (peers fail fast with CommError) and the first failing
// rank's exception is rethrown here. gtest EXPECT_* work inside fn.
void run_on_threads(int world_size, const std::function<void(Communicator& world)>& fn,
                    const WaitPolicy& policy = {});

}  // namespace trident::comm
