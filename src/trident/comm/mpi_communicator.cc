// MpiCommunicator: each operation becomes one or more non-blocking MPI calls whose requests the
// MpiRequest tests; the front end's wait loop (communicator.cc) supplies backoff and timeout.
#include "trident/comm/mpi_communicator.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "trident/comm/hang_report.h"

namespace trident::comm {

namespace {

MPI_Datatype to_mpi(Datatype t) {
  switch (t) {
    case Datatype::kF32:
      return MPI_FLOAT;
    case Datatype::kF64:
      return MPI_DOUBLE;
    case Datatype::kI32:
      return MPI_INT32_T;
    case Datatype::kI64:
      return MPI_INT64_T;
    case Datatype::kU8:
      return MPI_UINT8_T;
    // Moved as raw 16-bit words; the front end never lets them reach a reduction.
    case Datatype::kBF16:
    case Datatype::kF16:
    case Datatype::kU16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return core::str("MPI error ", code);
  return std::string(buf, static_cast<std::size_t>(len));
}

void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS) [[unlikely]] {
    throw core::CommError(core::str(call, " failed: ", mpi_error_string(rc)));
  }
}

void* byte_offset(void* p, std::int64_t bytes) { return static_cast<std::byte*>(p) + bytes; }
const void* byte_offset(const void* p, std::int64_t bytes) {
  return static_cast<const std::byte*>(p) + bytes;
}

// The MPI requests of one operation, plus everything MPI reads or writes until they complete.
// Most operations are one MPI request and need nothing else: keep that path to two allocations
// (this object and its request vector).
class MpiRequest final : public detail::RequestImpl {
 public:
  struct Buffers {
    std::vector<int> counts, displs;            // argument arrays of the v-collectives
    std::vector<int> recv_counts, recv_displs;  // all_to_all_v's receive side
    std::vector<std::byte> temp;                // result of an in-place reduce_scatter
  };

  // Appends a request; `expected_recv` >= 0 makes completion check the received element count.
  void add(MPI_Request r, int expected_recv = -1) {
    reqs_.push_back(r);
    if (expected_recv >= 0 || !expected_.empty()) {
      expected_.resize(reqs_.size() - 1, -1);
      expected_.push_back(expected_recv);
    }
  }
  Buffers& buffers() {
    if (!buffers_) buffers_ = std::make_unique<Buffers>();
    return *buffers_;
  }
  void copy_temp_on_completion(void* dst) { copy_to_ = dst; }
  void set_datatype(MPI_Datatype t) { dtype_ = t; }

  bool test() override {
    int flag = 0;
    if (reqs_.size() == 1 && expected_.empty()) {
      MPI_Status status;
      const int rc = MPI_Test(reqs_.data(), &flag, &status);
      if (rc != MPI_SUCCESS) throw core::CommError(core::str("MPI_Test: ", mpi_error_string(rc)));
    } else {
      statuses_.resize(reqs_.size());
      const int rc =
          MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, statuses_.data());
      if (rc != MPI_SUCCESS) throw core::CommError(status_error(rc));
    }
    if (!flag) return false;
    for (std::size_t i = 0; i < expected_.size(); ++i) {
      if (expected_[i] < 0) continue;
      int got = 0;
      MPI_Get_count(&statuses_[i], dtype_, &got);
      if (got != expected_[i]) {
        throw core::CommError(core::str("received ", got, " elements, expected ", expected_[i],
                                        " (the sender's count differs)"));
      }
    }
    if (copy_to_ && buffers_ && !buffers_->temp.empty()) {
      std::memcpy(copy_to_, buffers_->temp.data(), buffers_->temp.size());
    }
    return true;
  }

  void abandon() noexcept override {
    // MPI cannot cancel a posted collective: it may still read or write these buffers, so they
    // are deliberately leaked. The job is about to end (abort_job).
    static_cast<void>(buffers_.release());
  }

