// The Communicator front end: argument checks, blocking calls as post + wait, and the one wait
// loop (poll with backoff, timeout -> CommError with the operation's full context).
#include "trident/comm/communicator.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>

#include "trident/comm/hang_report.h"
#include "trident/core/log.h"
#include "trident/core/profile.h"

namespace trident::comm {

namespace {

constexpr int kMaxTag = 32767;  // the smallest MPI_TAG_UB the MPI standard allows
constexpr int kMaxListedRanks = 16;

std::string format_ranks(const std::vector<int>& ranks) {
  std::string s = "[";
  const std::size_t n = ranks.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (n > kMaxListedRanks && i == kMaxListedRanks - 1) {
      s += core::str(", ..., ", ranks.back(), "] (", n, " ranks)");
      return s;
    }
    s += core::str(i ? ", " : "", ranks[i]);
  }
  return s + "]";
}

bool overlaps(const void* a, std::int64_t a_bytes, const void* b, std::int64_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + static_cast<std::uintptr_t>(b_bytes) &&
         pb < pa + static_cast<std::uintptr_t>(a_bytes);
}

const void* offset_bytes(const void* p, std::int64_t bytes) {
  return static_cast<const std::byte*>(p) + bytes;
}

std::int64_t sum_of(std::span<const std::int64_t> counts, std::size_t end) {
  std::int64_t s = 0;
  for (std::size_t i = 0; i < end; ++i) s += counts[i];
  return s;
}

}  // namespace

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kReduceScatterV:
      return "reduce_scatter_v";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kAllGatherV:
      return "all_gather_v";
    case OpKind::kAllToAllV:
      return "all_to_all_v";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kSplit:
      return "split";
  }
  return "?";
}

std::string describe(const GroupInfo& group, int rank, const OpDesc& op) {
  std::string s = op_name(op.kind);
  switch (op.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV:
      s += core::str("(count=", op.count, ", ", datatype_name(op.dtype), ", ",
                     reduce_op_name(op.op), ")");
      break;
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
    case OpKind::kAllToAllV:
      s += core::str("(count=", op.count, ", ", datatype_name(op.dtype), ")");
      break;
    case OpKind::kBroadcast:
      s += core::str("(count=", op.count, ", ", datatype_name(op.dtype), ", root ", op.peer, ")");
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      s += core::str("(count=", op.count, ", ", datatype_name(op.dtype), ", tag ", op.tag, ") ",
                     op.kind == OpKind::kSend ? "to" : "from", " peer ", op.peer);
      if (op.peer >= 0 && op.peer < static_cast<int>(group.global_ranks.size())) {
        s += core::str(" (global ", group.global_ranks[static_cast<std::size_t>(op.peer)], ")");
      }
      break;
    case OpKind::kBarrier:
    case OpKind::kSplit:
      break;
  }
  const int global = rank >= 0 && rank < static_cast<int>(group.global_ranks.size())
                         ? group.global_ranks[static_cast<std::size_t>(rank)]
                         : -1;
  s += core::str(" on group '", group.name, "' (global ranks ", format_ranks(group.global_ranks),
                 "; this rank: ", rank, " = global ", global, ")");
  s += op.step >= 0 ? core::str(" at step ", op.step) : std::string(" before the first step");
  if (op.seq > 0) s += core::str(" (collective #", op.seq, " of the group)");
  return s;
}

// ---------------------------------------------------------------------------------------------
// Request

bool detail::RequestImpl::block_for(double seconds) {
  if (seconds <= 0) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
  return test();
}

Request::Request(std::unique_ptr<detail::RequestImpl> impl, std::shared_ptr<const GroupInfo> group,
                 int rank, const OpDesc& op, const WaitPolicy& policy)
    : impl_(std::move(impl)), group_(std::move(group)), rank_(rank), op_(op), policy_(policy) {}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    finish_on_destruction();
    impl_ = std::move(other.impl_);
    group_ = std::move(other.group_);
    rank_ = other.rank_;
    op_ = other.op_;
    policy_ = other.policy_;
  }
  return *this;
}

