// NcclCommunicator and HostStagedCommunicator: see nccl_communicator.h. Compiled in CUDA builds.
#include "trident/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "trident/comm/runtime.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident::comm {

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw core::CommError(
        core::str(what, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  }
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    throw core::CommError(core::str(what, " failed: ", ncclGetErrorString(r)));
  }
}

// NCCL's type for a datatype, and how many NCCL elements one element is (kU16 moves as bytes).
struct NcclType {
  ncclDataType_t type;
  std::int64_t scale;
};

NcclType nccl_type(Datatype t, bool reduction) {
  switch (t) {
    case Datatype::kF32:
      return {ncclFloat32, 1};
    case Datatype::kF64:
      return {ncclFloat64, 1};
    case Datatype::kBF16:
      return {ncclBfloat16, 1};
    case Datatype::kF16:
      return {ncclFloat16, 1};
    case Datatype::kI32:
      return {ncclInt32, 1};
    case Datatype::kI64:
      return {ncclInt64, 1};
    case Datatype::kU8:
      return {ncclUint8, 1};
    case Datatype::kU16:
      if (reduction) {
        throw core::InvalidArgument("NCCL has no 16-bit unsigned reductions; use i32");
      }
      return {ncclUint8, 2};
  }
  throw core::InternalError("nccl_type: unknown datatype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  throw core::InternalError("nccl_op: unknown reduction");
}

const char* at(const void* p, std::int64_t elems, Datatype t) {
  return static_cast<const char*>(p) + elems * size_of(t);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// NcclCommunicator

// The event recorded on the communication stream after an operation (or a batch), shared by its
// requests and, once a wait is ordered on the device, by the watchdog.
struct Completion {
  cudaEvent_t ev = nullptr;
  Completion() {
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~Completion() {
    if (ev) cudaEventDestroy(ev);
  }
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
};

// A point-to-point operation waiting to be posted with the others of its batch.
struct P2pOp {
  bool send;
  void* buf;
  std::size_t count;
  ncclDataType_t type;
  int peer;
};

// Sends and receives posted between two waits go to NCCL together, in one ncclGroupStart/End:
// NCCL blocks a send until the peer has posted the matching receive, so two neighbours that each
// post a send before their receive (a 1F1B pipeline's steady state) deadlock unless the operations
// are grouped (Megatron's batch_isend_irecv). A batch is posted when one of its requests is first
// tested, or before any other operation of the communicator.
struct P2pBatch {
  std::vector<P2pOp> ops;
  std::shared_ptr<Completion> done;  // recorded on the communication stream after the group
  bool posted = false;
};

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  int device = 0;
  void* compute_stream = nullptr;  // where waits are ordered (null: the legacy default stream)
  std::atomic<bool> aborted{false};
  std::shared_ptr<P2pBatch> open;  // the batch collecting sends and receives, or null
  // Posts the open batch (set by the communicator: it knows the streams).
  std::function<void()> flush;
  // Set by the watchdog when it aborts the communicator: the operation that timed out.
  std::mutex mu;
  std::string error;
  std::atomic<bool> error_seen{false};  // thrown to the caller (who will end the job)
  State(ncclComm_t c, int dev) : comm(c), device(dev) {}
  ~State() {
    if (comm != nullptr && !aborted.load()) ncclCommDestroy(comm);
  }
  // The watchdog's action: stops this rank's operations on the communicator (ncclCommAbort frees
  // the local rank only; the peers' own watchdogs, or abort_job, end theirs).
  void abort() noexcept {
    if (!aborted.exchange(true) && comm != nullptr) ncclCommAbort(comm);
  }
  void abort_with(const std::string& why) {
    {
      const std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = why;
    }
    abort();
  }
  // Throws the CommError an aborted communicator gives every later call.
  void throw_if_aborted() {
    if (!aborted.load()) return;
    std::string why;
    {
      const std::lock_guard<std::mutex> lock(mu);
      why = error;
    }
    error_seen = true;
    if (why.empty()) {
      throw core::CommError("the NCCL communicator was aborted (an earlier operation timed out)");
    }
    throw core::CommError(core::str("the NCCL communicator was aborted by its watchdog: ", why));
  }
};

namespace {

// The watchdog of the waits ordered on the device: one thread per process polls the operations'
// events; an operation still pending at its deadline aborts its communicator (so the stream that
// waits for it, and the host behind that, go on) and leaves its CommError for the communicator's
// next call. If nobody has seen that error kGraceS later (the host is stuck elsewhere), the
// watchdog ends the job itself, as PyTorch's NCCL watchdog does.
class Watchdog {
 public:
  static constexpr double kGraceS = 10.0;
  using Clock = std::chrono::steady_clock;

  static Watchdog& get() {
    static Watchdog w;
    return w;
  }

  // Drops the entries of a communicator being destroyed (its stream has been synchronized).
  void forget(const NcclCommunicator::State* state) {
    const std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(entries_, [&](const Entry& e) { return e.state.get() == state; });
  }

  void watch(std::shared_ptr<Completion> done, std::shared_ptr<NcclCommunicator::State> state,
             double timeout_s, std::function<std::string()> describe) {
    const std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back({std::move(done), std::move(state),
                        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s)),
                        timeout_s, std::move(describe)});
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    cv_.notify_one();
  }

  ~Watchdog() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      entries_.clear();
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Entry {
    std::shared_ptr<Completion> done;
    std::shared_ptr<NcclCommunicator::State> state;
    Clock::time_point deadline;
    double timeout_s;
    std::function<std::string()> describe;
  };
  struct Fired {
    std::shared_ptr<NcclCommunicator::State> state;
    Clock::time_point at;
    std::string what;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<Fired> fired;
    while (!stop_) {
      if (entries_.empty() && fired.empty()) {
        cv_.wait(lock, [&] { return stop_ || !entries_.empty(); });
        continue;
      }
      const Clock::time_point now = Clock::now();
      for (auto it = entries_.begin(); it != entries_.end();) {
        Entry& e = *it;
        if (e.state->aborted.load()) {  // aborted by another operation's timeout
          it = entries_.erase(it);
          continue;
        }
        cudaSetDevice(e.state->device);
        const cudaError_t q = cudaEventQuery(e.done->ev);
        if (q == cudaSuccess) {
          it = entries_.erase(it);
          continue;
        }
        if (q != cudaErrorNotReady) cudaGetLastError();
        if (now >= e.deadline || q != cudaErrorNotReady) {
          std::string what =
              q == cudaErrorNotReady
                  ? core::str("comm: ", e.describe(), " timed out after ", e.timeout_s,
                              " s (--comm-timeout): a rank of the group has not joined (it is "
                              "slower, stuck in another operation, or dead); the wait was "
                              "ordered on the device, so the NCCL watchdog aborted the "
                              "communicator")
                  : core::str("comm: ", e.describe(),
                              " failed on the device: ", cudaGetErrorName(q));
          log::error(what);
          e.state->abort_with(what);
          fired.push_back({e.state, now, std::move(what)});
          it = entries_.erase(it);
          continue;
        }
        ++it;
      }
      for (const Fired& f : fired) {
        if (!f.state->error_seen.load() &&
            std::chrono::duration<double>(now - f.at).count() >= kGraceS) {
          lock.unlock();
          abort_job(1, core::str(f.what,
                                 " (the job is ended by the watchdog: the host did not "
                                 "reach another operation of the communicator)"));
        }
      }
      std::erase_if(fired, [](const Fired& f) { return f.state->error_seen.load(); });
      cv_.wait_for(lock, std::chrono::milliseconds(2), [&] { return stop_; });
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::list<Entry> entries_;
  bool stop_ = false;
  std::thread thread_;
};

class NcclRequest final : public detail::RequestImpl {
 public:
  // An operation already posted, complete when `done` is reached.
  NcclRequest(std::shared_ptr<Completion> done, std::shared_ptr<NcclCommunicator::State> state)
      : done_(std::move(done)), state_(std::move(state)) {}
  // A send or receive of a batch that is posted when first tested.
  NcclRequest(std::shared_ptr<P2pBatch> batch, std::shared_ptr<NcclCommunicator::State> state)
      : batch_(std::move(batch)), state_(std::move(state)) {}
  bool test() override;
  void abandon() noexcept override;
  bool order_on_device(const GroupInfo& group, int rank, const OpDesc& op,
                       const WaitPolicy& policy) override;

 private:
  const std::shared_ptr<Completion>& done() {
    if (batch_ && !batch_->posted) state_->flush();
    return batch_ ? batch_->done : done_;
  }

  std::shared_ptr<Completion> done_;
  std::shared_ptr<P2pBatch> batch_;
  std::shared_ptr<NcclCommunicator::State> state_;
};

}  // namespace

bool NcclRequest::test() {
  state_->throw_if_aborted();
  const cudaError_t e = cudaEventQuery(done()->ev);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) check_cuda(e, "the NCCL operation's stream");
  ncclResult_t async = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(state_->comm, &async), "ncclCommGetAsyncError");
  if (async != ncclSuccess && async != ncclInProgress) {
    throw core::CommError(
        core::str("NCCL reported an asynchronous error: ", ncclGetErrorString(async)));
  }
  return false;
}