 private:
  std::string status_error(int rc) const {
    if (rc == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& s : statuses_) {
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
          return core::str("MPI_Testall: ", mpi_error_string(s.MPI_ERROR));
        }
      }
    }
    return core::str("MPI_Testall: ", mpi_error_string(rc));
  }

  std::vector<MPI_Request> reqs_;
  std::vector<int> expected_;  // empty unless a receive checks its count
  std::vector<MPI_Status> statuses_;
  std::unique_ptr<Buffers> buffers_;
  void* copy_to_ = nullptr;
  MPI_Datatype dtype_ = MPI_BYTE;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, GroupInfo group, int rank, const WaitPolicy& policy)
    : Communicator(std::move(group), rank, policy), comm_(comm) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::world(const MpiRuntime& runtime,
                                                        const WaitPolicy& policy,
                                                        const std::string& name) {
  GroupInfo info{.name = name, .global_ranks = {}};
  info.global_ranks.resize(static_cast<std::size_t>(runtime.world_size()));
  std::iota(info.global_ranks.begin(), info.global_ranks.end(), 0);
  // MPI_Comm_idup, so that even creating the world has the timeout.
  MPI_Comm dup = MPI_COMM_NULL;
  auto impl = std::make_unique<MpiRequest>();
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &req), "MPI_Comm_idup");
  impl->add(req);
  Request(std::move(impl), std::make_shared<const GroupInfo>(info), runtime.world_rank(),
          OpDesc{.kind = OpKind::kSplit}, policy)
      .wait();
  auto world = std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(dup, std::move(info), runtime.world_rank(), policy));
  // The side channel for hang reports (once per process; collective over the world).
  start_hang_reporter(*world);
  return world;
}

void MpiCommunicator::set_max_message_elems(std::int64_t n) {
  TRIDENT_CHECK(n >= 1 && n <= INT_MAX, "max_message_elems must be in [1, ", INT_MAX, "], got ", n);
  max_message_elems_ = n;
}

int MpiCommunicator::to_int(std::int64_t n, const char* what) const {
  TRIDENT_CHECK(n <= INT_MAX, what, " on group '", name(), "': ", n,
                " elements exceed MPI's int count limit (", INT_MAX,
                "); split the buffer into buckets");
  return static_cast<int>(n);
}

Communicator::ImplPtr MpiCommunicator::post_all_reduce(void* buf, std::int64_t count,
                                                       Datatype dtype, ReduceOp op) {
  auto req = std::make_unique<MpiRequest>();
  const std::int64_t es = size_of(dtype);
  for (std::int64_t off = 0; off < count; off += max_message_elems_) {
    const int n = static_cast<int>(std::min(max_message_elems_, count - off));
    MPI_Request r = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, byte_offset(buf, off * es), n, to_mpi(dtype), to_mpi(op),
                             comm_, &r),
              "MPI_Iallreduce");
    req->add(r);
  }
  return req;
}

Communicator::ImplPtr MpiCommunicator::post_reduce_scatter(const void* in, void* out,
                                                           std::int64_t count, Datatype dtype,
                                                           ReduceOp op) {
  const int n = to_int(count, "reduce_scatter");
  to_int(count * size(), "reduce_scatter");
  auto req = std::make_unique<MpiRequest>();
  const std::int64_t block = count * size_of(dtype);
  void* recv = out;
  if (block > 0 && out == byte_offset(in, block * rank())) {  // in place: result lands in temp
    req->buffers().temp.resize(static_cast<std::size_t>(block));
    recv = req->buffers().temp.data();
    req->copy_temp_on_completion(out);
  }
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Ireduce_scatter_block(in, recv, n, to_mpi(dtype), to_mpi(op), comm_, &r),
            "MPI_Ireduce_scatter_block");
  req->add(r);
  return req;
}