Request::~Request() { finish_on_destruction(); }

void Request::finish_on_destruction() noexcept {
  if (!impl_) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding from another error: do not wait up to the timeout again.
    log::warn("comm: abandoning pending ", describe(*group_, rank_, op_),
              " while an exception propagates");
    impl_->abandon();
    impl_.reset();
    return;
  }
  try {
    wait();
  } catch (const std::exception& e) {
    log::error("comm: pending request destroyed without wait(): ", e.what());
  }
}

void Request::throw_with_context(const std::exception& e) {
  const std::string msg = core::str("comm: ", describe(*group_, rank_, op_), " failed: ", e.what());
  impl_.reset();
  throw core::CommError(msg);
}

bool Request::test() {
  if (!impl_) return true;
  bool complete = false;
  try {
    complete = impl_->test();
  } catch (const core::CommError& e) {
    throw_with_context(e);
  }
  if (complete) impl_.reset();
  return complete;
}

void Request::wait() {
  if (!impl_) return;
  // The profile (core/profile.h) counts the time a rank spends waiting for an operation: for a
  // blocking call the whole collective, for a posted one what the overlap did not hide.
  const core::profile::Scope scope(core::profile::Kind::kComm, op_name(op_.kind), 0,
                                   static_cast<double>(op_.count * size_of(op_.dtype)));
  try {
    if (impl_->order_on_device(*group_, rank_, op_, policy_)) {
      impl_.reset();
      return;
    }
  } catch (const core::CommError& e) {
    throw_with_context(e);
  }
  detail::note_waiting(group_, rank_, op_);
  struct DoneWaiting {
    ~DoneWaiting() { detail::note_done_waiting(); }
  } done_waiting;
  if (test()) return;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  for (;;) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed >= policy_.timeout_s) {
      const std::string what = op_.kind == OpKind::kSend   ? "the peer has not posted the recv"
                               : op_.kind == OpKind::kRecv ? "the peer has not posted the send"
                                                           : "a rank of the group has not joined";
      std::string msg = core::str("comm: ", describe(*group_, rank_, op_), " timed out after ",
                                  policy_.timeout_s, " s (--comm-timeout): ", what,
                                  " (it is slower, stuck in another operation, or dead)");
      // Ask every rank where it is (side channel), before giving up on the operation.
      if (const std::string report = detail::on_timeout(*group_, rank_, op_); !report.empty()) {
        msg += "; hang report: " + report;
      }
      impl_->abandon();
      impl_.reset();
      throw core::CommError(msg);
    }
    bool complete = false;
    try {
      if (elapsed < policy_.spin_s) {
        complete = impl_->test();
      } else {
        double pause = 0.0;  // yield
        if (elapsed >= policy_.yield_s) {
          pause = std::clamp(elapsed / 32, 10e-6, policy_.max_sleep_s);
        }
        complete = impl_->block_for(std::min(pause, policy_.timeout_s - elapsed));
      }
    } catch (const core::CommError& e) {
      throw_with_context(e);
    }
    if (complete) {
      impl_.reset();
      return;
    }
  }
}

void wait_all(std::span<Request> requests) {
  for (Request& r : requests) r.wait();
}

// ---------------------------------------------------------------------------------------------
// Communicator

Communicator::Communicator(GroupInfo group, int rank, const WaitPolicy& policy)
    : group_(std::make_shared<const GroupInfo>(std::move(group))), rank_(rank) {
  TRIDENT_ASSERT(rank >= 0 && rank < size(), "communicator '", name(), "': rank ", rank,
                 " outside [0, ", size(), ")");
  set_wait_policy(policy);
  progress_ = detail::track_group(*group_);
}

void Communicator::set_step(std::int64_t step) {
  step_ = step;
  detail::note_step(step);
}

