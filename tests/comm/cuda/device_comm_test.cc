// The communicators for device buffers (comm/nccl_communicator.h) on real MPI processes: every
// collective and point-to-point on GPU buffers against the values the MPI communicator's contract
// gives, through the host-staged communicator (ranks sharing one GPU) and NCCL (one GPU per rank),
// the split groups, and NCCL's watchdog: a wait does not stop the host (it orders the compute
// stream), and a rank that does not join makes the others fail within the timeout with the MPI
// communicator's error. Skipped, with the reason, without the GPUs.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "trident/comm/mpi_communicator.h"
#include "trident/comm/nccl_communicator.h"
#include "trident/core/error.h"
#include "trident/kernels/cuda/device.h"
#ifdef TRIDENT_CUDA_EMULATED
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace trident::comm {
namespace {

namespace cuda = trident::kernels::cuda;

std::unique_ptr<MpiCommunicator> make_world(double timeout_s = 60.0) {
  int argc = 0;
  char** argv = nullptr;
  MpiRuntime runtime(argc, argv);
  return MpiCommunicator::world(runtime, WaitPolicy{.timeout_s = timeout_s});
}

std::vector<float> to_host(const cuda::DeviceBuffer& b, std::int64_t n) {
  std::vector<float> h(static_cast<std::size_t>(n));
  cuda::copy_to_host(h.data(), b.data(), n * 4, nullptr);
  cuda::synchronize(nullptr);
  return h;
}

cuda::DeviceBuffer to_device(const std::vector<float>& h) {
  cuda::DeviceBuffer b(static_cast<std::int64_t>(h.size() * 4) + 4);
  cuda::copy_to_device(b.data(), h.data(), static_cast<std::int64_t>(h.size() * 4), nullptr);
  cuda::synchronize(nullptr);
  return b;
}

// value of element i contributed by rank r
float v(int r, std::int64_t i) {
  return static_cast<float>(r + 1) * 0.5f + static_cast<float>(i % 97);
}

void check_collectives(Communicator& c) {
  const int R = c.size(), me = c.rank();
  const std::int64_t n = 1000;
  {  // all_reduce
    std::vector<float> h(n);
    for (std::int64_t i = 0; i < n; ++i) h[i] = v(me, i);
    auto d = to_device(h);
    c.all_reduce(d.data(), n, Datatype::kF32, ReduceOp::kSum);
    const auto got = to_host(d, n);
    for (std::int64_t i = 0; i < n; ++i) {
      float want = 0.0f;
      for (int r = 0; r < R; ++r) want += v(r, i);
      ASSERT_FLOAT_EQ(got[i], want) << c.name() << " all_reduce element " << i;
    }
  }
  {  // reduce_scatter, in place on this rank's block
    std::vector<float> h(n * R);
    for (std::int64_t i = 0; i < n * R; ++i) h[i] = v(me, i);
    auto d = to_device(h);
    float* mine = d.as<float>() + me * n;
    c.reduce_scatter(d.data(), mine, n, Datatype::kF32, ReduceOp::kSum);
    std::vector<float> got(n);
    cuda::copy_to_host(got.data(), mine, n * 4, nullptr);
    cuda::synchronize(nullptr);
    for (std::int64_t i = 0; i < n; ++i) {
      float want = 0.0f;
      for (int r = 0; r < R; ++r) want += v(r, me * n + i);
      ASSERT_FLOAT_EQ(got[i], want) << c.name() << " reduce_scatter element " << i;
    }
  }
  {  // reduce_scatter_v and all_gather_v with uneven blocks
    std::vector<std::int64_t> counts(static_cast<std::size_t>(R));
    std::int64_t total = 0, offset = 0;
    for (int r = 0; r < R; ++r) {
      counts[static_cast<std::size_t>(r)] = 7 + 5 * r;
      if (r < me) offset += counts[static_cast<std::size_t>(r)];
      total += counts[static_cast<std::size_t>(r)];
    }
    std::vector<float> h(total);
    for (std::int64_t i = 0; i < total; ++i) h[i] = v(me, i);
    auto d = to_device(h);
    const std::int64_t mine_n = counts[static_cast<std::size_t>(me)];
    cuda::DeviceBuffer out(mine_n * 4);
    c.reduce_scatter_v(d.data(), out.data(), counts, Datatype::kF32, ReduceOp::kSum);
    const auto got = to_host(out, mine_n);
    for (std::int64_t i = 0; i < mine_n; ++i) {
      float want = 0.0f;
      for (int r = 0; r < R; ++r) want += v(r, offset + i);
      ASSERT_FLOAT_EQ(got[i], want) << c.name() << " reduce_scatter_v element " << i;
    }
    cuda::DeviceBuffer all(total * 4);
    c.all_gather_v(out.data(), all.data(), counts, Datatype::kF32);
    const auto gathered = to_host(all, total);
    for (std::int64_t i = 0; i < total; ++i) {
      float want = 0.0f;
      for (int r = 0; r < R; ++r) want += v(r, i);
      ASSERT_FLOAT_EQ(gathered[i], want) << c.name() << " all_gather_v element " << i;
    }
  }
  {  // all_to_all_v: rank a sends rank b 3 + 2a + b values (rank 0 sends rank 0 none when R > 1)
    auto count = [&](int a, int b) -> std::int64_t {
      return a == 0 && b == 0 && R > 1 ? 0 : 3 + 2 * a + b;
    };
    std::vector<std::int64_t> send, recv;
    std::vector<float> h, want;
    for (int b = 0; b < R; ++b) {
      send.push_back(count(me, b));
      for (std::int64_t j = 0; j < count(me, b); ++j) h.push_back(v(me, 100 * b + j));
    }
    for (int a = 0; a < R; ++a) {
      recv.push_back(count(a, me));
      for (std::int64_t j = 0; j < count(a, me); ++j) want.push_back(v(a, 100 * me + j));
    }
    auto d = to_device(h);
    cuda::DeviceBuffer out(static_cast<std::int64_t>(want.size()) * 4);
    c.all_to_all_v(d.data(), send, out.data(), recv, Datatype::kF32);
    const auto got = to_host(out, static_cast<std::int64_t>(want.size()));
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << c.name() << " all_to_all_v element " << i;
    }
  }
  {  // all_gather in place and broadcast
    cuda::DeviceBuffer all(n * R * 4);
    std::vector<float> h(n);
    for (std::int64_t i = 0; i < n; ++i) h[i] = v(me, i);
    cuda::copy_to_device(all.as<float>() + me * n, h.data(), n * 4, nullptr);
    cuda::synchronize(nullptr);
    c.all_gather(all.as<float>() + me * n, all.data(), n, Datatype::kF32);
    const auto got = to_host(all, n * R);
    for (int r = 0; r < R; ++r)
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[r * n + i], v(r, i)) << c.name() << " all_gather block " << r;
    auto b = to_device(h);
    c.broadcast(b.data(), n, Datatype::kF32, R - 1);
    const auto bc = to_host(b, n);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(bc[i], v(R - 1, i)) << c.name() << " broadcast";
  }
  {  // a ring of send/recv (non-blocking both ways)
    std::vector<float> h(n);
    for (std::int64_t i = 0; i < n; ++i) h[i] = v(me, i);
    auto s = to_device(h);
    cuda::DeviceBuffer r(n * 4);
    const int next = (me + 1) % R, prev = (me + R - 1) % R;
    Request rr = c.irecv(r.data(), n, Datatype::kF32, prev, 3);
    Request sr = c.isend(s.data(), n, Datatype::kF32, next, 3);
    sr.wait();
    rr.wait();
    const auto got = to_host(r, n);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], v(prev, i)) << c.name() << " recv";
  }
  c.barrier();
}