void NcclRequest::abandon() noexcept { state_->abort(); }

bool NcclRequest::order_on_device(const GroupInfo& group, int rank, const OpDesc& op,
                                  const WaitPolicy& policy) {
  // A barrier is a promise to the host (every rank has reached it): the host waits for it.
  if (op.kind == OpKind::kBarrier) return false;
  state_->throw_if_aborted();
  std::shared_ptr<Completion> d = done();
  check_cuda(cudaSetDevice(state_->device), "cudaSetDevice");
  const cudaStream_t compute = state_->compute_stream != nullptr
                                   ? static_cast<cudaStream_t>(state_->compute_stream)
                                   : cudaStreamLegacy;
  check_cuda(cudaStreamWaitEvent(compute, d->ev, 0), "cudaStreamWaitEvent");
  Watchdog::get().watch(std::move(d), state_, policy.timeout_s,
                        [g = group, rank, op] { return describe(g, rank, op); });
  return true;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(std::unique_ptr<Communicator> host,
                                                           int device) {
  TRIDENT_CHECK(host != nullptr, "NcclCommunicator::create: host communicator is null");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id{};
  if (host->rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  host->broadcast(&id, static_cast<std::int64_t>(sizeof(id)), Datatype::kU8, 0);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, host->size(), id, host->rank());
  if (r != ncclSuccess) {
    throw core::CommError(core::str("NCCL could not start on group '", host->name(), "' (",
                                    host->size(), " ranks, this rank ", host->rank(), " on GPU ",
                                    device, "): ", ncclGetErrorString(r),
                                    "; ranks that share a GPU need the host-staged communicator"));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(host), std::make_shared<State>(comm, device), device));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> host, std::shared_ptr<State> state,
                                   int device)
    : Communicator(host->group(), host->rank(), host->wait_policy()),
      host_(std::move(host)),
      state_(std::move(state)),
      device_(device) {
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  comm_stream_ = s;
  check_cuda(cudaMalloc(&barrier_buf_, sizeof(float)), "cudaMalloc");
  state_->flush = [this] { flush_p2p(); };
}

