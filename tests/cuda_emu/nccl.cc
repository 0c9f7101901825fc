// cuemu's NCCL stand-in: see nccl.h. Each communicator is an MPI communicator of the member
// processes (made with MPI_Comm_create_group after a rendezvous at the unique id's creator);
// every NCCL operation is queued on its emulated stream and runs there as non-blocking MPI
// operations (a group's together), polled until done, until the communicator is aborted, or with
// a diagnostic once it has waited CUEMU_NCCL_STALL_S seconds.
#include "nccl.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "internal.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL with size 1 and no MPI: a local communicator
  int rank = 0, size = 1, device = 0;
  std::vector<int> world_ranks;  // by NCCL rank
  std::atomic<int> async{ncclSuccess};
  std::atomic<bool> aborted{false};
  std::atomic<int> pending{0};  // queued operations not yet done
  std::mutex mu;                // MPI calls on `mpi`; last_error
  std::string last_error;
  std::thread init;  // a non-blocking communicator's start
  std::once_flag joined;
};

namespace {

using namespace cuemu::detail;

constexpr std::uint64_t kIdMagic = 0x6375656d756e6363ull;  // "cuemuncc"
constexpr int kTagBase = 7000;

struct IdData {
  std::uint64_t magic;
  int creator_world;
  std::uint32_t seq;
  std::uint64_t nonce;
};

struct Hello {
  std::uint32_t seq;
  int rank, world, device;
  std::uint64_t host;
};

std::atomic<std::uint32_t> g_seq{0};
thread_local std::string t_last_error;

double stall_seconds() {
  static const double s = [] {
    const char* v = std::getenv("CUEMU_NCCL_STALL_S");
    return v ? std::atof(v) : 10.0;
  }();
  return s;
}

ncclResult_t fail(ncclComm_t comm, ncclResult_t r, const std::string& message) {
  const std::string text = "cuemu NCCL: " + message;
  if (!config().quiet) std::fprintf(stderr, "%s\n", text.c_str());
  t_last_error = text;
  if (comm) {
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->last_error = text;
  }
  return r;
}

std::uint64_t host_hash() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return std::hash<std::string>{}(name);
}

ncclResult_t check_mpi(ncclComm_t comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    return fail(comm, ncclInvalidUsage,
                "a communicator of more than one rank needs MPI (start the ranks with mpirun)");
  }
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    return fail(comm, ncclInvalidUsage,
                "the emulated NCCL runs MPI on the stream threads: MPI must be initialized with "
                "MPI_THREAD_MULTIPLE (comm::MpiRuntime asks for it in the emulated build)");
  }
  return ncclSuccess;
}

// ---- types and reductions
// ---------------------------------------------------------------------------
std::size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return MPI_INT8_T;
    case ncclUint8:
      return MPI_UINT8_T;
    case ncclInt32:
      return MPI_INT32_T;
    case ncclUint32:
      return MPI_UINT32_T;
    case ncclInt64:
      return MPI_INT64_T;
    case ncclUint64:
      return MPI_UINT64_T;
    case ncclFloat32:
      return MPI_FLOAT;
    case ncclFloat64:
      return MPI_DOUBLE;
    case ncclFloat16:
    case ncclBfloat16:
      return MPI_UINT16_T;  // reduced by the user operations below
  }
  return MPI_BYTE;
}

float bf16_to_f(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t f_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float f16_to_f(std::uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}
std::uint16_t f_to_f16(float f) {
  const _Float16 v = static_cast<_Float16>(f);
  std::uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}

template <bool kBf16, int kOp>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = kBf16 ? bf16_to_f(a[i]) : f16_to_f(a[i]);
    const float y = kBf16 ? bf16_to_f(b[i]) : f16_to_f(b[i]);
    const float r = kOp == 0   ? x + y
                    : kOp == 1 ? x * y
                    : kOp == 2 ? std::max(x, y)
                               : std::min(x, y);
    b[i] = kBf16 ? f_to_bf16(r) : f_to_f16(r);
  }
}

MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t t) {
  const int k = op == ncclProd ? 1 : op == ncclMax ? 2 : op == ncclMin ? 3 : 0;  // sum, avg: 0
  if (t == ncclFloat16 || t == ncclBfloat16) {
    static MPI_Op ops[2][4];
    static std::once_flag once;
    std::call_once(once, [] {
      MPI_Op_create(&half_op<true, 0>, 1, &ops[1][0]);
      MPI_Op_create(&half_op<true, 1>, 1, &ops[1][1]);
      MPI_Op_create(&half_op<true, 2>, 1, &ops[1][2]);
      MPI_Op_create(&half_op<true, 3>, 1, &ops[1][3]);
      MPI_Op_create(&half_op<false, 0>, 1, &ops[0][0]);
      MPI_Op_create(&half_op<false, 1>, 1, &ops[0][1]);
      MPI_Op_create(&half_op<false, 2>, 1, &ops[0][2]);
      MPI_Op_create(&half_op<false, 3>, 1, &ops[0][3]);
    });
    return ops[t == ncclBfloat16 ? 1 : 0][k];
  }
  switch (k) {
    case 1:
      return MPI_PROD;
    case 2:
      return MPI_MAX;
    case 3:
      return MPI_MIN;
    default:
      return MPI_SUM;
  }
}

// ---- operations
// --------------------------------------------------------------------------------------
enum class Kind { kAllReduce, kReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "ncclAllReduce";
    case Kind::kReduce:
      return "ncclReduce";
    case Kind::kReduceScatter:
      return "ncclReduceScatter";
    case Kind::kAllGather:
      return "ncclAllGather";
    case Kind::kBroadcast:
      return "ncclBroadcast";
    case Kind::kSend:
      return "ncclSend";
    case Kind::kRecv:
      return "ncclRecv";
  }
  return "an NCCL operation";
}

struct Op {
  Kind kind;
  const void* send;
  void* recv;
  std::size_t count;
  ncclDataType_t type;
  ncclRedOp_t red;
  int peer;  // root or peer
  ncclComm_t comm;
  Stream* stream;
};

thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group;

std::string comm_text(ncclComm_t c) {
  std::ostringstream os;
  os << "rank " << c->rank << " of a communicator of " << c->size << " (world ranks";
  for (int w : c->world_ranks) os << " " << w;
  os << ") on device " << c->device;
  return os.str();
}

ncclResult_t check_buffer(ncclComm_t comm, const char* op, const char* role, const void* p,
                          std::size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  if (!p) return fail(comm, ncclInvalidArgument, std::string(op) + ": a null " + role);
  const Lookup l = find_allocation(p);
  if (!l.found || (l.a.kind != MemKind::kDevice && l.a.kind != MemKind::kManaged) || l.a.freed) {
    return fail(
        comm, ncclInvalidArgument,
        std::string(op) + ": the " + role + " is not live device memory: " + describe_pointer(p));
  }
  if (l.a.kind == MemKind::kDevice && l.a.device != comm->device) {
    return fail(comm, ncclInvalidArgument,
                std::string(op) + ": the " + role + " is memory of device " +
                    std::to_string(l.a.device) + ", the communicator's device is " +
                    std::to_string(comm->device));
  }
  if (reinterpret_cast<std::uintptr_t>(p) + bytes > l.a.base + l.a.bytes) {
    return fail(comm, ncclInvalidArgument,
                std::string(op) + ": the " + role + " (" + std::to_string(bytes) +
                    " bytes) runs past its allocation: " + describe_pointer(p));
  }
  return ncclSuccess;
}

// Waits for a started (non-blocking) communicator.
ncclResult_t ready(ncclComm_t comm) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "a null communicator");
  std::call_once(comm->joined, [comm] {
    if (comm->init.joinable()) comm->init.join();
  });
  if (comm->aborted.load()) return fail(comm, ncclInvalidUsage, "the communicator was aborted");
  const int a = comm->async.load();
  if (a != ncclSuccess) return static_cast<ncclResult_t>(a);
  return ncclSuccess;
}

