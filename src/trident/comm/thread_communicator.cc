// ThreadCommunicator: a rendezvous in shared memory. Each collective is a slot keyed by its
// sequence number in the group; ranks post their buffer pointers into it, the first rank to see
// every rank arrived computes the result into the slot, and each rank copies its part out. Point-
// to-point messages match in FIFO order per (source, destination, tag) and are copied by whichever
// side posts second. One mutex per group guards everything, including the copies.
#include "trident/comm/thread_communicator.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>

namespace trident::comm {

namespace detail {

// Shared by every group of one world: failure and exit state of the ranks.
struct ThreadWorldState {
  std::mutex mu;
  bool aborted = false;
  std::string abort_reason;
  std::vector<char> exited;  // exited[global rank]
};

struct SplitResult {
  std::shared_ptr<ThreadGroupState> group;  // null for kNoColor
  int rank = 0;
};

struct CollectiveSlot {
  OpKind kind = OpKind::kBarrier;
  std::int64_t count = 0;
  Datatype dtype = Datatype::kU8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<std::int64_t> counts;  // the _v variants
  // all_to_all_v: each rank's send and receive counts (they differ per rank by design).
  std::vector<std::vector<std::int64_t>> send_counts, recv_counts;
  int first_rank = 0;  // whose arguments the others are compared with

  std::vector<const void*> in;  // per rank
  std::vector<void*> out;       // per rank
  std::vector<int> colors, keys;
  std::vector<std::string> names;
  std::vector<char> posted;  // per rank

  int arrived = 0;
  int released = 0;  // ranks done with the slot (completed, failed or abandoned)
  bool computed = false;
  std::vector<std::byte> result;
  std::vector<SplitResult> split;  // per rank
  std::string failure;             // non-empty: every rank that tests the slot throws this

  // all_to_all_v: the elements rank r sends.
  std::int64_t count_of(int r) const {
    const auto& c = send_counts[static_cast<std::size_t>(r)];
    return std::accumulate(c.begin(), c.end(), std::int64_t{0});
  }
};

struct P2POp {
  const void* send_buf = nullptr;
  void* recv_buf = nullptr;
  std::int64_t count = 0;
  Datatype dtype = Datatype::kU8;
  int src = 0, dst = 0;  // group ranks
  bool done = false;
  std::string failure;
};

struct ThreadGroupState {
  std::shared_ptr<ThreadWorldState> world;
  GroupInfo info;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::int64_t, CollectiveSlot> slots;
  using Key = std::tuple<int, int, int>;  // (src, dst, tag)
  std::map<Key, std::deque<std::shared_ptr<P2POp>>> sends, recvs;

  int size() const { return static_cast<int>(info.global_ranks.size()); }
  int global(int rank) const { return info.global_ranks[static_cast<std::size_t>(rank)]; }

  // Throws CommError if the world was aborted. Caller holds mu.
  void check_world() const {
    std::lock_guard<std::mutex> lock(world->mu);
    if (world->aborted) throw core::CommError(world->abort_reason);
  }
  bool has_exited(int rank) const {
    std::lock_guard<std::mutex> lock(world->mu);
    return world->exited[static_cast<std::size_t>(global(rank))] != 0;
  }
};

}  // namespace detail

namespace {

using detail::CollectiveSlot;
using detail::P2POp;
using detail::ThreadGroupState;

void copy_bytes(void* dst, const void* src, std::int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

std::int64_t offset_of(const std::vector<std::int64_t>& counts, int rank) {
  return std::accumulate(counts.begin(), counts.begin() + rank, std::int64_t{0});
}

// The reduction of every rank's input, in rank order, into s.result.
void compute_reduction(CollectiveSlot& s, std::int64_t total) {
  const std::int64_t bytes = total * size_of(s.dtype);
  s.result.resize(static_cast<std::size_t>(bytes));
  if (total == 0) return;
  copy_bytes(s.result.data(), s.in[0], bytes);
  for (std::size_t r = 1; r < s.in.size(); ++r) {
    reduce_into(s.result.data(), s.in[r], total, s.dtype, s.op);
  }
}

void compute_split(ThreadGroupState& g, CollectiveSlot& s) {
  const int n = g.size();
  s.split.assign(static_cast<std::size_t>(n), {});
  std::map<int, std::vector<int>> members;  // color -> ranks
  for (int r = 0; r < n; ++r) {
    if (s.colors[static_cast<std::size_t>(r)] != Communicator::kNoColor) {
      members[s.colors[static_cast<std::size_t>(r)]].push_back(r);
    }
  }
  for (auto& [color, ranks] : members) {
    std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
      return s.keys[static_cast<std::size_t>(a)] < s.keys[static_cast<std::size_t>(b)];
    });
    auto child = std::make_shared<ThreadGroupState>();
    child->world = g.world;
    child->info.name = s.names[static_cast<std::size_t>(ranks.front())];
    for (int r : ranks) child->info.global_ranks.push_back(g.global(r));
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      s.split[static_cast<std::size_t>(ranks[i])] = {child, static_cast<int>(i)};
    }
  }
}