void NcclCommunicator::flush_p2p() {
  std::shared_ptr<P2pBatch> batch = std::move(state_->open);
  if (!batch || batch->posted) return;
  batch->posted = true;
  before_op();
  const auto stream = static_cast<cudaStream_t>(comm_stream_);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (const P2pOp& op : batch->ops) {
    if (op.send) {
      check_nccl(ncclSend(op.buf, op.count, op.type, op.peer, state_->comm, stream), "ncclSend");
    } else {
      check_nccl(ncclRecv(op.buf, op.count, op.type, op.peer, state_->comm, stream), "ncclRecv");
    }
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  batch->done = std::make_shared<Completion>();
  check_cuda(cudaEventRecord(batch->done->ev, stream), "cudaEventRecord");
}

NcclCommunicator::~NcclCommunicator() {
  if (!state_->aborted.load()) {
    try {
      flush_p2p();
    } catch (const std::exception&) {
    }
  }
  state_->flush = [] {};
  if (comm_stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(comm_stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(comm_stream_));
  }
  Watchdog::get().forget(state_.get());
  if (barrier_buf_) cudaFree(barrier_buf_);
}

void NcclCommunicator::set_compute_stream(void* stream) {
  compute_stream_ = stream;
  state_->compute_stream = stream;
}

void NcclCommunicator::before_op() {
  state_->throw_if_aborted();
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  // After the work queued on the compute stream; a null compute stream is the kernels' null
  // stream, i.e. the legacy default stream, which the non-blocking communication stream would not
  // otherwise wait for.
  const cudaStream_t compute =
      compute_stream_ != nullptr ? static_cast<cudaStream_t>(compute_stream_) : cudaStreamLegacy;
  cudaEvent_t ev = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventRecord(ev, compute), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(comm_stream_), ev, 0),
             "cudaStreamWaitEvent");
  cudaEventDestroy(ev);  // released once the wait is satisfied
}