void Communicator::set_wait_policy(const WaitPolicy& policy) {
  TRIDENT_CHECK(policy.timeout_s > 0, "comm timeout must be > 0 s, got ", policy.timeout_s);
  TRIDENT_CHECK(policy.spin_s >= 0 && policy.yield_s >= 0 && policy.max_sleep_s > 0,
                "wait policy: spin_s and yield_s must be >= 0 and max_sleep_s > 0");
  policy_ = policy;
}

void Communicator::set_timeout(double seconds) {
  WaitPolicy p = policy_;
  p.timeout_s = seconds;
  set_wait_policy(p);
}

OpDesc Communicator::desc(OpKind kind, std::int64_t count, Datatype dtype, ReduceOp op, int peer,
                          int tag) const {
  return OpDesc{.kind = kind,
                .count = count,
                .dtype = dtype,
                .op = op,
                .peer = peer,
                .tag = tag,
                .step = step_};
}

// Posts through `post`, adding the operation's context to a CommError raised while posting
// (an MPI error, or the thread world aborted by a failed rank).
template <class Post>
Request Communicator::start(const OpDesc& posted, Post&& post) {
  OpDesc op = posted;
  detail::note_posted(progress_, rank_, op);
  ImplPtr impl;
  try {
    impl = post();
  } catch (const core::CommError& e) {
    throw core::CommError(core::str("comm: ", describe(*group_, rank_, op), " failed: ", e.what()));
  }
  return make_request(std::move(impl), op);
}

Request Communicator::make_request(ImplPtr impl, const OpDesc& op) {
  if (!impl) return Request();
  return Request(std::move(impl), group_, rank_, op, policy_);
}

void Communicator::wait_for(ImplPtr impl, const OpDesc& posted) {
  OpDesc op = posted;
  detail::note_posted(progress_, rank_, op);
  make_request(std::move(impl), op).wait();
}

void Communicator::check_blocks(std::int64_t big, std::int64_t small, const char* what) const {
  TRIDENT_CHECK(big == small * size(), what, " on group '", name(), "': the full buffer has ", big,
                " elements, expected size ", size(), " x block ", small, " = ", small * size());
}

namespace {

void check_buffer(const void* p, std::int64_t count, const char* what, const std::string& group) {
  TRIDENT_CHECK(count >= 0, what, " on group '", group, "': count must be >= 0, got ", count);
  TRIDENT_CHECK(p != nullptr || count == 0, what, " on group '", group, "': null buffer for ",
                count, " elements");
}

void check_reducible(Datatype dtype, const char* what, const std::string& group) {
  TRIDENT_CHECK(is_reducible(dtype), what, " on group '", group, "': cannot reduce ",
                datatype_name(dtype), " (reduce in f32 or f64: a ", datatype_name(dtype),
                " sum loses precision)");
}

void check_counts(std::span<const std::int64_t> counts, int size, const char* what,
                  const std::string& group) {
  TRIDENT_CHECK(static_cast<int>(counts.size()) == size, what, " on group '", group,
                "': expected one count per rank (", size, "), got ", counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) {
    TRIDENT_CHECK(counts[r] >= 0, what, " on group '", group, "': counts[", r,
                  "] must be >= 0, got ", counts[r]);
  }
}

// `part` (part_bytes) must not overlap `whole` unless it is exactly whole + own_offset_bytes.
void check_alias(const void* whole, std::int64_t whole_bytes, const void* part,
                 std::int64_t part_bytes, std::int64_t own_offset_bytes, const char* what,
                 const std::string& group) {
  if (!overlaps(whole, whole_bytes, part, part_bytes)) return;
  TRIDENT_CHECK(part == offset_bytes(whole, own_offset_bytes), what, " on group '", group,
                "': the buffers overlap; only the in-place form (this rank's own block) is "
                "allowed");
}

}  // namespace

