// Communicator: the one virtual interface for talking to a group of ranks (tp, dp, pp, embedding,
// world). Implementations: MpiCommunicator (processes), ThreadCommunicator (ranks as threads, for
// tests), SelfCommunicator (size 1). Every wait has a timeout that turns a hang into a CommError
// naming the operation, the group, its ranks, the peer and the step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "trident/comm/datatype.h"
#include "trident/core/error.h"
#include "trident/core/tensor.h"

namespace trident::comm {

// How a rank waits for an operation to finish. A wait polls the operation (MPI_Test): back to
// back for `spin_s`, then with sched_yield between polls until `yield_s`, then sleeping between
// polls (elapsed / 32, at least 10 us, at most `max_sleep_s`), so a rank that waits for a slow
// peer leaves the core to others. After `timeout_s` the wait throws CommError. MPI advances a
// multi-round collective only while polled, so yield_s covers the typical collective (1 MiB
// all-reduce between 2 ranks: ~0.25 ms); see docs/parallelism.md for the measurements.
struct WaitPolicy {
  double timeout_s = 300.0;  // --comm-timeout
  double spin_s = 20e-6;
  double yield_s = 1e-3;
  double max_sleep_s = 1e-3;
  friend bool operator==(const WaitPolicy&, const WaitPolicy&) = default;
};

// Who a group is, for error messages: its name and the global (world) rank of each member.
struct GroupInfo {
  std::string name;               // "world", "tp", "dp", "pp", "embedding", ...
  std::vector<int> global_ranks;  // global_ranks[group rank] = world rank
};

enum class OpKind : std::uint8_t {
  kAllReduce,
  kReduceScatter,
  kReduceScatterV,
  kAllGather,
  kAllGatherV,
  kAllToAllV,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
  kSplit
};
const char* op_name(OpKind kind);

// One operation as the error messages describe it.
struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  std::int64_t count = 0;  // elements: the buffer (all_reduce, broadcast, p2p) or one rank's block
  Datatype dtype = Datatype::kF32;
  ReduceOp op = ReduceOp::kSum;  // reductions only
  int peer = -1;                 // group rank of the peer (send/recv) or root (broadcast)
  int tag = 0;                   // send/recv only
  std::int64_t step = -1;        // the communicator's step when the operation was posted
  std::int64_t seq = 0;          // collectives: 1, 2, ... per group, equal on every member
};

// "all_reduce(count=8, f32, sum) on group 'dp' (global ranks [0, 2]; this rank: 1 = global 2)
// at step 17": the context every CommError carries.
std::string describe(const GroupInfo& group, int rank, const OpDesc& op);

namespace detail {
struct GroupProgress;  // hang_report.h
// The implementation side of a Request. test() never blocks; it returns true once the operation
// is complete (output buffers written, input buffers free again) and throws CommError if it failed.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  virtual bool test() = 0;
  // Waits up to `seconds` (0: just yield the core) for progress, then returns test().
  virtual bool block_for(double seconds);
  // Called once after a timeout, before the Request gives up on the operation. Implementations
  // detach what they can (the thread communicator withdraws the rank from the operation so peers
  // fail instead of touching its buffers). MPI cannot cancel a collective: its buffers stay in
  // use until the job ends.
  virtual void abandon() noexcept {}
  // Device communicators (NCCL): instead of the host waiting, make the device's later work (the
  // compute stream) wait for the operation, and hand its timeout to the communicator's watchdog,
  // which turns a stuck operation into the CommError `describe(group, rank, op)` names. Returns
  // false where the host must wait (host communicators; barriers).
  virtual bool order_on_device(const GroupInfo& group, int rank, const OpDesc& op,
                               const WaitPolicy& policy) {
    (void)group, (void)rank, (void)op, (void)policy;
    return false;
  }
};
}  // namespace detail