void compute(ThreadGroupState& g, CollectiveSlot& s) {
  const int n = g.size();
  const std::int64_t es = size_of(s.dtype);
  switch (s.kind) {
    case OpKind::kAllReduce:
      compute_reduction(s, s.count);
      break;
    case OpKind::kReduceScatter:
      compute_reduction(s, s.count * n);
      break;
    case OpKind::kReduceScatterV:
      compute_reduction(s, offset_of(s.counts, n));
      break;
    case OpKind::kAllGather:
      s.result.resize(static_cast<std::size_t>(s.count * n * es));
      for (int r = 0; r < n; ++r) {
        copy_bytes(s.result.data() + r * s.count * es, s.in[static_cast<std::size_t>(r)],
                   s.count * es);
      }
      break;
    case OpKind::kAllGatherV:
      s.result.resize(static_cast<std::size_t>(offset_of(s.counts, n) * es));
      for (int r = 0; r < n; ++r) {
        copy_bytes(s.result.data() + offset_of(s.counts, r) * es, s.in[static_cast<std::size_t>(r)],
                   s.counts[static_cast<std::size_t>(r)] * es);
      }
      break;
    case OpKind::kAllToAllV: {
      // Every rank's input, concatenated in rank order; deliver() picks each rank's blocks.
      std::int64_t total = 0;
      for (int r = 0; r < n; ++r) total += s.count_of(r);
      s.result.resize(static_cast<std::size_t>(total * es));
      std::int64_t at = 0;
      for (int r = 0; r < n; ++r) {
        copy_bytes(s.result.data() + at * es, s.in[static_cast<std::size_t>(r)],
                   s.count_of(r) * es);
        at += s.count_of(r);
      }
      break;
    }
    case OpKind::kBroadcast:
      s.result.resize(static_cast<std::size_t>(s.count * es));
      copy_bytes(s.result.data(), s.in[static_cast<std::size_t>(s.root)], s.count * es);
      break;
    case OpKind::kSplit:
      compute_split(g, s);
      break;
    case OpKind::kBarrier:
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      TRIDENT_ASSERT(false, "p2p in a collective slot");
  }
  s.computed = true;
}

// Copies rank r's part of the computed result into its output buffer.
void deliver(CollectiveSlot& s, int r) {
  const std::int64_t es = size_of(s.dtype);
  void* out = s.out[static_cast<std::size_t>(r)];
  switch (s.kind) {
    case OpKind::kAllReduce:
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
      copy_bytes(out, s.result.data(), static_cast<std::int64_t>(s.result.size()));
      break;
    case OpKind::kBroadcast:
      if (r != s.root) copy_bytes(out, s.result.data(), s.count * es);
      break;
    case OpKind::kReduceScatter:
      copy_bytes(out, s.result.data() + r * s.count * es, s.count * es);
      break;
    case OpKind::kReduceScatterV:
      copy_bytes(out, s.result.data() + offset_of(s.counts, r) * es,
                 s.counts[static_cast<std::size_t>(r)] * es);
      break;
    case OpKind::kAllToAllV: {
      // From each source rank, its block for r: after the source's blocks for ranks < r.
      std::int64_t base = 0, at = 0;
      for (int src = 0; src < static_cast<int>(s.in.size()); ++src) {
        const auto& sc = s.send_counts[static_cast<std::size_t>(src)];
        const std::int64_t n = sc[static_cast<std::size_t>(r)];
        copy_bytes(static_cast<std::byte*>(out) + at * es,
                   s.result.data() + (base + offset_of(sc, r)) * es, n * es);
        at += n;
        base += s.count_of(src);
      }
      break;
    }
    case OpKind::kSplit:
    case OpKind::kBarrier:
    case OpKind::kSend:
    case OpKind::kRecv:
      break;
  }
}

