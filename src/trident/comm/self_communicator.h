// SelfCommunicator: a group of one rank. Collectives are copies (or nothing, in place); there is
// no peer to send to. Needs no MPI: a run without a launcher and the (1, 1, 1) layout use it.
#pragma once

#include <string>

#include "trident/comm/communicator.h"

namespace trident::comm {

class SelfCommunicator final : public Communicator {
 public:
  // global_rank: this process's world rank, for error messages (0 for a single-process run).
  explicit SelfCommunicator(std::string name = "world", int global_rank = 0,
                            const WaitPolicy& policy = {});

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
};

}  // namespace trident::comm