Communicator::ImplPtr NcclCommunicator::after_op(const char* what) {
  (void)what;
  auto done = std::make_shared<Completion>();
  check_cuda(cudaEventRecord(done->ev, static_cast<cudaStream_t>(comm_stream_)), "cudaEventRecord");
  return std::make_unique<NcclRequest>(std::move(done), state_);
}

Communicator::ImplPtr NcclCommunicator::post_all_reduce(void* buf, std::int64_t count,
                                                        Datatype dtype, ReduceOp op) {
  flush_p2p();
  before_op();
  const NcclType t = nccl_type(dtype, true);
  check_nccl(ncclAllReduce(buf, buf, static_cast<size_t>(count), t.type, nccl_op(op), state_->comm,
                           static_cast<cudaStream_t>(comm_stream_)),
             "ncclAllReduce");
  return after_op("all_reduce");
}

Communicator::ImplPtr NcclCommunicator::post_reduce_scatter(const void* in, void* out,
                                                            std::int64_t count, Datatype dtype,
                                                            ReduceOp op) {
  flush_p2p();
  before_op();
  const NcclType t = nccl_type(dtype, true);
  check_nccl(ncclReduceScatter(in, out, static_cast<size_t>(count), t.type, nccl_op(op),
                               state_->comm, static_cast<cudaStream_t>(comm_stream_)),
             "ncclReduceScatter");
  return after_op("reduce_scatter");
}