// all_to_all_v: rank r has just posted; its counts must pair up with every rank posted before it
// (a's send_counts[b] is b's recv_counts[a]). A mismatch fails the collective on every rank.
void check_pairing(const ThreadGroupState& g, CollectiveSlot& s, std::size_t r) {
  for (std::size_t p = 0; p < s.posted.size(); ++p) {
    if (!s.posted[p] || p == r) continue;
    for (auto [a, b] : {std::pair{r, p}, std::pair{p, r}}) {
      const std::int64_t sent = s.send_counts[a][b], expected = s.recv_counts[b][a];
      if (sent == expected) continue;
      s.failure = core::str("all_to_all_v count mismatch on group '", g.info.name, "': rank ", a,
                            " (global ", g.global(static_cast<int>(a)), ") sends ", sent,
                            " elements to rank ", b, " (global ", g.global(static_cast<int>(b)),
                            "), which expects ", expected);
      return;
    }
  }
}

std::string slot_signature(const CollectiveSlot& s) {
  std::string sig = core::str(op_name(s.kind), "(count=", s.count, ", ", datatype_name(s.dtype));
  if (s.kind == OpKind::kAllReduce || s.kind == OpKind::kReduceScatter ||
      s.kind == OpKind::kReduceScatterV) {
    sig += core::str(", ", reduce_op_name(s.op));
  }
  if (s.kind == OpKind::kBroadcast) sig += core::str(", root ", s.root);
  if (!s.counts.empty()) {
    sig += ", counts [";
    for (std::size_t i = 0; i < s.counts.size(); ++i) sig += core::str(i ? ", " : "", s.counts[i]);
    sig += "]";
  }
  return sig + ")";
}

// Waits on the group's condition variable (woken by every state change) for up to `seconds`.
void block_on(ThreadGroupState& g, double seconds) {
  if (seconds <= 0) {
    sched_yield();
    return;
  }
  std::unique_lock<std::mutex> lock(g.mu);
  g.cv.wait_for(lock, std::chrono::duration<double>(seconds));
}

class CollectiveRequest final : public detail::RequestImpl {
 public:
  CollectiveRequest(std::shared_ptr<ThreadGroupState> g, std::int64_t seq, int rank,
                    std::shared_ptr<detail::SplitResult> split_out)
      : g_(std::move(g)), seq_(seq), rank_(rank), split_out_(std::move(split_out)) {}

  bool test() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    CollectiveSlot& s = g_->slots.at(seq_);
    try {
      g_->check_world();
      if (!s.failure.empty()) throw core::CommError(s.failure);
      if (s.arrived < g_->size()) {
        for (int r = 0; r < g_->size(); ++r) {
          if (!s.posted[static_cast<std::size_t>(r)] && g_->has_exited(r)) {
            s.failure = core::str("rank ", r, " (global ", g_->global(r),
                                  ") returned without joining this collective");
            throw core::CommError(s.failure);
          }
        }
        return false;
      }
    } catch (const core::CommError&) {
      release(s);
      throw;
    }
    if (!s.computed) compute(*g_, s);
    deliver(s, rank_);
    if (split_out_) *split_out_ = s.split[static_cast<std::size_t>(rank_)];
    release(s);
    return true;
  }

  bool block_for(double seconds) override {
    block_on(*g_, seconds);
    return test();
  }

  void abandon() noexcept override {
    std::lock_guard<std::mutex> lock(g_->mu);
    auto it = g_->slots.find(seq_);
    if (it == g_->slots.end()) return;
    CollectiveSlot& s = it->second;
    if (!s.computed && s.failure.empty()) {
      s.failure = core::str("rank ", rank_, " (global ", g_->global(rank_),
                            ") gave up on this collective after its timeout");
    }
    // Peers must not read this rank's buffers any more.
    s.in[static_cast<std::size_t>(rank_)] = nullptr;
    s.out[static_cast<std::size_t>(rank_)] = nullptr;
    release(s);
  }

 private:
  // Caller holds g_->mu. The slot is erased once every rank is done with it.
  void release(CollectiveSlot& s) {
    ++s.released;
    g_->cv.notify_all();
    if (s.released == g_->size()) g_->slots.erase(seq_);
  }

  std::shared_ptr<ThreadGroupState> g_;
  std::int64_t seq_;
  int rank_;
  std::shared_ptr<detail::SplitResult> split_out_;
};