Request Communicator::iall_reduce(void* buf, std::int64_t count, Datatype dtype, ReduceOp op) {
  check_buffer(buf, count, "all_reduce", name());
  check_reducible(dtype, "all_reduce", name());
  return start(desc(OpKind::kAllReduce, count, dtype, op),
               [&] { return post_all_reduce(buf, count, dtype, op); });
}

void Communicator::all_reduce(void* buf, std::int64_t count, Datatype dtype, ReduceOp op) {
  iall_reduce(buf, count, dtype, op).wait();
}

Request Communicator::ireduce_scatter(const void* in, void* out, std::int64_t count, Datatype dtype,
                                      ReduceOp op) {
  check_buffer(in, count * size(), "reduce_scatter (in)", name());
  check_buffer(out, count, "reduce_scatter (out)", name());
  check_reducible(dtype, "reduce_scatter", name());
  const std::int64_t block = count * size_of(dtype);
  check_alias(in, block * size(), out, block, block * rank(), "reduce_scatter", name());
  return start(desc(OpKind::kReduceScatter, count, dtype, op),
               [&] { return post_reduce_scatter(in, out, count, dtype, op); });
}

void Communicator::reduce_scatter(const void* in, void* out, std::int64_t count, Datatype dtype,
                                  ReduceOp op) {
  ireduce_scatter(in, out, count, dtype, op).wait();
}

Request Communicator::ireduce_scatter_v(const void* in, void* out,
                                        std::span<const std::int64_t> counts, Datatype dtype,
                                        ReduceOp op) {
  check_counts(counts, size(), "reduce_scatter_v", name());
  const auto r = static_cast<std::size_t>(rank());
  check_buffer(in, sum_of(counts, counts.size()), "reduce_scatter_v (in)", name());
  check_buffer(out, counts[r], "reduce_scatter_v (out)", name());
  check_reducible(dtype, "reduce_scatter_v", name());
  const std::int64_t es = size_of(dtype);
  check_alias(in, sum_of(counts, counts.size()) * es, out, counts[r] * es, sum_of(counts, r) * es,
              "reduce_scatter_v", name());
  return start(desc(OpKind::kReduceScatterV, counts[r], dtype, op),
               [&] { return post_reduce_scatter_v(in, out, counts, dtype, op); });
}

void Communicator::reduce_scatter_v(const void* in, void* out, std::span<const std::int64_t> counts,
                                    Datatype dtype, ReduceOp op) {
  ireduce_scatter_v(in, out, counts, dtype, op).wait();
}

Request Communicator::iall_gather(const void* in, void* out, std::int64_t count, Datatype dtype) {
  check_buffer(in, count, "all_gather (in)", name());
  check_buffer(out, count * size(), "all_gather (out)", name());
  const std::int64_t block = count * size_of(dtype);
  check_alias(out, block * size(), in, block, block * rank(), "all_gather", name());
  return start(desc(OpKind::kAllGather, count, dtype),
               [&] { return post_all_gather(in, out, count, dtype); });
}

void Communicator::all_gather(const void* in, void* out, std::int64_t count, Datatype dtype) {
  iall_gather(in, out, count, dtype).wait();
}

Request Communicator::iall_gather_v(const void* in, void* out, std::span<const std::int64_t> counts,
                                    Datatype dtype) {
  check_counts(counts, size(), "all_gather_v", name());
  const auto r = static_cast<std::size_t>(rank());
  check_buffer(in, counts[r], "all_gather_v (in)", name());
  check_buffer(out, sum_of(counts, counts.size()), "all_gather_v (out)", name());
  const std::int64_t es = size_of(dtype);
  check_alias(out, sum_of(counts, counts.size()) * es, in, counts[r] * es, sum_of(counts, r) * es,
              "all_gather_v", name());
  return start(desc(OpKind::kAllGatherV, counts[r], dtype),
               [&] { return post_all_gather_v(in, out, counts, dtype); });
}

void Communicator::all_gather_v(const void* in, void* out, std::span<const std::int64_t> counts,
                                Datatype dtype) {
  iall_gather_v(in, out, counts, dtype).wait();
}