Communicator::ImplPtr MpiCommunicator::post_reduce_scatter_v(const void* in, void* out,
                                                             std::span<const std::int64_t> counts,
                                                             Datatype dtype, ReduceOp op) {
  auto req = std::make_unique<MpiRequest>();
  auto& b = req->buffers();
  std::int64_t total = 0, mine_offset = 0;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) mine_offset = total;
    b.counts.push_back(to_int(counts[static_cast<std::size_t>(r)], "reduce_scatter_v"));
    total += counts[static_cast<std::size_t>(r)];
  }
  to_int(total, "reduce_scatter_v");
  const std::int64_t es = size_of(dtype);
  const std::int64_t mine = counts[static_cast<std::size_t>(rank())];
  void* recv = out;
  if (mine > 0 && out == byte_offset(in, mine_offset * es)) {
    b.temp.resize(static_cast<std::size_t>(mine * es));
    recv = b.temp.data();
    req->copy_temp_on_completion(out);
  }
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Ireduce_scatter(in, recv, b.counts.data(), to_mpi(dtype), to_mpi(op), comm_, &r),
            "MPI_Ireduce_scatter");
  req->add(r);
  return req;
}

Communicator::ImplPtr MpiCommunicator::post_all_gather(const void* in, void* out,
                                                       std::int64_t count, Datatype dtype) {
  const int n = to_int(count, "all_gather");
  to_int(count * size(), "all_gather");
  const std::int64_t block = count * size_of(dtype);
  const bool in_place =
      block > 0 && in == byte_offset(static_cast<const void*>(out), block * rank());
  auto req = std::make_unique<MpiRequest>();
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : in, n, to_mpi(dtype), out, n, to_mpi(dtype),
                           comm_, &r),
            "MPI_Iallgather");
  req->add(r);
  return req;
}

Communicator::ImplPtr MpiCommunicator::post_all_gather_v(const void* in, void* out,
                                                         std::span<const std::int64_t> counts,
                                                         Datatype dtype) {
  auto req = std::make_unique<MpiRequest>();
  auto& b = req->buffers();
  std::int64_t total = 0;
  for (int r = 0; r < size(); ++r) {
    b.counts.push_back(to_int(counts[static_cast<std::size_t>(r)], "all_gather_v"));
    b.displs.push_back(to_int(total, "all_gather_v"));
    total += counts[static_cast<std::size_t>(r)];
  }
  to_int(total, "all_gather_v");
  const auto me = static_cast<std::size_t>(rank());
  const bool in_place =
      b.counts[me] > 0 &&
      in == byte_offset(static_cast<const void*>(out), std::int64_t{b.displs[me]} * size_of(dtype));
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : in, b.counts[me], to_mpi(dtype), out,
                            b.counts.data(), b.displs.data(), to_mpi(dtype), comm_, &r),
            "MPI_Iallgatherv");
  req->add(r);
  return req;
}

Communicator::ImplPtr MpiCommunicator::post_all_to_all_v(const void* in,
                                                         std::span<const std::int64_t> send_counts,
                                                         void* out,
                                                         std::span<const std::int64_t> recv_counts,
                                                         Datatype dtype) {
  auto req = std::make_unique<MpiRequest>();
  auto& b = req->buffers();
  std::int64_t sent = 0, received = 0;
  for (int r = 0; r < size(); ++r) {
    const auto i = static_cast<std::size_t>(r);
    b.counts.push_back(to_int(send_counts[i], "all_to_all_v"));
    b.displs.push_back(to_int(sent, "all_to_all_v"));
    b.recv_counts.push_back(to_int(recv_counts[i], "all_to_all_v"));
    b.recv_displs.push_back(to_int(received, "all_to_all_v"));
    sent += send_counts[i];
    received += recv_counts[i];
  }
  to_int(sent, "all_to_all_v");
  to_int(received, "all_to_all_v");
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Ialltoallv(in, b.counts.data(), b.displs.data(), to_mpi(dtype), out,
                           b.recv_counts.data(), b.recv_displs.data(), to_mpi(dtype), comm_, &r),
            "MPI_Ialltoallv");
  req->add(r);
  return req;
}