void check_split(Communicator& c) {
  auto half = c.split(c.rank() % 2, c.rank(), "half");
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->name(), "half");
  const float one = 1.0f;
  cuda::DeviceBuffer d(4);
  cuda::copy_to_device(d.data(), &one, 4, nullptr);
  half->all_reduce(d.data(), 1, Datatype::kF32, ReduceOp::kSum);
  float got = 0.0f;
  cuda::copy_to_host(&got, d.data(), 4, nullptr);
  cuda::synchronize(nullptr);
  EXPECT_EQ(got, static_cast<float>(half->size()));
}

TEST(DeviceComm, HostStagedRanksShareOneGpu) {
  if (cuda::device_count() == 0)
    GTEST_SKIP() << "CUDA tests need a GPU: " << cuda::no_device_reason();
  cuda::set_device(0);
  HostStagedCommunicator c(make_world());
  check_collectives(c);
  check_split(c);
}

TEST(DeviceComm, NcclOneGpuPerRank) {
  auto world = make_world();
  const int gpus = cuda::device_count();
  if (gpus < world->size()) {
    GTEST_SKIP() << "CUDA tests need a GPU: NCCL needs one GPU per rank (" << gpus << " GPUs for "
                 << world->size() << " ranks)";
  }
  const int me = world->rank();
  auto c = NcclCommunicator::create(std::move(world), me % gpus);
  check_collectives(*c);
  check_split(*c);
}