Request Communicator::iall_to_all_v(const void* in, std::span<const std::int64_t> send_counts,
                                    void* out, std::span<const std::int64_t> recv_counts,
                                    Datatype dtype) {
  check_counts(send_counts, size(), "all_to_all_v (send counts)", name());
  check_counts(recv_counts, size(), "all_to_all_v (recv counts)", name());
  const std::int64_t sent = sum_of(send_counts, send_counts.size());
  const std::int64_t received = sum_of(recv_counts, recv_counts.size());
  check_buffer(in, sent, "all_to_all_v (in)", name());
  check_buffer(out, received, "all_to_all_v (out)", name());
  const std::int64_t es = size_of(dtype);
  TRIDENT_CHECK(!overlaps(in, sent * es, out, received * es), "all_to_all_v on group '", name(),
                "': the send and receive buffers overlap");
  const auto r = static_cast<std::size_t>(rank());
  TRIDENT_CHECK(send_counts[r] == recv_counts[r], "all_to_all_v on group '", name(), "': rank ",
                rank(), " sends itself ", send_counts[r], " elements but expects ", recv_counts[r]);
  // The desc's count: what this rank sends (its receives show in the peers' descs).
  return start(desc(OpKind::kAllToAllV, sent, dtype),
               [&] { return post_all_to_all_v(in, send_counts, out, recv_counts, dtype); });
}

void Communicator::all_to_all_v(const void* in, std::span<const std::int64_t> send_counts,
                                void* out, std::span<const std::int64_t> recv_counts,
                                Datatype dtype) {
  iall_to_all_v(in, send_counts, out, recv_counts, dtype).wait();
}

Request Communicator::ibroadcast(void* buf, std::int64_t count, Datatype dtype, int root) {
  check_buffer(buf, count, "broadcast", name());
  TRIDENT_CHECK(root >= 0 && root < size(), "broadcast on group '", name(), "': root ", root,
                " outside [0, ", size(), ")");
  return start(desc(OpKind::kBroadcast, count, dtype, ReduceOp::kSum, root),
               [&] { return post_broadcast(buf, count, dtype, root); });
}

void Communicator::broadcast(void* buf, std::int64_t count, Datatype dtype, int root) {
  ibroadcast(buf, count, dtype, root).wait();
}

namespace {
void check_p2p(int peer, int tag, int rank, int size, const char* what, const std::string& group) {
  TRIDENT_CHECK(peer >= 0 && peer < size, what, " on group '", group, "': peer ", peer,
                " outside [0, ", size, ")");
  TRIDENT_CHECK(peer != rank, what, " on group '", group, "': rank ", rank,
                " cannot send to itself");
  TRIDENT_CHECK(tag >= 0 && tag <= kMaxTag, what, " on group '", group, "': tag ", tag,
                " outside [0, ", kMaxTag, "]");
}
}  // namespace

Request Communicator::isend(const void* buf, std::int64_t count, Datatype dtype, int peer,
                            int tag) {
  check_buffer(buf, count, "send", name());
  check_p2p(peer, tag, rank(), size(), "send", name());
  return start(desc(OpKind::kSend, count, dtype, ReduceOp::kSum, peer, tag),
               [&] { return post_send(buf, count, dtype, peer, tag); });
}

Request Communicator::irecv(void* buf, std::int64_t count, Datatype dtype, int peer, int tag) {
  check_buffer(buf, count, "recv", name());
  check_p2p(peer, tag, rank(), size(), "recv", name());
  return start(desc(OpKind::kRecv, count, dtype, ReduceOp::kSum, peer, tag),
               [&] { return post_recv(buf, count, dtype, peer, tag); });
}

void Communicator::send(const void* buf, std::int64_t count, Datatype dtype, int peer, int tag) {
  isend(buf, count, dtype, peer, tag).wait();
}