// Posts one operation as non-blocking MPI; extra buffers it needs live in `keep`.
void post(const Op& op, std::vector<MPI_Request>& reqs, std::vector<std::vector<char>>& keep) {
  ncclComm_t c = op.comm;
  const MPI_Datatype t = mpi_type(op.type);
  const int n = static_cast<int>(op.count);
  const std::size_t bytes = op.count * type_bytes(op.type);
  MPI_Request r = MPI_REQUEST_NULL;
  switch (op.kind) {
    case Kind::kAllReduce:
      MPI_Iallreduce(op.send == op.recv ? MPI_IN_PLACE : op.send, op.recv, n, t,
                     mpi_op(op.red, op.type), c->mpi, &r);
      break;
    case Kind::kReduce: {
      const bool root = c->rank == op.peer;
      MPI_Ireduce(root && op.send == op.recv ? MPI_IN_PLACE : op.send, root ? op.recv : nullptr, n,
                  t, mpi_op(op.red, op.type), op.peer, c->mpi, &r);
      break;
    }
    case Kind::kReduceScatter: {
      // NCCL's in-place form (recv = send + rank * count) is not MPI's: stage the input.
      keep.emplace_back(static_cast<const char*>(op.send),
                        static_cast<const char*>(op.send) + bytes * c->size);
      MPI_Ireduce_scatter_block(keep.back().data(), op.recv, n, t, mpi_op(op.red, op.type), c->mpi,
                                &r);
      break;
    }
    case Kind::kAllGather: {
      const bool in_place = op.send == static_cast<const char*>(op.recv) + bytes * c->rank;
      MPI_Iallgather(in_place ? MPI_IN_PLACE : op.send, n, t, op.recv, n, t, c->mpi, &r);
      break;
    }
    case Kind::kBroadcast:
      if (c->rank == op.peer && op.send != op.recv) std::memcpy(op.recv, op.send, bytes);
      MPI_Ibcast(op.recv, n, t, op.peer, c->mpi, &r);
      break;
    case Kind::kSend:
      // Synchronous: complete only when the peer's receive is posted, as NCCL's send.
      MPI_Issend(op.send, n, t, op.peer, 0, c->mpi, &r);
      break;
    case Kind::kRecv:
      MPI_Irecv(op.recv, n, t, op.peer, 0, c->mpi, &r);
      break;
  }
  reqs.push_back(r);
}

void finish_avg(const Op& op) {
  if (op.kind != Kind::kAllReduce && op.kind != Kind::kReduceScatter) return;
  const double inv = 1.0 / op.comm->size;
  if (op.type == ncclFloat32) {
    auto* p = static_cast<float*>(op.recv);
    for (std::size_t i = 0; i < op.count; ++i) p[i] = static_cast<float>(p[i] * inv);
  } else if (op.type == ncclFloat64) {
    auto* p = static_cast<double*>(op.recv);
    for (std::size_t i = 0; i < op.count; ++i) p[i] *= inv;
  }
}

// On the stream worker: the operations of one call or one group.
void run(const std::vector<Op>& ops) {
  std::vector<MPI_Request> reqs;
  std::vector<std::vector<char>> keep;
  for (const Op& op : ops) {
    ncclComm_t c = op.comm;
    if (c->aborted.load()) return;
    if (c->mpi == MPI_COMM_NULL) {  // one rank, no MPI: every collective is a copy
      const std::size_t bytes = op.count * type_bytes(op.type);
      if (op.kind == Kind::kSend || op.kind == Kind::kRecv) continue;
      if (op.send != op.recv && op.recv) std::memmove(op.recv, op.send, bytes);
      continue;
    }
    std::lock_guard<std::mutex> lock(c->mu);
    post(op, reqs, keep);
  }
  const auto start = std::chrono::steady_clock::now();
  bool warned = false;
  for (;;) {
    int done = 0;
    {
      std::lock_guard<std::mutex> lock(ops.front().comm->mu);
      MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    }
    if (done) break;
    for (const Op& op : ops) {
      if (op.comm->aborted.load()) return;  // ncclCommAbort frees the stream (requests leak)
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!warned && waited > stall_seconds()) {
      warned = true;
      std::ostringstream os;
      os << "cuemu NCCL: " << comm_text(ops.front().comm) << ": ";
      for (const Op& op : ops) {
        os << kind_name(op.kind);
        if (op.kind == Kind::kSend || op.kind == Kind::kRecv) os << " (peer " << op.peer << ")";
        os << " ";
      }
      os << "has not completed after " << waited
         << " s. NCCL blocks a send until the peer posts the matching receive (in posting order, "
            "no tags): two ranks that both send first deadlock; group them with "
            "ncclGroupStart/ncclGroupEnd. A collective waits for every rank to join.";
      std::fprintf(stderr, "%s\n", os.str().c_str());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(waited < 0.01 ? 5 : 200));
  }
  for (const Op& op : ops) {
    if (op.red == ncclAvg) finish_avg(op);
  }
}