// Handle of a posted non-blocking operation. Move-only. wait() blocks until the operation is
// complete and throws CommError after the timeout; test() never blocks. On a communicator of
// device buffers that orders on the device (NcclCommunicator), wait() returns once the compute
// stream waits for the operation (the buffers are then ready for the kernels queued after it, and
// for copies ordered after those), and the timeout is the communicator's watchdog's. Buffers passed
// to the operation must stay valid and untouched until it completes. Destroying a pending Request
// waits for it (errors are logged, not thrown); call wait() yourself to see errors.
//
// MPI progresses an operation only inside MPI calls. To overlap a gradient-bucket reduction with
// backward compute, call test() on pending requests between layers.
class [[nodiscard]] Request {
 public:
  Request() = default;  // already complete
  Request(std::unique_ptr<detail::RequestImpl> impl, std::shared_ptr<const GroupInfo> group,
          int rank, const OpDesc& op, const WaitPolicy& policy);
  Request(Request&& other) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  bool test();
  void wait();
  bool done() const { return impl_ == nullptr; }

 private:
  [[noreturn]] void throw_with_context(const std::exception& e);
  void finish_on_destruction() noexcept;

  std::unique_ptr<detail::RequestImpl> impl_;
  std::shared_ptr<const GroupInfo> group_;
  int rank_ = 0;
  OpDesc op_{};
  WaitPolicy policy_{};
};

// Waits for every request in order (each with its own timeout).
void wait_all(std::span<Request> requests);