void Communicator::recv(void* buf, std::int64_t count, Datatype dtype, int peer, int tag) {
  irecv(buf, count, dtype, peer, tag).wait();
}

void Communicator::barrier() {
  start(desc(OpKind::kBarrier), [&] { return post_barrier(); }).wait();
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const std::string& new_name) {
  TRIDENT_CHECK(color >= 0 || color == kNoColor, "split of group '", name(), "': color ", color,
                " must be >= 0 or kNoColor");
  TRIDENT_CHECK(!new_name.empty(), "split of group '", name(), "': the new group needs a name");
  std::unique_ptr<Communicator> c;
  try {
    c = do_split(color, key, new_name);
  } catch (const core::CommError& e) {
    const std::string what = e.what();
    if (what.rfind("comm: ", 0) == 0) throw;  // already has the context (a timed-out wait)
    throw core::CommError(
        core::str("comm: ", describe(*group_, rank_, desc(OpKind::kSplit)), " failed: ", what));
  }
  if (c) {
    c->set_step(step_);
    c->set_wait_policy(policy_);
  }
  return c;
}

// --- TensorView conveniences ---

namespace {
Datatype same_dtype(const core::TensorView& a, const core::TensorView& b, const char* what) {
  TRIDENT_CHECK(a.dtype == b.dtype, what, ": in is ", core::dtype_name(a.dtype), " but out is ",
                core::dtype_name(b.dtype));
  return to_datatype(a.dtype);
}
void check_cpu(const core::TensorView& t, const char* what) {
  TRIDENT_CHECK(t.device.kind == core::DeviceKind::kCpu, what,
                ": this communicator moves host memory only");
}
}  // namespace

void Communicator::all_reduce(core::TensorView buf, ReduceOp op) { iall_reduce(buf, op).wait(); }

Request Communicator::iall_reduce(core::TensorView buf, ReduceOp op) {
  check_cpu(buf, "all_reduce");
  return iall_reduce(buf.data, buf.numel(), to_datatype(buf.dtype), op);
}

void Communicator::reduce_scatter(core::TensorView in, core::TensorView out, ReduceOp op) {
  ireduce_scatter(in, out, op).wait();
}

Request Communicator::ireduce_scatter(core::TensorView in, core::TensorView out, ReduceOp op) {
  check_cpu(in, "reduce_scatter");
  check_cpu(out, "reduce_scatter");
  const Datatype dt = same_dtype(in, out, "reduce_scatter");
  check_blocks(in.numel(), out.numel(), "reduce_scatter");
  return ireduce_scatter(in.data, out.data, out.numel(), dt, op);
}

void Communicator::all_gather(core::TensorView in, core::TensorView out) {
  iall_gather(in, out).wait();
}

Request Communicator::iall_gather(core::TensorView in, core::TensorView out) {
  check_cpu(in, "all_gather");
  check_cpu(out, "all_gather");
  const Datatype dt = same_dtype(in, out, "all_gather");
  check_blocks(out.numel(), in.numel(), "all_gather");
  return iall_gather(in.data, out.data, in.numel(), dt);
}

void Communicator::broadcast(core::TensorView buf, int root) {
  check_cpu(buf, "broadcast");
  broadcast(buf.data, buf.numel(), to_datatype(buf.dtype), root);
}

void Communicator::send(core::TensorView buf, int peer, int tag) { isend(buf, peer, tag).wait(); }

void Communicator::recv(core::TensorView buf, int peer, int tag) { irecv(buf, peer, tag).wait(); }

Request Communicator::isend(core::TensorView buf, int peer, int tag) {
  check_cpu(buf, "send");
  return isend(buf.data, buf.numel(), to_datatype(buf.dtype), peer, tag);
}

Request Communicator::irecv(core::TensorView buf, int peer, int tag) {
  check_cpu(buf, "recv");
  return irecv(buf.data, buf.numel(), to_datatype(buf.dtype), peer, tag);
}

}  // namespace trident::comm