Communicator::ImplPtr NcclCommunicator::post_reduce_scatter_v(const void* in, void* out,
                                                              std::span<const std::int64_t> counts,
                                                              Datatype dtype, ReduceOp op) {
  flush_p2p();
  before_op();
  const NcclType t = nccl_type(dtype, true);
  // One reduce per block, rooted at the block's owner, fused into one NCCL group.
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  std::int64_t offset = 0;
  for (int r = 0; r < size(); ++r) {
    const std::int64_t c = counts[static_cast<std::size_t>(r)];
    const void* src = at(in, offset, dtype);
    void* dst = r == rank() ? out : const_cast<void*>(src);  // recvbuff is used at the root only
    check_nccl(ncclReduce(src, dst, static_cast<size_t>(c), t.type, nccl_op(op), r, state_->comm,
                          static_cast<cudaStream_t>(comm_stream_)),
               "ncclReduce");
    offset += c;
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  return after_op("reduce_scatter_v");
}

Communicator::ImplPtr NcclCommunicator::post_all_gather(const void* in, void* out,
                                                        std::int64_t count, Datatype dtype) {
  flush_p2p();
  before_op();
  const NcclType t = nccl_type(dtype, false);
  check_nccl(ncclAllGather(in, out, static_cast<size_t>(count * t.scale), t.type, state_->comm,
                           static_cast<cudaStream_t>(comm_stream_)),
             "ncclAllGather");
  return after_op("all_gather");
}

Communicator::ImplPtr NcclCommunicator::post_all_gather_v(const void* in, void* out,
                                                          std::span<const std::int64_t> counts,
                                                          Datatype dtype) {
  flush_p2p();
  before_op();
  const NcclType t = nccl_type(dtype, false);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  std::int64_t offset = 0;
  for (int r = 0; r < size(); ++r) {
    const std::int64_t c = counts[static_cast<std::size_t>(r)];
    void* dst = const_cast<char*>(at(out, offset, dtype));
    check_nccl(ncclBroadcast(r == rank() ? in : dst, dst, static_cast<size_t>(c * t.scale), t.type,
                             r, state_->comm, static_cast<cudaStream_t>(comm_stream_)),
               "ncclBroadcast");
    offset += c;
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  return after_op("all_gather_v");
}

Communicator::ImplPtr NcclCommunicator::post_all_to_all_v(const void* in,
                                                          std::span<const std::int64_t> send_counts,
                                                          void* out,
                                                          std::span<const std::int64_t> recv_counts,
                                                          Datatype dtype) {
  flush_p2p();
  before_op();
  const NcclType t = nccl_type(dtype, false);
  const auto stream = static_cast<cudaStream_t>(comm_stream_);
  std::int64_t sent = 0, received = 0;
  std::vector<std::int64_t> send_at, recv_at;
  for (int r = 0; r < size(); ++r) {
    send_at.push_back(sent);
    recv_at.push_back(received);
    sent += send_counts[static_cast<std::size_t>(r)];
    received += recv_counts[static_cast<std::size_t>(r)];
  }
  // This rank's own block is a copy on the communication stream; the others are one NCCL group of
  // sends and receives (empty blocks skipped on both sides: the counts pair up).
  const auto me = static_cast<std::size_t>(rank());
  if (send_counts[me] > 0) {
    check_cuda(
        cudaMemcpyAsync(const_cast<char*>(at(out, recv_at[me], dtype)), at(in, send_at[me], dtype),
                        static_cast<size_t>(send_counts[me] * size_of(dtype)),
                        cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync (all_to_all_v)");
  }
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < size(); ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (i == me) continue;
    if (send_counts[i] > 0) {
      check_nccl(ncclSend(at(in, send_at[i], dtype), static_cast<size_t>(send_counts[i] * t.scale),
                          t.type, r, state_->comm, stream),
                 "ncclSend");
    }
    if (recv_counts[i] > 0) {
      check_nccl(
          ncclRecv(const_cast<char*>(at(out, recv_at[i], dtype)),
                   static_cast<size_t>(recv_counts[i] * t.scale), t.type, r, state_->comm, stream),
          "ncclRecv");
    }
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  return after_op("all_to_all_v");
}

Communicator::ImplPtr NcclCommunicator::post_broadcast(void* buf, std::int64_t count,
                                                       Datatype dtype, int root) {
  flush_p2p();
  before_op();
  const NcclType t = nccl_type(dtype, false);
  check_nccl(ncclBroadcast(buf, buf, static_cast<size_t>(count * t.scale), t.type, root,
                           state_->comm, static_cast<cudaStream_t>(comm_stream_)),
             "ncclBroadcast");
  return after_op("broadcast");
}

Communicator::ImplPtr NcclCommunicator::post_send(const void* buf, std::int64_t count,
                                                  Datatype dtype, int peer, int /*tag*/) {
  return post_p2p(true, const_cast<void*>(buf), count, dtype, peer);
}

Communicator::ImplPtr NcclCommunicator::post_recv(void* buf, std::int64_t count, Datatype dtype,
                                                  int peer, int /*tag*/) {
  return post_p2p(false, buf, count, dtype, peer);
}

Communicator::ImplPtr NcclCommunicator::post_p2p(bool send, void* buf, std::int64_t count,
                                                 Datatype dtype, int peer) {
  state_->throw_if_aborted();
  const NcclType t = nccl_type(dtype, false);
  if (!state_->open) state_->open = std::make_shared<P2pBatch>();
  state_->open->ops.push_back({send, buf, static_cast<std::size_t>(count * t.scale), t.type, peer});
  return std::make_unique<NcclRequest>(state_->open, state_);
}

Communicator::ImplPtr NcclCommunicator::post_barrier() {
  flush_p2p();
  before_op();
  check_nccl(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, state_->comm,
                           static_cast<cudaStream_t>(comm_stream_)),
             "ncclAllReduce (barrier)");
  return after_op("barrier");
}

std::unique_ptr<Communicator> NcclCommunicator::do_split(int color, int key,
                                                         const std::string& new_name) {
  flush_p2p();
  host_->set_step(step());
  std::unique_ptr<Communicator> host_child = host_->split(color, key, new_name);
  ncclComm_t child = nullptr;
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  check_nccl(ncclCommSplit(state_->comm, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key,
                           &child, nullptr),
             "ncclCommSplit");
  if (host_child == nullptr) return nullptr;
  auto c = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      std::move(host_child), std::make_shared<State>(child, device_), device_));
  c->set_compute_stream(compute_stream_);  // the child orders after the same compute stream
  return c;
}

// ---------------------------------------------------------------------------------------------
// HostStagedCommunicator

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> host)
    : Communicator(host->group(), host->rank(), host->wait_policy()), host_(std::move(host)) {}

