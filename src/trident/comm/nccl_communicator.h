// Communicators for device buffers (CUDA builds only; docs/gpu.md):
//
// NcclCommunicator: a Communicator over NCCL, for ranks that each own a GPU. The NCCL unique id is
// bootstrapped over a host communicator of the same group (MPI), one NCCL communicator per group
// (split() makes the child with ncclCommSplit and the host group's split), every operation is
// queued on the communicator's own CUDA stream, after the work already queued on the compute
// stream (set_compute_stream), and its Request completes when the stream reaches it. Waiting
// for a Request does not stop the host: the compute stream is made to wait for the operation's
// event (cudaStreamWaitEvent), so a training step queues its collectives and kernels without one
// host synchronization per collective (barriers alone are waited for on the host). The timeout
// is a watchdog thread's, which polls the events of those waits: a stuck NCCL operation aborts
// the communicator (ncclCommAbort, which frees the streams waiting for it) and becomes the
// CommError the MPI communicator gives (operation, group, global ranks, step), thrown by the
// communicator's next call so that the caller's abort_job ends the job instead of hanging; if the
// host does not reach another call within 10 s, the watchdog ends the job itself (abort_job). Tags
// of send/recv are checked but not matched: NCCL orders the messages between two ranks by posting
// order. Sends and receives posted between two waits go to NCCL as one group (posted when one of
// their requests is first tested, or before any other operation): an ungrouped NCCL send blocks
// until the peer posts its receive, so two neighbours that both send first would deadlock.
//
// HostStagedCommunicator: the same interface over any host communicator (MPI), for several ranks
// that share one GPU (NCCL refuses that): each operation copies its device input to pinned host
// memory, runs the host collective (with its timeout and errors) and copies the result back.
// Collectives are synchronous (their Requests are complete); sends and receives are posted on the
// host and complete later (a receive copies to the device then), so that two ranks that each
// post a receive before their send do not deadlock.
#pragma once

#include <memory>
#include <string>

#include "trident/comm/communicator.h"

namespace trident::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `host`'s group: every rank passes its host communicator and the GPU it owns
  // (made current on the calling thread). Throws CommError when NCCL cannot start (e.g. two ranks
  // on one GPU: use HostStagedCommunicator), naming the group.
  static std::unique_ptr<NcclCommunicator> create(std::unique_ptr<Communicator> host, int device);
  ~NcclCommunicator() override;

  // Operations wait for the work queued on `stream` (a cudaStream_t; null: the legacy default
  // stream, the kernels' null stream) before they start, so that they see the gradients the
  // backward pass wrote. Children made by split() inherit it.
  void set_compute_stream(void* stream);
  bool progresses_itself() const override { return true; }
  void* comm_stream() const { return comm_stream_; }
  int device() const { return device_; }

  struct State;  // the ncclComm_t, shared with pending requests (their watchdog aborts it)

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
  NcclCommunicator(std::unique_ptr<Communicator> host, std::shared_ptr<State> state, int device);
  void before_op();
  ImplPtr after_op(const char* what);
  ImplPtr post_p2p(bool send, void* buf, std::int64_t count, Datatype dtype, int peer);
  void flush_p2p();  // posts the open batch of sends and receives as one NCCL group

  std::unique_ptr<Communicator> host_;
  std::shared_ptr<State> state_;  // the ncclComm_t, shared with pending requests (abort)
  int device_ = 0;
  void* comm_stream_ = nullptr;
  void* compute_stream_ = nullptr;
  void* barrier_buf_ = nullptr;
};

class HostStagedCommunicator final : public Communicator {
 public:
  // Wraps `host` (its group, rank, step and wait policy); buffers passed to this communicator are
  // device memory of the current GPU.
  explicit HostStagedCommunicator(std::unique_ptr<Communicator> host);
  ~HostStagedCommunicator() override;

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
  void* staging(std::int64_t bytes);  // pinned host memory, grown on demand
  void sync_host_step();

  std::unique_ptr<Communicator> host_;
  void* staging_ = nullptr;
  std::int64_t staging_bytes_ = 0;
};

}  // namespace trident::comm