class P2PRequest final : public detail::RequestImpl {
 public:
  P2PRequest(std::shared_ptr<ThreadGroupState> g, std::shared_ptr<P2POp> op,
             ThreadGroupState::Key key, bool is_send)
      : g_(std::move(g)), op_(std::move(op)), key_(key), is_send_(is_send) {}

  bool test() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    g_->check_world();
    if (!op_->failure.empty()) throw core::CommError(op_->failure);
    if (op_->done) return true;
    const int peer = is_send_ ? op_->dst : op_->src;
    if (g_->has_exited(peer)) {
      withdraw();
      throw core::CommError(core::str("peer ", peer, " (global ", g_->global(peer),
                                      ") returned without posting the matching ",
                                      is_send_ ? "recv" : "send"));
    }
    return false;
  }

  bool block_for(double seconds) override {
    block_on(*g_, seconds);
    return test();
  }

  void abandon() noexcept override {
    std::lock_guard<std::mutex> lock(g_->mu);
    withdraw();
  }

 private:
  // Removes the unmatched operation from its queue. Caller holds g_->mu.
  void withdraw() {
    auto& queues = is_send_ ? g_->sends : g_->recvs;
    auto it = queues.find(key_);
    if (it == queues.end()) return;
    std::erase(it->second, op_);
  }

  std::shared_ptr<ThreadGroupState> g_;
  std::shared_ptr<P2POp> op_;
  ThreadGroupState::Key key_;
  bool is_send_;
};

// Copies a matched pair (caller holds the group mutex).
void match(ThreadGroupState& g, P2POp& s, P2POp& r) {
  if (s.count != r.count || s.dtype != r.dtype) {
    const std::string msg =
        core::str("message mismatch: rank ", s.src, " (global ", g.global(s.src), ") sends ",
                  s.count, " ", datatype_name(s.dtype), " but rank ", r.dst, " (global ",
                  g.global(r.dst), ") receives ", r.count, " ", datatype_name(r.dtype));
    s.failure = msg;
    r.failure = msg;
  } else {
    copy_bytes(r.recv_buf, s.send_buf, s.count * size_of(s.dtype));
    s.done = true;
    r.done = true;
  }
  g.cv.notify_all();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct ThreadCommunicator::CollectiveArgs {
  OpKind kind = OpKind::kBarrier;
  const void* in = nullptr;
  void* out = nullptr;
  std::int64_t count = 0;
  Datatype dtype = Datatype::kU8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::span<const std::int64_t> counts{};
  std::span<const std::int64_t> send_counts{}, recv_counts{};  // all_to_all_v
  int color = 0, key = 0;
  std::string name{};
  std::shared_ptr<detail::SplitResult> split_out{};
};

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<detail::ThreadGroupState> state, int rank,
                                       const WaitPolicy& policy)
    : Communicator(state->info, rank, policy), state_(std::move(state)) {}

std::vector<std::unique_ptr<ThreadCommunicator>> ThreadCommunicator::create_world(
    int world_size, const WaitPolicy& policy) {
  TRIDENT_CHECK(world_size >= 1, "thread world size must be >= 1, got ", world_size);
  auto world = std::make_shared<detail::ThreadWorldState>();
  world->exited.assign(static_cast<std::size_t>(world_size), 0);
  auto state = std::make_shared<ThreadGroupState>();
  state->world = world;
  state->info.name = "world";
  for (int r = 0; r < world_size; ++r) state->info.global_ranks.push_back(r);
  std::vector<std::unique_ptr<ThreadCommunicator>> comms;
  for (int r = 0; r < world_size; ++r) {
    comms.emplace_back(new ThreadCommunicator(state, r, policy));
  }
  return comms;
}

void ThreadCommunicator::abort_world(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(state_->world->mu);
    if (!state_->world->aborted) {
      state_->world->aborted = true;
      state_->world->abort_reason =
          core::str("aborted because rank ", global_rank(), " failed: ", reason);
    }
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->cv.notify_all();
}

