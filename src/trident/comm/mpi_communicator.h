// MpiCommunicator: a Communicator over an MPI communicator (processes; CPU buffers). Every
// operation is posted non-blocking (MPI_Iallreduce, MPI_Isend, ...) and completed by the
// Request's MPI_Test polling loop, which is what gives blocking calls their timeout.
#pragma once

#include <mpi.h>

#include <climits>
#include <memory>
#include <string>

#include "trident/comm/communicator.h"
#include "trident/comm/runtime.h"

namespace trident::comm {

class MpiCommunicator final : public Communicator {
 public:
  // A duplicate of MPI_COMM_WORLD (its own message space). Collective over all processes.
  static std::unique_ptr<MpiCommunicator> world(const MpiRuntime& runtime,
                                                const WaitPolicy& policy = {},
                                                const std::string& name = "world");
  ~MpiCommunicator() override;

  // all_reduce, broadcast, send and recv of more elements than this are split into several MPI
  // messages (MPI counts are int). Tests lower it to run the chunked path at small sizes. The
  // other collectives reject counts above INT_MAX with InvalidArgument. Inherited by split().
  void set_max_message_elems(std::int64_t n);
  std::int64_t max_message_elems() const { return max_message_elems_; }

  MPI_Comm mpi_comm() const { return comm_; }

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
  MpiCommunicator(MPI_Comm comm, GroupInfo group, int rank, const WaitPolicy& policy);
  int to_int(std::int64_t n, const char* what) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::int64_t max_message_elems_ = INT_MAX;
};

}  // namespace trident::comm