// A group of ranks.
//
// Contract of every collective (all_reduce ... barrier, split): every rank of the group calls it,
// in the same order as the other collectives of this group, with the same count, datatype, op
// and root (reduce_scatter_v / all_gather_v: the same `counts`). Point-to-point calls pair one
// send with one recv of the same count, datatype and tag; messages between two ranks with one tag
// arrive in the order sent. `send` may block until the peer posts the matching recv (as MPI_Send
// may); use isend/irecv when both sides send first. A rank cannot send to itself.
//
// Blocking calls are the non-blocking ones followed by wait(), so every one of them has the
// timeout of wait_policy(). Buffers are host memory; counts are elements. A communicator is used
// by one thread at a time. Bad arguments throw InvalidArgument (before anything is posted); a
// failed or timed-out operation throws CommError, after which the group is unusable: end the job
// with abort_job (runtime.h).
class Communicator {
 public:
  static constexpr int kNoColor = -1;  // split(): this rank joins no new group

  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(group_->global_ranks.size()); }
  const std::string& name() const { return group_->name; }
  const GroupInfo& group() const { return *group_; }
  int global_rank() const { return group_->global_ranks[static_cast<std::size_t>(rank_)]; }

  // The training iteration named in error messages; set it at the top of every step.
  void set_step(std::int64_t step);
  std::int64_t step() const { return step_; }
  void set_wait_policy(const WaitPolicy& policy);
  void set_timeout(double seconds);
  const WaitPolicy& wait_policy() const { return policy_; }

  // buf (count) is reduced over the group in place: buf = op over ranks of buf.
  void all_reduce(void* buf, std::int64_t count, Datatype dtype, ReduceOp op);
  Request iall_reduce(void* buf, std::int64_t count, Datatype dtype, ReduceOp op);

  // in (size() * count) holds one block of `count` elements per rank; rank r receives in `out`
  // (count) the reduction over ranks of block r. `out` may be exactly this rank's block of `in`
  // (in + rank() * count, the in-place ZeRO pattern); other overlap is rejected. `in` is left
  // unchanged except where `out` aliases it.
  void reduce_scatter(const void* in, void* out, std::int64_t count, Datatype dtype, ReduceOp op);
  Request ireduce_scatter(const void* in, void* out, std::int64_t count, Datatype dtype,
                          ReduceOp op);
  // Uneven blocks: in (sum(counts)) holds block r of counts[r] elements at offset
  // sum(counts[0..r)); rank r receives its reduced block in out (counts[r]). Same aliasing rule.
  void reduce_scatter_v(const void* in, void* out, std::span<const std::int64_t> counts,
                        Datatype dtype, ReduceOp op);
  Request ireduce_scatter_v(const void* in, void* out, std::span<const std::int64_t> counts,
                            Datatype dtype, ReduceOp op);

  // in (count) from every rank is gathered into out (size() * count), block r from rank r. `in`
  // may be this rank's block of `out` (out + rank() * count, in place).
  void all_gather(const void* in, void* out, std::int64_t count, Datatype dtype);
  Request iall_gather(const void* in, void* out, std::int64_t count, Datatype dtype);
  // Uneven blocks: rank r contributes counts[r] elements; out (sum(counts)) holds them in rank
  // order. `in` may be this rank's block of `out`.
  void all_gather_v(const void* in, void* out, std::span<const std::int64_t> counts,
                    Datatype dtype);
  Request iall_gather_v(const void* in, void* out, std::span<const std::int64_t> counts,
                        Datatype dtype);

  // Personalised exchange (MPI_Alltoallv with packed blocks): in (sum(send_counts)) holds, in rank
  // order, the block of send_counts[r] elements for rank r; out (sum(recv_counts)) receives, in
  // rank order, the block of recv_counts[r] elements from rank r. The counts must pair up over the
  // group (rank a's send_counts[b] is rank b's recv_counts[a]): exchange them first (an all_gather
  // of the send counts) when they are data-dependent. in and out must not overlap.
  void all_to_all_v(const void* in, std::span<const std::int64_t> send_counts, void* out,
                    std::span<const std::int64_t> recv_counts, Datatype dtype);
  Request iall_to_all_v(const void* in, std::span<const std::int64_t> send_counts, void* out,
                        std::span<const std::int64_t> recv_counts, Datatype dtype);

  // buf (count) of group rank `root` is copied to every rank's buf.
  void broadcast(void* buf, std::int64_t count, Datatype dtype, int root);
  Request ibroadcast(void* buf, std::int64_t count, Datatype dtype, int root);

  // Point-to-point with group rank `peer`; tag in [0, 32767].
  void send(const void* buf, std::int64_t count, Datatype dtype, int peer, int tag = 0);
  void recv(void* buf, std::int64_t count, Datatype dtype, int peer, int tag = 0);
  Request isend(const void* buf, std::int64_t count, Datatype dtype, int peer, int tag = 0);
  Request irecv(void* buf, std::int64_t count, Datatype dtype, int peer, int tag = 0);

  void barrier();

  // True where operations progress without being polled (NCCL: on the device), so test() between
  // layers is useless; false for MPI, which progresses only inside its calls.
  virtual bool progresses_itself() const { return false; }

  // Collective: ranks with the same color form a new group named `name`, ordered by (key, rank).
  // Returns nullptr on ranks that pass kNoColor. The new group inherits step and wait policy.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& new_name);

  // --- Typed conveniences: counts come from the spans, the datatype from T. ---
  template <class T>
  void all_reduce(std::span<T> buf, ReduceOp op) {
    all_reduce(buf.data(), ssize(buf), datatype_of<T>(), op);
  }
  template <class T>
  Request iall_reduce(std::span<T> buf, ReduceOp op) {
    return iall_reduce(buf.data(), ssize(buf), datatype_of<T>(), op);
  }
  // in.size() must be size() * out.size().
  template <class In, class T>
  void reduce_scatter(std::span<In> in, std::span<T> out, ReduceOp op) {
    static_assert(std::is_same_v<std::remove_const_t<In>, T>, "in and out element types differ");
    check_blocks(ssize(in), ssize(out), "reduce_scatter");
    reduce_scatter(in.data(), out.data(), ssize(out), datatype_of<T>(), op);
  }
  // out.size() must be size() * in.size().
  template <class In, class T>
  void all_gather(std::span<In> in, std::span<T> out) {
    static_assert(std::is_same_v<std::remove_const_t<In>, T>, "in and out element types differ");
    check_blocks(ssize(out), ssize(in), "all_gather");
    all_gather(in.data(), out.data(), ssize(in), datatype_of<T>());
  }
  template <class T>
  void broadcast(std::span<T> buf, int root) {
    broadcast(buf.data(), ssize(buf), datatype_of<T>(), root);
  }
  template <class T>
  void send(std::span<T> buf, int peer, int tag = 0) {
    send(buf.data(), ssize(buf), datatype_of<std::remove_const_t<T>>(), peer, tag);
  }
  template <class T>
  void recv(std::span<T> buf, int peer, int tag = 0) {
    recv(buf.data(), ssize(buf), datatype_of<T>(), peer, tag);
  }

  // --- TensorView conveniences (the views' dtypes must agree). ---
  void all_reduce(core::TensorView buf, ReduceOp op);
  Request iall_reduce(core::TensorView buf, ReduceOp op);
  void reduce_scatter(core::TensorView in, core::TensorView out, ReduceOp op);
  Request ireduce_scatter(core::TensorView in, core::TensorView out, ReduceOp op);
  void all_gather(core::TensorView in, core::TensorView out);
  Request iall_gather(core::TensorView in, core::TensorView out);
  void broadcast(core::TensorView buf, int root);
  void send(core::TensorView buf, int peer, int tag = 0);
  void recv(core::TensorView buf, int peer, int tag = 0);
  Request isend(core::TensorView buf, int peer, int tag = 0);
  Request irecv(core::TensorView buf, int peer, int tag = 0);

 protected:
  Communicator(GroupInfo group, int rank, const WaitPolicy& policy);

  // What implementations provide: post the operation and return its pending request (nullptr
  // when already complete). Arguments are checked before these are called; counts are >= 0,
  // buffers are non-null when their count is > 0, peers and roots are valid, reductions are on
  // reducible types, and `out` aliases `in` only in the documented way.
  using ImplPtr = std::unique_ptr<detail::RequestImpl>;
  virtual ImplPtr post_all_reduce(void* buf, std::int64_t count, Datatype dtype, ReduceOp op) = 0;
  virtual ImplPtr post_reduce_scatter(const void* in, void* out, std::int64_t count, Datatype dtype,
                                      ReduceOp op) = 0;
  virtual ImplPtr post_reduce_scatter_v(const void* in, void* out,
                                        std::span<const std::int64_t> counts, Datatype dtype,
                                        ReduceOp op) = 0;
  virtual ImplPtr post_all_gather(const void* in, void* out, std::int64_t count,
                                  Datatype dtype) = 0;
  virtual ImplPtr post_all_gather_v(const void* in, void* out, std::span<const std::int64_t> counts,
                                    Datatype dtype) = 0;
  virtual ImplPtr post_all_to_all_v(const void* in, std::span<const std::int64_t> send_counts,
                                    void* out, std::span<const std::int64_t> recv_counts,
                                    Datatype dtype) = 0;
  virtual ImplPtr post_broadcast(void* buf, std::int64_t count, Datatype dtype, int root) = 0;
  virtual ImplPtr post_send(const void* buf, std::int64_t count, Datatype dtype, int peer,
                            int tag) = 0;
  virtual ImplPtr post_recv(void* buf, std::int64_t count, Datatype dtype, int peer, int tag) = 0;
  virtual ImplPtr post_barrier() = 0;
  // Blocking; implementations wait through wait_for() so the split has the timeout too.
  virtual std::unique_ptr<Communicator> do_split(int color, int key,
                                                 const std::string& new_name) = 0;

  // Waits for `impl` under this communicator's policy, with `op` in any error message.
  void wait_for(ImplPtr impl, const OpDesc& op);
  OpDesc desc(OpKind kind, std::int64_t count = 0, Datatype dtype = Datatype::kU8,
              ReduceOp op = ReduceOp::kSum, int peer = -1, int tag = 0) const;
  std::shared_ptr<const GroupInfo> group_ptr() const { return group_; }

 private:
  Request make_request(ImplPtr impl, const OpDesc& op);
  template <class Post>
  Request start(const OpDesc& op, Post&& post);
  void check_blocks(std::int64_t big, std::int64_t small, const char* what) const;
  template <class T>
  static std::int64_t ssize(std::span<T> s) {
    return static_cast<std::int64_t>(s.size());
  }

  std::shared_ptr<const GroupInfo> group_;
  int rank_ = 0;
  std::int64_t step_ = -1;
  WaitPolicy policy_{};
  std::shared_ptr<detail::GroupProgress> progress_;  // sequence numbers for hang reports
};

}  // namespace trident::comm