void ThreadCommunicator::mark_exited() {
  {
    std::lock_guard<std::mutex> lock(state_->world->mu);
    state_->world->exited[static_cast<std::size_t>(global_rank())] = 1;
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->cv.notify_all();
}

Communicator::ImplPtr ThreadCommunicator::post_collective(const CollectiveArgs& a) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->check_world();
  const std::int64_t seq = next_seq_++;
  const int n = size();
  auto [it, inserted] = state_->slots.try_emplace(seq);
  CollectiveSlot& s = it->second;
  CollectiveSlot mine;
  mine.kind = a.kind;
  mine.count = a.count;
  mine.dtype = a.dtype;
  mine.op = a.op;
  mine.root = a.root;
  mine.counts.assign(a.counts.begin(), a.counts.end());
  if (inserted) {
    s = std::move(mine);
    s.first_rank = rank();
    s.in.assign(static_cast<std::size_t>(n), nullptr);
    s.out.assign(static_cast<std::size_t>(n), nullptr);
    s.posted.assign(static_cast<std::size_t>(n), 0);
    s.colors.assign(static_cast<std::size_t>(n), kNoColor);
    s.keys.assign(static_cast<std::size_t>(n), 0);
    s.names.assign(static_cast<std::size_t>(n), "");
    s.send_counts.assign(static_cast<std::size_t>(n), {});
    s.recv_counts.assign(static_cast<std::size_t>(n), {});
  } else if (s.failure.empty()) {
    // The front end checked this rank's arguments; here they must agree with the other ranks'.
    // (A reduce_scatter_v / all_gather_v's per-rank count differs by design: compare `counts`.)
    const bool is_v = a.kind == OpKind::kReduceScatterV || a.kind == OpKind::kAllGatherV;
    const bool same = s.kind == mine.kind && s.dtype == mine.dtype && s.op == mine.op &&
                      s.root == mine.root && s.counts == mine.counts &&
                      (is_v || s.count == mine.count);
    if (!same) {
      s.failure = core::str("collective mismatch on group '", name(), "': rank ", s.first_rank,
                            " (global ", state_->global(s.first_rank), ") called ",
                            slot_signature(s), " but rank ", rank(), " (global ", global_rank(),
                            ") called ", slot_signature(mine), " as collective #", seq);
    }
  }
  const auto r = static_cast<std::size_t>(rank());
  s.in[r] = a.in;
  s.out[r] = a.out;
  s.colors[r] = a.color;
  s.keys[r] = a.key;
  s.names[r] = a.name;
  s.send_counts[r].assign(a.send_counts.begin(), a.send_counts.end());
  s.recv_counts[r].assign(a.recv_counts.begin(), a.recv_counts.end());
  s.posted[r] = 1;
  if (a.kind == OpKind::kAllToAllV && s.failure.empty()) check_pairing(*state_, s, r);
  ++s.arrived;
  state_->cv.notify_all();
  return std::make_unique<CollectiveRequest>(state_, seq, rank(), a.split_out);
}

Communicator::ImplPtr ThreadCommunicator::post_all_reduce(void* buf, std::int64_t count,
                                                          Datatype dtype, ReduceOp op) {
  return post_collective({.kind = OpKind::kAllReduce,
                          .in = buf,
                          .out = buf,
                          .count = count,
                          .dtype = dtype,
                          .op = op});
}

Communicator::ImplPtr ThreadCommunicator::post_reduce_scatter(const void* in, void* out,
                                                              std::int64_t count, Datatype dtype,
                                                              ReduceOp op) {
  return post_collective({.kind = OpKind::kReduceScatter,
                          .in = in,
                          .out = out,
                          .count = count,
                          .dtype = dtype,
                          .op = op});
}

Communicator::ImplPtr ThreadCommunicator::post_reduce_scatter_v(
    const void* in, void* out, std::span<const std::int64_t> counts, Datatype dtype, ReduceOp op) {
  return post_collective({.kind = OpKind::kReduceScatterV,
                          .in = in,
                          .out = out,
                          .count = counts[static_cast<std::size_t>(rank())],
                          .dtype = dtype,
                          .op = op,
                          .counts = counts});
}

Communicator::ImplPtr ThreadCommunicator::post_all_gather(const void* in, void* out,
                                                          std::int64_t count, Datatype dtype) {
  return post_collective(
      {.kind = OpKind::kAllGather, .in = in, .out = out, .count = count, .dtype = dtype});
}