TEST(DeviceComm, NcclWatchdogTurnsAStuckOperationIntoCommError) {
  auto world = make_world();
  const int gpus = cuda::device_count();
  if (gpus < world->size()) {
    GTEST_SKIP() << "CUDA tests need a GPU: NCCL needs one GPU per rank (" << gpus << " GPUs for "
                 << world->size() << " ranks)";
  }
  const int me = world->rank();
  auto sync = make_world();
  auto c = NcclCommunicator::create(std::move(world), me % gpus);
  c->set_timeout(3.0);
  c->set_step(41);
  cuda::DeviceBuffer d(4);
  if (me == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    std::string msg;
    try {
      // The wait is ordered on the device: the host goes on although rank 1 never joins.
      c->all_reduce(d.data(), 1, Datatype::kF32, ReduceOp::kSum);
      EXPECT_LT(seconds(), 2.0) << "the host waited for the all_reduce";
      // The stream waits for the all_reduce until the watchdog aborts the communicator (3 s);
      // the communicator's next call throws the watchdog's error.
      cuda::synchronize(nullptr);
      EXPECT_GE(seconds(), 2.5) << "the stream did not wait for the all_reduce";
      c->all_reduce(d.data(), 1, Datatype::kF32, ReduceOp::kSum);
      ADD_FAILURE() << "the communicator is usable after its watchdog fired";
    } catch (const core::Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("timed out after 3 s"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'world'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 41"), std::string::npos) << msg;
    EXPECT_LT(seconds(), 30.0);
  }
  sync->barrier();
}

#ifdef TRIDENT_CUDA_EMULATED
// The emulated NCCL keeps NCCL's blocking rule: an ungrouped ncclRecv waits for its data and
// holds the stream, so two ranks that each post a receive before their send on one stream
// deadlock (as they would on NCCL); ncclCommAbort frees the stream. The same exchange grouped
// completes. (Emulator only: on a GPU the first half would hang the test.)
TEST(DeviceComm, EmulatedNcclKeepsNcclsBlockingRuleForSendAndRecv) {
  auto world = make_world();
  const int me = world->rank(), peer = 1 - me;
  ASSERT_EQ(world->size(), 2);
  ASSERT_GE(cuda::device_count(), 2) << "run with CUEMU_DEVICE_COUNT=2";
  cuda::set_device(me);
  ncclUniqueId id{};
  if (me == 0) {
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  world->broadcast(&id, static_cast<std::int64_t>(sizeof(id)), Datatype::kU8, 0);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cuda::DeviceBuffer out(64), in(64);
  for (const bool grouped : {false, true}) {
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRank(&comm, 2, id, me), ncclSuccess);
    if (grouped) ncclGroupStart();
    ASSERT_EQ(ncclRecv(in.data(), 16, ncclFloat32, peer, comm, s), ncclSuccess);
    ASSERT_EQ(ncclSend(out.data(), 16, ncclFloat32, peer, comm, s), ncclSuccess);
    if (grouped) ncclGroupEnd();
    if (grouped) {
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the ungrouped exchange completed";
      ncclCommAbort(comm);
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess) << "the abort freed the stream";
    }
    world->barrier();
    if (me == 0) {
      ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    }
    world->broadcast(&id, static_cast<std::int64_t>(sizeof(id)), Datatype::kU8, 0);
  }
  cudaStreamDestroy(s);
}
#endif

}  // namespace
}  // namespace trident::comm