HostStagedCommunicator::~HostStagedCommunicator() {
  if (staging_) cudaFreeHost(staging_);
}

void* HostStagedCommunicator::staging(std::int64_t bytes) {
  if (bytes > staging_bytes_) {
    if (staging_) cudaFreeHost(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    check_cuda(cudaHostAlloc(&staging_, static_cast<size_t>(bytes), cudaHostAllocDefault),
               "cudaHostAlloc (host-staged communicator)");
    staging_bytes_ = bytes;
  }
  return staging_;
}

void HostStagedCommunicator::sync_host_step() {
  host_->set_step(step());
  host_->set_wait_policy(wait_policy());
  // Device work of every stream must be done before its buffers are read.
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

namespace {
void d2h(void* dst, const void* src, std::int64_t bytes) {
  if (bytes > 0)
    check_cuda(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
               "cudaMemcpy D2H");
}
void h2d(void* dst, const void* src, std::int64_t bytes) {
  if (bytes > 0)
    check_cuda(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
               "cudaMemcpy H2D");
}
std::int64_t total(std::span<const std::int64_t> counts) {
  std::int64_t s = 0;
  for (std::int64_t c : counts) s += c;
  return s;
}
}  // namespace

Communicator::ImplPtr HostStagedCommunicator::post_all_reduce(void* buf, std::int64_t count,
                                                              Datatype dtype, ReduceOp op) {
  sync_host_step();
  const std::int64_t bytes = count * size_of(dtype);
  void* h = staging(bytes);
  d2h(h, buf, bytes);
  host_->all_reduce(h, count, dtype, op);
  h2d(buf, h, bytes);
  return nullptr;
}

Communicator::ImplPtr HostStagedCommunicator::post_reduce_scatter(const void* in, void* out,
                                                                  std::int64_t count,
                                                                  Datatype dtype, ReduceOp op) {
  sync_host_step();
  const std::int64_t bytes = count * size_of(dtype) * size();
  char* h = static_cast<char*>(staging(bytes));
  d2h(h, in, bytes);
  char* mine = h + rank() * count * size_of(dtype);  // the in-place pattern on the host
  host_->reduce_scatter(h, mine, count, dtype, op);
  h2d(out, mine, count * size_of(dtype));
  return nullptr;
}

Communicator::ImplPtr HostStagedCommunicator::post_reduce_scatter_v(
    const void* in, void* out, std::span<const std::int64_t> counts, Datatype dtype, ReduceOp op) {
  sync_host_step();
  const std::int64_t bytes = total(counts) * size_of(dtype);
  char* h = static_cast<char*>(staging(bytes));
  d2h(h, in, bytes);
  std::int64_t offset = 0;
  for (int r = 0; r < rank(); ++r) offset += counts[static_cast<std::size_t>(r)];
  char* mine = h + offset * size_of(dtype);
  host_->reduce_scatter_v(h, mine, counts, dtype, op);
  h2d(out, mine, counts[static_cast<std::size_t>(rank())] * size_of(dtype));
  return nullptr;
}

Communicator::ImplPtr HostStagedCommunicator::post_all_gather(const void* in, void* out,
                                                              std::int64_t count, Datatype dtype) {
  sync_host_step();
  const std::int64_t block = count * size_of(dtype);
  char* h = static_cast<char*>(staging(block * size()));
  char* mine = h + rank() * block;
  d2h(mine, in, block);
  host_->all_gather(mine, h, count, dtype);
  h2d(out, h, block * size());
  return nullptr;
}

Communicator::ImplPtr HostStagedCommunicator::post_all_gather_v(
    const void* in, void* out, std::span<const std::int64_t> counts, Datatype dtype) {
  sync_host_step();
  const std::int64_t bytes = total(counts) * size_of(dtype);
  char* h = static_cast<char*>(staging(bytes));
  std::int64_t offset = 0;
  for (int r = 0; r < rank(); ++r) offset += counts[static_cast<std::size_t>(r)];
  char* mine = h + offset * size_of(dtype);
  d2h(mine, in, counts[static_cast<std::size_t>(rank())] * size_of(dtype));
  host_->all_gather_v(mine, h, counts, dtype);
  h2d(out, h, bytes);
  return nullptr;
}

Communicator::ImplPtr HostStagedCommunicator::post_all_to_all_v(
    const void* in, std::span<const std::int64_t> send_counts, void* out,
    std::span<const std::int64_t> recv_counts, Datatype dtype) {
  sync_host_step();
  const std::int64_t sent = total(send_counts) * size_of(dtype);
  const std::int64_t received = total(recv_counts) * size_of(dtype);
  char* h = static_cast<char*>(staging(sent + received));
  d2h(h, in, sent);
  host_->all_to_all_v(h, send_counts, h + sent, recv_counts, dtype);
  h2d(out, h + sent, received);
  return nullptr;
}

Communicator::ImplPtr HostStagedCommunicator::post_broadcast(void* buf, std::int64_t count,
                                                             Datatype dtype, int root) {
  sync_host_step();
  const std::int64_t bytes = count * size_of(dtype);
  void* h = staging(bytes);
  if (rank() == root) d2h(h, buf, bytes);
  host_->broadcast(h, count, dtype, root);
  if (rank() != root) h2d(buf, h, bytes);
  return nullptr;
}

namespace {

// A host-staged send or receive in flight: the host operation on a pinned buffer of its own; a
// receive copies the buffer to the device when the host operation completes. (A blocking host
// send or receive would deadlock two ranks that each post a receive before their send.)
class StagedP2pRequest final : public detail::RequestImpl {
 public:
  StagedP2pRequest(Request inner, void* pinned, void* device_dst, std::int64_t bytes)
      : inner_(std::move(inner)), pinned_(pinned), device_dst_(device_dst), bytes_(bytes) {}
  ~StagedP2pRequest() override {
    // A request dropped in flight: MPI may still write the buffer; keep it (a leak, not a crash).
    if (done_ && pinned_) cudaFreeHost(pinned_);
  }
  bool test() override {
    if (done_) return true;
    if (!inner_.test()) return false;
    if (device_dst_) h2d(device_dst_, pinned_, bytes_);
    done_ = true;
    return true;
  }

 private:
  Request inner_;
  void* pinned_;
  void* device_dst_;  // null for a send
  std::int64_t bytes_;
  bool done_ = false;
};

void* pinned_buffer(std::int64_t bytes) {
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, static_cast<size_t>(std::max<std::int64_t>(bytes, 1)),
                           cudaHostAllocDefault),
             "cudaHostAlloc (host-staged communicator)");
  return p;
}

}  // namespace