Communicator::ImplPtr ThreadCommunicator::post_all_gather_v(const void* in, void* out,
                                                            std::span<const std::int64_t> counts,
                                                            Datatype dtype) {
  return post_collective({.kind = OpKind::kAllGatherV,
                          .in = in,
                          .out = out,
                          .count = counts[static_cast<std::size_t>(rank())],
                          .dtype = dtype,
                          .counts = counts});
}

Communicator::ImplPtr ThreadCommunicator::post_all_to_all_v(
    const void* in, std::span<const std::int64_t> send_counts, void* out,
    std::span<const std::int64_t> recv_counts, Datatype dtype) {
  return post_collective({.kind = OpKind::kAllToAllV,
                          .in = in,
                          .out = out,
                          .dtype = dtype,
                          .send_counts = send_counts,
                          .recv_counts = recv_counts});
}

Communicator::ImplPtr ThreadCommunicator::post_broadcast(void* buf, std::int64_t count,
                                                         Datatype dtype, int root) {
  return post_collective({.kind = OpKind::kBroadcast,
                          .in = buf,
                          .out = buf,
                          .count = count,
                          .dtype = dtype,
                          .root = root});
}

Communicator::ImplPtr ThreadCommunicator::post_barrier() {
  return post_collective({.kind = OpKind::kBarrier});
}

Communicator::ImplPtr ThreadCommunicator::post_send(const void* buf, std::int64_t count,
                                                    Datatype dtype, int peer, int tag) {
  auto op = std::make_shared<P2POp>();
  op->send_buf = buf;
  op->count = count;
  op->dtype = dtype;
  op->src = rank();
  op->dst = peer;
  const ThreadGroupState::Key key{rank(), peer, tag};
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->check_world();
  auto& pending = state_->recvs[key];
  if (!pending.empty()) {
    std::shared_ptr<P2POp> r = pending.front();
    pending.pop_front();
    match(*state_, *op, *r);
  } else {
    state_->sends[key].push_back(op);
  }
  return std::make_unique<P2PRequest>(state_, op, key, true);
}

Communicator::ImplPtr ThreadCommunicator::post_recv(void* buf, std::int64_t count, Datatype dtype,
                                                    int peer, int tag) {
  auto op = std::make_shared<P2POp>();
  op->recv_buf = buf;
  op->count = count;
  op->dtype = dtype;
  op->src = peer;
  op->dst = rank();
  const ThreadGroupState::Key key{peer, rank(), tag};
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->check_world();
  auto& pending = state_->sends[key];
  if (!pending.empty()) {
    std::shared_ptr<P2POp> s = pending.front();
    pending.pop_front();
    match(*state_, *s, *op);
  } else {
    state_->recvs[key].push_back(op);
  }
  return std::make_unique<P2PRequest>(state_, op, key, false);
}

std::unique_ptr<Communicator> ThreadCommunicator::do_split(int color, int key,
                                                           const std::string& new_name) {
  auto out = std::make_shared<detail::SplitResult>();
  wait_for(
      post_collective(
          {.kind = OpKind::kSplit, .color = color, .key = key, .name = new_name, .split_out = out}),
      desc(OpKind::kSplit));
  if (!out->group) return nullptr;
  return std::unique_ptr<Communicator>(
      new ThreadCommunicator(out->group, out->rank, wait_policy()));
}

// ---------------------------------------------------------------------------------------------

void run_on_threads(int world_size, const std::function<void(Communicator& world)>& fn,
                    const WaitPolicy& policy) {
  std::vector<std::unique_ptr<ThreadCommunicator>> comms =
      ThreadCommunicator::create_world(world_size, policy);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::mutex first_mu;
  int first_failed = -1;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator& comm = *comms[static_cast<std::size_t>(r)];
      try {
        fn(comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        {
          std::lock_guard<std::mutex> lock(first_mu);
          if (first_failed < 0) first_failed = r;
        }
        comm.abort_world(e.what());
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        {
          std::lock_guard<std::mutex> lock(first_mu);
          if (first_failed < 0) first_failed = r;
        }
        comm.abort_world("unknown exception");
      }
      comm.mark_exited();
    });
  }
  for (std::thread& t : threads) t.join();
  if (first_failed >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(first_failed)]);
}

}  // namespace trident::comm