ncclResult_t submit(Op op) {
  ncclComm_t c = op.comm;
  if (const ncclResult_t r = ready(c); r != ncclSuccess) return r;
  Stream* s = resolve_stream(reinterpret_cast<cudaStream_t>(op.stream));
  if (!s)
    return fail(c, ncclInvalidArgument, std::string(kind_name(op.kind)) + ": an invalid stream");
  if (s->device != c->device) {
    return fail(c, ncclInvalidUsage,
                std::string(kind_name(op.kind)) + ": the stream is on device " +
                    std::to_string(s->device) + ", the communicator on device " +
                    std::to_string(c->device));
  }
  op.stream = s;
  const std::size_t bytes = op.count * type_bytes(op.type);
  const char* name = kind_name(op.kind);
  if (type_bytes(op.type) == 0)
    return fail(c, ncclInvalidArgument, std::string(name) + ": bad datatype");
  const bool rooted = op.kind == Kind::kReduce || op.kind == Kind::kBroadcast;
  if ((rooted || op.kind == Kind::kSend || op.kind == Kind::kRecv) &&
      (op.peer < 0 || op.peer >= c->size)) {
    return fail(c, ncclInvalidArgument,
                std::string(name) + ": rank " + std::to_string(op.peer) +
                    " is not in the communicator of " + std::to_string(c->size));
  }
  if ((op.kind == Kind::kSend || op.kind == Kind::kRecv) && op.peer == c->rank &&
      t_group_depth == 0) {
    return fail(c, ncclInvalidUsage, std::string(name) + " to itself outside a group deadlocks");
  }
  ncclResult_t r = ncclSuccess;
  switch (op.kind) {
    case Kind::kAllReduce:
      r = check_buffer(c, name, "send buffer", op.send, bytes);
      if (r == ncclSuccess) r = check_buffer(c, name, "receive buffer", op.recv, bytes);
      break;
    case Kind::kReduce:
      r = check_buffer(c, name, "send buffer", op.send, bytes);
      if (r == ncclSuccess && c->rank == op.peer)
        r = check_buffer(c, name, "receive buffer", op.recv, bytes);
      break;
    case Kind::kReduceScatter:
      r = check_buffer(c, name, "send buffer", op.send, bytes * static_cast<std::size_t>(c->size));
      if (r == ncclSuccess) r = check_buffer(c, name, "receive buffer", op.recv, bytes);
      break;
    case Kind::kAllGather:
      r = check_buffer(c, name, "send buffer", op.send, bytes);
      if (r == ncclSuccess)
        r = check_buffer(c, name, "receive buffer", op.recv,
                         bytes * static_cast<std::size_t>(c->size));
      break;
    case Kind::kBroadcast:
      if (c->rank == op.peer) r = check_buffer(c, name, "send buffer", op.send, bytes);
      if (r == ncclSuccess) r = check_buffer(c, name, "receive buffer", op.recv, bytes);
      break;
    case Kind::kSend:
      r = check_buffer(c, name, "send buffer", op.send, bytes);
      break;
    case Kind::kRecv:
      r = check_buffer(c, name, "receive buffer", op.recv, bytes);
      break;
  }
  if (r != ncclSuccess) return r;
  if (t_group_depth > 0) {
    t_group.push_back(op);
    return ncclSuccess;
  }
  c->pending.fetch_add(1);
  enqueue(s, name, [op] {
    run({op});
    op.comm->pending.fetch_sub(1);
  });
  return ncclSuccess;
}