Communicator::ImplPtr HostStagedCommunicator::post_send(const void* buf, std::int64_t count,
                                                        Datatype dtype, int peer, int tag) {
  sync_host_step();
  const std::int64_t bytes = count * size_of(dtype);
  void* h = pinned_buffer(bytes);
  d2h(h, buf, bytes);
  return std::make_unique<StagedP2pRequest>(host_->isend(h, count, dtype, peer, tag), h, nullptr,
                                            bytes);
}

Communicator::ImplPtr HostStagedCommunicator::post_recv(void* buf, std::int64_t count,
                                                        Datatype dtype, int peer, int tag) {
  sync_host_step();
  const std::int64_t bytes = count * size_of(dtype);
  void* h = pinned_buffer(bytes);
  return std::make_unique<StagedP2pRequest>(host_->irecv(h, count, dtype, peer, tag), h, buf,
                                            bytes);
}

Communicator::ImplPtr HostStagedCommunicator::post_barrier() {
  sync_host_step();
  host_->barrier();
  return nullptr;
}

std::unique_ptr<Communicator> HostStagedCommunicator::do_split(int color, int key,
                                                               const std::string& new_name) {
  host_->set_step(step());
  std::unique_ptr<Communicator> child = host_->split(color, key, new_name);
  if (child == nullptr) return nullptr;
  return std::make_unique<HostStagedCommunicator>(std::move(child));
}

}  // namespace trident::comm