Communicator::ImplPtr MpiCommunicator::post_broadcast(void* buf, std::int64_t count, Datatype dtype,
                                                      int root) {
  auto req = std::make_unique<MpiRequest>();
  const std::int64_t es = size_of(dtype);
  for (std::int64_t off = 0; off < count; off += max_message_elems_) {
    const int n = static_cast<int>(std::min(max_message_elems_, count - off));
    MPI_Request r = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(byte_offset(buf, off * es), n, to_mpi(dtype), root, comm_, &r),
              "MPI_Ibcast");
    req->add(r);
  }
  return req;
}

// Messages longer than max_message_elems go as several messages with the same tag; MPI's
// non-overtaking rule keeps them in order. An empty message is still sent, so that send and recv
// of 0 elements pair up like any other.
Communicator::ImplPtr MpiCommunicator::post_send(const void* buf, std::int64_t count,
                                                 Datatype dtype, int peer, int tag) {
  auto req = std::make_unique<MpiRequest>();
  const std::int64_t es = size_of(dtype);
  std::int64_t off = 0;
  do {
    const int n = static_cast<int>(std::min(max_message_elems_, count - off));
    MPI_Request r = MPI_REQUEST_NULL;
    check_mpi(MPI_Isend(byte_offset(buf, off * es), n, to_mpi(dtype), peer, tag, comm_, &r),
              "MPI_Isend");
    req->add(r);
    off += n;
  } while (off < count);
  return req;
}

Communicator::ImplPtr MpiCommunicator::post_recv(void* buf, std::int64_t count, Datatype dtype,
                                                 int peer, int tag) {
  auto req = std::make_unique<MpiRequest>();
  req->set_datatype(to_mpi(dtype));
  const std::int64_t es = size_of(dtype);
  std::int64_t off = 0;
  do {
    const int n = static_cast<int>(std::min(max_message_elems_, count - off));
    MPI_Request r = MPI_REQUEST_NULL;
    check_mpi(MPI_Irecv(byte_offset(buf, off * es), n, to_mpi(dtype), peer, tag, comm_, &r),
              "MPI_Irecv");
    req->add(r, n);
    off += n;
  } while (off < count);
  return req;
}

Communicator::ImplPtr MpiCommunicator::post_barrier() {
  auto req = std::make_unique<MpiRequest>();
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  req->add(r);
  return req;
}

// MPI_Comm_split blocks without a timeout, so the ranks first exchange (color, key) with a timed
// all-gather: once it completes every rank is known to be at the split. The exchange also gives
// the new group's global ranks without another round.
std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key,
                                                        const std::string& new_name) {
  const std::int64_t mine[2] = {color, key};
  std::vector<std::int64_t> all(static_cast<std::size_t>(2 * size()));
  wait_for(post_all_gather(mine, all.data(), 2, Datatype::kI64), desc(OpKind::kSplit));
  MPI_Comm child = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color == kNoColor ? MPI_UNDEFINED : color, key, &child),
            "MPI_Comm_split");
  if (color == kNoColor) return nullptr;

  std::vector<int> members;  // parent ranks with my color, in MPI_Comm_split's order
  for (int r = 0; r < size(); ++r) {
    if (all[static_cast<std::size_t>(2 * r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[static_cast<std::size_t>(2 * a + 1)] < all[static_cast<std::size_t>(2 * b + 1)];
  });
  GroupInfo info{.name = new_name, .global_ranks = {}};
  int my_index = -1;
  for (std::size_t i = 0; i < members.size(); ++i) {
    info.global_ranks.push_back(group().global_ranks[static_cast<std::size_t>(members[i])]);
    if (members[i] == rank()) my_index = static_cast<int>(i);
  }
  int child_rank = -1;
  MPI_Comm_rank(child, &child_rank);
  TRIDENT_ASSERT(child_rank == my_index, "split '", new_name, "': MPI gave rank ", child_rank,
                 ", expected ", my_index);
  auto c = std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(child, std::move(info), my_index, wait_policy()));
  c->max_message_elems_ = max_message_elems_;
  return c;
}

}  // namespace trident::comm