void wait_idle(ncclComm_t comm) {
  while (comm->pending.load() > 0 && !comm->aborted.load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// The rendezvous: every member tells the id's creator its NCCL rank, world rank and device; the
// creator checks them and answers with the world ranks in NCCL rank order.
ncclResult_t start(ncclComm_t comm, int nranks, const ncclUniqueId& id, int rank) {
  IdData d;
  std::memcpy(&d, id.internal, sizeof(d));
  if (d.magic != kIdMagic)
    return fail(comm, ncclInvalidArgument, "the unique id was not made by ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return fail(comm, ncclInvalidArgument,
                "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " ranks");
  }
  comm->rank = rank;
  comm->size = nranks;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (nranks == 1 && !initialized) {
    comm->world_ranks = {0};
    return ncclSuccess;
  }
  if (const ncclResult_t r = check_mpi(comm); r != ncclSuccess) return r;
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  const int tag = kTagBase + static_cast<int>(d.seq % 20000u);
  const Hello mine{d.seq, rank, world, comm->device, host_hash()};
  std::vector<int> result(static_cast<std::size_t>(nranks) + 1, -1);  // [status, world ranks...]
  if (world == d.creator_world) {
    std::vector<Hello> all(static_cast<std::size_t>(nranks), Hello{0, -1, -1, -1, 0});
    all[static_cast<std::size_t>(rank)] = mine;
    std::string problem;
    for (int i = 1; i < nranks; ++i) {
      Hello h{};
      MPI_Recv(&h, sizeof(h), MPI_BYTE, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (h.seq != d.seq || h.rank < 0 || h.rank >= nranks ||
          all[static_cast<std::size_t>(h.rank)].rank >= 0) {
        problem = "rank " + std::to_string(h.rank) + " (world rank " + std::to_string(h.world) +
                  ") joined twice or out of range";
        continue;
      }
      all[static_cast<std::size_t>(h.rank)] = h;
    }
    for (int i = 0; i < nranks && problem.empty(); ++i) {
      for (int j = 0; j < i; ++j) {
        if (all[i].host == all[j].host && all[i].device == all[j].device) {
          problem = "ranks " + std::to_string(j) + " and " + std::to_string(i) + " (world ranks " +
                    std::to_string(all[j].world) + " and " + std::to_string(all[i].world) +
                    ") are both on device " + std::to_string(all[i].device) +
                    " of one host: NCCL refuses a duplicate GPU (ranks that share a GPU need the "
                    "host-staged communicator)";
          break;
        }
      }
    }
    result[0] = problem.empty() ? 0 : 1;
    for (int i = 0; i < nranks; ++i)
      result[static_cast<std::size_t>(i) + 1] = all[static_cast<std::size_t>(i)].world;
    for (int i = 0; i < nranks; ++i) {
      if (i == rank) continue;
      MPI_Send(result.data(), nranks + 1, MPI_INT, all[static_cast<std::size_t>(i)].world, tag,
               MPI_COMM_WORLD);
    }
    if (!problem.empty()) return fail(comm, ncclInvalidUsage, problem);
  } else {
    MPI_Send(&mine, sizeof(mine), MPI_BYTE, d.creator_world, tag, MPI_COMM_WORLD);
    MPI_Recv(result.data(), nranks + 1, MPI_INT, d.creator_world, tag, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    if (result[0] != 0) {
      return fail(comm, ncclInvalidUsage,
                  "the communicator could not start: a duplicate GPU or a bad rank (see the id's "
                  "creator, world rank " +
                      std::to_string(d.creator_world) + ")");
    }
  }
  comm->world_ranks.assign(result.begin() + 1, result.end());
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, comm->world_ranks.data(), &group);
  MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm->mpi);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  return ncclSuccess;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  static thread_local std::string text;
  if (comm) {
    std::lock_guard<std::mutex> lock(comm->mu);
    text = comm->last_error;
  } else {
    text = t_last_error;
  }
  return text.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  IdData d{};
  d.magic = kIdMagic;
  int initialized = 0;
  MPI_Initialized(&initialized);
  d.creator_world = -1;
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &d.creator_world);
  d.seq = ++g_seq;
  d.nonce = std::random_device{}();
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, &d, sizeof(d));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* cfg) {
  if (!out) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: a null result pointer");
  auto* comm = new ncclComm;
  comm->device = current_device();
  *out = comm;
  if (cfg && cfg->blocking == 0) {
    comm->async = ncclInProgress;
    comm->init =
        std::thread([comm, nranks, id, rank] { comm->async = start(comm, nranks, id, rank); });
    return ncclInProgress;
  }
  const ncclResult_t r = start(comm, nranks, id, rank);
  if (r != ncclSuccess) {
    delete comm;
    *out = nullptr;
  }
  return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* cfg) {
  if (const ncclResult_t r = ready(comm); r != ncclSuccess) return r;
  // A split is a host-side collective of the parent: its queued operations finish first, so that
  // MPI sees the collectives of the parent in the same order on every rank.
  wait_idle(comm);
  auto split = [comm, color, key](ncclComm_t child) -> ncclResult_t {
    MPI_Comm m = MPI_COMM_NULL;
    if (comm->mpi == MPI_COMM_NULL) {
      if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
      child->rank = 0;
      child->size = 1;
      child->world_ranks = {0};
      return ncclSuccess;
    }
    {
      std::lock_guard<std::mutex> lock(comm->mu);
      MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m);
    }
    if (m == MPI_COMM_NULL) return ncclSuccess;
    child->mpi = m;
    MPI_Comm_rank(m, &child->rank);
    MPI_Comm_size(m, &child->size);
    MPI_Group g, wg;
    MPI_Comm_group(m, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    std::vector<int> mine(static_cast<std::size_t>(child->size));
    for (int i = 0; i < child->size; ++i) mine[static_cast<std::size_t>(i)] = i;
    child->world_ranks.resize(static_cast<std::size_t>(child->size));
    MPI_Group_translate_ranks(g, child->size, mine.data(), wg, child->world_ranks.data());
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    return ncclSuccess;
  };
  auto* child = new ncclComm;
  child->device = comm->device;
  const ncclResult_t r = split(child);
  if (r != ncclSuccess || (child->mpi == MPI_COMM_NULL && color == NCCL_SPLIT_NOCOLOR)) {
    delete child;
    *newcomm = nullptr;
    return r;
  }
  *newcomm = child;
  if (cfg && cfg->blocking == 0) return ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (const ncclResult_t r = ready(comm); r != ncclSuccess) return r;
  wait_idle(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  std::call_once(comm->joined, [comm] {
    if (comm->init.joinable()) comm->init.join();
  });
  if (!comm->aborted.load()) {
    wait_idle(comm);
    if (comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
    delete comm;
  }
  // An aborted communicator may have requests still posted: it is left to the process's end.
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->aborted = true;
  comm->async = ncclRemoteError;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm)
    return fail(nullptr, ncclInvalidArgument, "ncclCommGetAsyncError: a null communicator");
  *async_error = static_cast<ncclResult_t>(comm->async.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (const ncclResult_t r = ready(comm); r != ncclSuccess) return r;
  *count = comm->size;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (const ncclResult_t r = ready(comm); r != ncclSuccess) return r;
  *device = comm->device;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (const ncclResult_t r = ready(comm); r != ncclSuccess) return r;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* s, void* r, std::size_t n, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t c, cudaStream_t st) {
  return submit({Kind::kAllReduce, s, r, n, t, op, 0, c, reinterpret_cast<Stream*>(st)});
}
ncclResult_t ncclReduce(const void* s, void* r, std::size_t n, ncclDataType_t t, ncclRedOp_t op,
                        int root, ncclComm_t c, cudaStream_t st) {
  return submit({Kind::kReduce, s, r, n, t, op, root, c, reinterpret_cast<Stream*>(st)});
}
ncclResult_t ncclReduceScatter(const void* s, void* r, std::size_t n, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  return submit({Kind::kReduceScatter, s, r, n, t, op, 0, c, reinterpret_cast<Stream*>(st)});
}
ncclResult_t ncclAllGather(const void* s, void* r, std::size_t n, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t st) {
  return submit({Kind::kAllGather, s, r, n, t, ncclSum, 0, c, reinterpret_cast<Stream*>(st)});
}
ncclResult_t ncclBroadcast(const void* s, void* r, std::size_t n, ncclDataType_t t, int root,
                           ncclComm_t c, cudaStream_t st) {
  return submit({Kind::kBroadcast, s, r, n, t, ncclSum, root, c, reinterpret_cast<Stream*>(st)});
}
ncclResult_t ncclSend(const void* s, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t st) {
  return submit({Kind::kSend, s, nullptr, n, t, ncclSum, peer, c, reinterpret_cast<Stream*>(st)});
}
ncclResult_t ncclRecv(void* r, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t st) {
  return submit({Kind::kRecv, nullptr, r, n, t, ncclSum, peer, c, reinterpret_cast<Stream*>(st)});
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0)
    return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(t_group);
  if (ops.empty()) return ncclSuccess;
  // The whole group runs as one task on its first operation's stream; the other streams of the
  // group order after it, and it after their earlier work (NCCL makes a group's streams wait for
  // one another).
  Stream* first = ops.front().stream;
  std::vector<std::pair<Stream*, std::uint64_t>> deps;
  std::vector<Stream*> others;
  for (const Op& op : ops) {
    if (op.stream != first && std::find(others.begin(), others.end(), op.stream) == others.end()) {
      others.push_back(op.stream);
    }
  }
  for (Stream* o : others) deps.emplace_back(o, queued(o));
  for (const Op& op : ops) op.comm->pending.fetch_add(1);
  const std::uint64_t seq = enqueue(
      first, "ncclGroupEnd",
      [ops] {
        run(ops);
        for (const Op& op : ops) op.comm->pending.fetch_sub(1);
      },
      deps);
  for (Stream* o : others) enqueue(o, "ncclGroupEnd (wait)", [] {}, {{first, seq}});
  return ncclSuccess;
}

}  // extern "C"
