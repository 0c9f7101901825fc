// Tests of cuemu itself: each rule the emulator enforces, shown by a deliberately broken kernel or
// call that it must catch (a test here fails if the emulator stops catching it), and the
// documented CUDA semantics it must keep (stream order, the legacy stream, copies from pageable
// memory, events, the stream-ordered allocator, cuBLASLt's layouts). This file is CUDA source: it
// is rewritten by cuemu_rewrite like the project's kernels (tests/cuda_emu/CMakeLists.txt).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuemu/cuemu.h"

namespace {

// ---- kernels
// ---------------------------------------------------------------------------------------

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// A correct block reduction (as kernels/cuda/cuda_util.cuh's block_sum) and one with the barrier
// between writing the warp partials and reading them removed.
template <bool kBarrier>
__global__ void block_sum_kernel(float* out, const float* in) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float v = warp_sum(in[blockIdx.x * blockDim.x + threadIdx.x]);
  if (lane == 0) partial[warp] = v;
  if (kBarrier) __syncthreads();
  const int warps = blockDim.x >> 5;
  float r = lane < warps ? partial[lane] : 0.0f;
  r = warp_sum(r);
  if (threadIdx.x == 0) out[blockIdx.x] = r;
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 32) __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void barrier_after_exit_kernel(float* out, int n) {
  if (static_cast<int>(threadIdx.x) >= n) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void shuffle_after_exit_kernel(float* out) {
  const int lane = threadIdx.x & 31;
  if (lane >= 16) return;
  out[lane] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void half_warp_shuffle_half_barrier_kernel(float* out) {
  if ((threadIdx.x & 31) < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  } else {
    __syncthreads();
  }
}

__global__ void partial_mask_kernel(unsigned* out) {
  const unsigned lane = threadIdx.x & 31;
  // Two converged groups of 16 lanes, each with its own mask: legal.
  const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  const unsigned b = __ballot_sync(mask, lane % 3 == 0);
  const float down = __shfl_down_sync(mask, static_cast<float>(lane), 1, 16);
  out[lane] = b;
  out[32 + lane] = static_cast<unsigned>(down);
}

__global__ void mask_without_self_kernel(float* out) {
  if (threadIdx.x == 0) out[0] = __shfl_sync(0x2u, 1.0f, 1);
}

__global__ void mask_of_missing_lanes_kernel(float* out) {
  // The block has 48 threads: lanes 16..31 of warp 1 do not exist.
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void read_outside_mask_kernel(float* out) {
  const unsigned lane = threadIdx.x & 31;
  if (lane < 8) out[lane] = __shfl_sync(0xffu, 1.0f, 9);  // lane 9 is not in the mask
}

struct Params {
  const float* in;
  float* out;
  int n;
};

__global__ void struct_arg_kernel(Params p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.out[i] = 2.0f * p.in[i];
}

__global__ void copy_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

__global__ void add_one_kernel(float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] += 1.0f;
}

__global__ void dynamic_shared_kernel(float* out) {
  extern __shared__ float buf[];
  buf[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

__global__ void shared_read_before_write_kernel(float* out) {
  __shared__ float s[64];
  out[threadIdx.x] = s[threadIdx.x];  // never written: garbage on a GPU, NaN here
}

__global__ void syncthreads_count_kernel(int* out) {
  const int c = __syncthreads_count(threadIdx.x % 4 == 0);
  const int a = __syncthreads_and(threadIdx.x < 1000);
  const int o = __syncthreads_or(threadIdx.x == 5);
  if (threadIdx.x == 0) {
    out[0] = c;
    out[1] = a;
    out[2] = o;
  }
}

__global__ void index_kernel(unsigned* out) {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

__global__ void spin_kernel(float* x, int rounds) {
  for (int r = 0; r < rounds; ++r) x[threadIdx.x] = x[threadIdx.x] * 0.5f + 1.0f;
}

// ---- helpers
// ---------------------------------------------------------------------------------------

class Emu : public ::testing::Test {
 protected:
  void SetUp() override { cuemu::reset_errors(); }
  void TearDown() override { cuemu::reset_errors(); }
};

float* device_floats(std::size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
  return static_cast<float*>(p);
}

std::vector<float> to_host(const float* d, std::size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// The fault of the last launch: cudaGetLastError's code and the detail in its error string.
std::string launch_error(cudaError_t* code = nullptr) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (code) *code = e;
  return e == cudaSuccess ? "no error" : cudaGetErrorString(e);
}

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// ---- rules: what a GPU would not do
// ----------------------------------------------------------------

TEST_F(Emu, BlockReductionIsRight) {
  const int n = 256 * 3;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i % 7);
  float* in = device_floats(n);
  float* out = device_floats(3);
  cudaMemcpy(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  block_sum_kernel<true><<<3, 256>>>(out, in);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> r = to_host(out, 3);
  for (int b = 0; b < 3; ++b) {
    double want = 0;
    for (int i = 0; i < 256; ++i) want += h[b * 256 + i];
    EXPECT_EQ(r[b], static_cast<float>(want)) << "block " << b;
  }
  cudaFree(in);
  cudaFree(out);
}

// The barrier between the warps' partials and their reading removed: warp 0 reads the partials
// of warps that have not run yet, which the emulator poisoned (NaN), so the result is visibly
// wrong, as it would be (intermittently) on a GPU.
TEST_F(Emu, AMissingBarrierInABlockReductionGivesAWrongResult) {
  const int n = 256;
  std::vector<float> h(n, 1.0f);
  float* in = device_floats(n);
  float* out = device_floats(1);
  cudaMemcpy(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  block_sum_kernel<false><<<1, 256>>>(out, in);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const float r = to_host(out, 1)[0];
  EXPECT_TRUE(std::isnan(r)) << "the reduction without its barrier gave " << r
                             << " (256 expected from a correct one)";
  cudaFree(in);
  cudaFree(out);
}

TEST_F(Emu, ADivergentBarrierFailsTheLaunchNamingKernelBlockThreadAndLine) {
  float* out = device_floats(64);
  divergent_barrier_kernel<<<1, 64>>>(out);
  cudaError_t code{};
  const std::string e = launch_error(&code);
  EXPECT_EQ(code, cudaErrorLaunchFailure) << e;
  EXPECT_TRUE(has(e, "divergent_barrier_kernel")) << e;
  EXPECT_TRUE(has(e, "block (0,0,0) thread (")) << e;
  EXPECT_TRUE(has(e, "__syncthreads at cuemu_test.cu:")) << e;
  EXPECT_TRUE(has(e, "divergent code")) << e;
}

TEST_F(Emu, ABarrierAfterSomeThreadsReturnedIsDivergence) {
  float* out = device_floats(64);
  barrier_after_exit_kernel<<<1, 64>>>(out, 40);
  const std::string e = launch_error();
  EXPECT_TRUE(has(e, "barrier_after_exit_kernel")) << e;
  EXPECT_TRUE(has(e, "divergent code")) << e;
  // Every thread reaching it is fine.
  cuemu::reset_errors();
  barrier_after_exit_kernel<<<1, 64>>>(out, 64);
  EXPECT_EQ(launch_error(), "no error");
}

TEST_F(Emu, AShuffleAfterLanesExitedFailsNamingTheLanes) {
  float* out = device_floats(32);
  shuffle_after_exit_kernel<<<1, 32>>>(out);
  const std::string e = launch_error();
  EXPECT_TRUE(has(e, "shuffle_after_exit_kernel")) << e;
  EXPECT_TRUE(has(e, "__shfl_xor_sync")) << e;
  EXPECT_TRUE(has(e, "exited")) << e;
}

TEST_F(Emu, HalfAWarpAtAShuffleAndHalfAtABarrierIsADeadlockReportedAtOnce) {
  float* out = device_floats(64);
  const auto t0 = std::chrono::steady_clock::now();
  half_warp_shuffle_half_barrier_kernel<<<1, 64>>>(out);
  const std::string e = launch_error();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(has(e, "deadlock")) << e;
  EXPECT_TRUE(has(e, "__syncthreads at cuemu_test.cu:")) << e;
  EXPECT_TRUE(has(e, "__shfl_xor_sync at cuemu_test.cu:")) << e;
  EXPECT_LT(s, 5.0) << "no timeout: the deadlock is seen when every live thread waits";
}

TEST_F(Emu, PartialMasksOfConvergedGroupsWork) {
  unsigned* out = nullptr;
  cudaMalloc(&out, 64 * sizeof(unsigned));
  partial_mask_kernel<<<1, 32>>>(out);
  ASSERT_EQ(launch_error(), "no error");
  std::vector<unsigned> h(64);
  cudaMemcpy(h.data(), out, 64 * sizeof(unsigned), cudaMemcpyDeviceToHost);
  unsigned lo = 0, hi = 0;
  for (unsigned l = 0; l < 32; ++l) {
    if (l % 3 == 0) (l < 16 ? lo : hi) |= 1u << l;
  }
  for (unsigned l = 0; l < 32; ++l) {
    EXPECT_EQ(h[l], l < 16 ? lo : hi) << "ballot, lane " << l;
    // shfl_down within groups of 16: the last lane of each keeps its own value.
    EXPECT_EQ(h[32 + l], (l % 16) == 15 ? l : l + 1) << "shfl_down, lane " << l;
  }
  cudaFree(out);
}

TEST_F(Emu, BadMasksAreErrors) {
  float* out = device_floats(64);
  mask_without_self_kernel<<<1, 32>>>(out);
  std::string e = launch_error();
  EXPECT_TRUE(has(e, "does not hold the calling lane")) << e;
  cuemu::reset_errors();
  mask_of_missing_lanes_kernel<<<1, 48>>>(out);
  e = launch_error();
  EXPECT_TRUE(has(e, "do not exist")) << e;
  cuemu::reset_errors();
  read_outside_mask_kernel<<<1, 32>>>(out);
  e = launch_error();
  EXPECT_TRUE(has(e, "which is not in the mask")) << e;
}

TEST_F(Emu, AHostPointerInAnArgumentStructFailsTheLaunchNamingTheField) {
  float* dev = device_floats(16);
  std::vector<float> host(16, 1.0f);
  struct_arg_kernel<<<1, 16>>>(Params{host.data(), dev, 16});
  cudaError_t code{};
  const std::string e = launch_error(&code);
  EXPECT_EQ(code, cudaErrorIllegalAddress) << e;
  EXPECT_TRUE(has(e, "struct_arg_kernel")) << e;
  EXPECT_TRUE(has(e, "argument 1 field 0")) << e;
  EXPECT_TRUE(has(e, "not device memory")) << e;
}

TEST_F(Emu, AHostPointerArgumentAndPinnedMemoryAreRefused) {
  float* dev = device_floats(16);
  std::vector<float> host(16, 1.0f);
  copy_kernel<<<1, 16>>>(dev, host.data(), 16);
  std::string e = launch_error();
  EXPECT_TRUE(has(e, "argument 2")) << e;
  cuemu::reset_errors();
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 64, cudaHostAllocDefault), cudaSuccess);
  copy_kernel<<<1, 16>>>(dev, pinned, 16);
  e = launch_error();
  EXPECT_TRUE(has(e, "pinned host memory")) << e;
  cuemu::reset_errors();
  cudaFreeHost(pinned);
}

// Run by CTest with CUEMU_DEVICE_COUNT=2 (tests/cuda_emu/tests.cmake).
TEST(EmuTwoDevices, MemoryOfAnotherDeviceIsRefused) {
  int n = 0;
  cudaGetDeviceCount(&n);
  ASSERT_EQ(n, 2) << "run with CUEMU_DEVICE_COUNT=2";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  float* other = device_floats(16);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  float* mine = device_floats(16);
  copy_kernel<<<1, 16>>>(mine, other, 16);
  const std::string e = launch_error();
  EXPECT_TRUE(has(e, "memory of device 1 but the kernel runs on device 0")) << e;
  cuemu::reset_errors();
}

TEST_F(Emu, ACopyOfTheWrongKindIsRefused) {
  float* dev = device_floats(4);
  std::vector<float> host(4);
  const cudaError_t e = cudaMemcpy(host.data(), dev, 16, cudaMemcpyHostToDevice);
  EXPECT_EQ(e, cudaErrorInvalidValue);
  const std::string msg = cudaGetErrorString(e);
  EXPECT_TRUE(has(msg, "cudaMemcpyHostToDevice")) << msg;
  EXPECT_TRUE(has(msg, "the destination is not device memory")) << msg;
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST_F(Emu, ACopyPastTheEndOfItsAllocationIsRefused) {
  float* dev = device_floats(4);
  std::vector<float> host(8);
  const cudaError_t e = cudaMemcpy(dev, host.data(), 32, cudaMemcpyHostToDevice);
  EXPECT_EQ(e, cudaErrorInvalidValue);
  EXPECT_TRUE(has(cudaGetErrorString(e), "past the end")) << cudaGetErrorString(e);
  cudaGetLastError();
}

TEST_F(Emu, UninitializedDeviceAndSharedMemoryReadsAsNaN) {
  float* never_written = device_floats(8);
  float* out = device_floats(64);
  copy_kernel<<<1, 8>>>(out, never_written, 8);
  for (float v : to_host(out, 8)) EXPECT_TRUE(std::isnan(v)) << v;
  shared_read_before_write_kernel<<<1, 64>>>(out);
  for (float v : to_host(out, 64)) EXPECT_TRUE(std::isnan(v)) << v;
}

TEST_F(Emu, LaunchLimitsOfTheDeviceAreEnforced) {
  float* out = device_floats(32);
  copy_kernel<<<1, 2048>>>(out, out, 0);
  cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorInvalidConfiguration);
  EXPECT_TRUE(has(cudaGetErrorString(e), "2048 threads per block")) << cudaGetErrorString(e);
  copy_kernel<<<dim3(1, 70000), 32>>>(out, out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  copy_kernel<<<dim3(1, 1, 1), dim3(1, 1, 65)>>>(out, out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  copy_kernel<<<0, 32>>>(out, out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  dynamic_shared_kernel<<<1, 32, 64 * 1024>>>(out);
  e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorInvalidConfiguration);
  EXPECT_TRUE(has(cudaGetErrorString(e), "dynamic shared memory")) << cudaGetErrorString(e);
  // Launch errors are not sticky: the next launch works.
  dynamic_shared_kernel<<<1, 32, 32 * sizeof(float)>>>(out);
  ASSERT_EQ(launch_error(), "no error");
  const std::vector<float> h = to_host(out, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(h[i], static_cast<float>(31 - i));
}

TEST_F(Emu, BuiltInIndicesCoverThreeDimensionalGridsAndBlocks) {
  const dim3 grid(3, 2, 2), block(4, 2, 3);
  const unsigned threads = 24, blocks = 12;
  unsigned* out = nullptr;
  cudaMalloc(&out, threads * blocks * sizeof(unsigned));
  index_kernel<<<grid, block>>>(out);
  std::vector<unsigned> h(threads * blocks);
  cudaMemcpy(h.data(), out, h.size() * sizeof(unsigned), cudaMemcpyDeviceToHost);
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < threads; ++t) EXPECT_EQ(h[b * threads + t], b * 1000 + t);
  }
  int* counts = nullptr;
  cudaMalloc(&counts, 3 * sizeof(int));
  syncthreads_count_kernel<<<1, 100>>>(counts);
  int c[3];
  cudaMemcpy(c, counts, sizeof(c), cudaMemcpyDeviceToHost);
  EXPECT_EQ(c[0], 25);
  EXPECT_EQ(c[1], 1);
  EXPECT_EQ(c[2], 1);
}

TEST_F(Emu, UseAfterCudaFreeAsyncIsCaughtInStreamOrder) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 64 * sizeof(float), s), cudaSuccess);
  add_one_kernel<<<1, 64, 0, s>>>(p, 64);  // fine: before the free in stream order
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
  add_one_kernel<<<1, 64, 0, s>>>(p, 64);  // after it
  const cudaError_t e = cudaStreamSynchronize(s);
  EXPECT_EQ(e, cudaErrorIllegalAddress);
  EXPECT_TRUE(has(cudaGetErrorString(e), "freed")) << cudaGetErrorString(e);
  cuemu::reset_errors();
  cudaStreamDestroy(s);
}

TEST_F(Emu, AFaultIsStickyAsOnAGpu) {
  float* out = device_floats(64);
  divergent_barrier_kernel<<<1, 64>>>(out);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure) << "every later call fails";
  EXPECT_FALSE(cuemu::last_fault().empty());
}

// Run by CTest with CUEMU_STRICT_HOST=1 (tests/cuda_emu/tests.cmake): host code that touches
// device memory dies naming the allocation; kernels and copies still work, inline.
TEST(EmuStrictHost, HostCodeTouchingDeviceMemoryIsNamed) {
  ASSERT_NE(std::getenv("CUEMU_STRICT_HOST"), nullptr) << "run with CUEMU_STRICT_HOST=1";
  float* d = device_floats(16);
  ASSERT_EQ(cudaMemset(d, 0, 16 * sizeof(float)), cudaSuccess);
  add_one_kernel<<<1, 16>>>(d, 16);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : to_host(d, 16)) EXPECT_EQ(v, 1.0f);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        volatile float x = d[3];
        (void)x;
      },
      "host code accessed device memory");
  EXPECT_DEATH({ d[0] = 2.0f; }, "host code accessed device memory");
}

// ---- documented semantics
// ----------------------------------------------------------------------------

// A pageable source is staged before cudaMemcpyAsync returns: the caller may reuse the buffer.
TEST_F(Emu, APageableSourceIsStagedBeforeTheCallReturns) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float* dev = device_floats(256);
  spin_kernel<<<1, 256, 0, s>>>(dev, 2000);  // keeps the stream busy
  std::vector<float> host(256, 3.0f);
  cudaMemcpyAsync(dev, host.data(), 256 * sizeof(float), cudaMemcpyHostToDevice, s);
  std::fill(host.begin(), host.end(), -1.0f);
  std::vector<float> back(256);
  cudaMemcpyAsync(back.data(), dev, 256 * sizeof(float), cudaMemcpyDeviceToHost, s);
  // A pageable destination: the copy has completed when the call returns.
  for (float v : back) EXPECT_EQ(v, 3.0f);
  cudaStreamDestroy(s);
}

// The legacy default stream waits for the blocking streams' work, and they wait for it; a
// non-blocking stream does neither.
TEST_F(Emu, TheLegacyStreamSynchronizesWithBlockingStreams) {
  cudaStream_t blocking;
  cudaStreamCreate(&blocking);
  float* x = device_floats(256);
  cudaMemset(x, 0, 256 * sizeof(float));            // legacy stream
  add_one_kernel<<<1, 256, 0, blocking>>>(x, 256);  // after the memset
  add_one_kernel<<<1, 256>>>(x, 256);               // legacy: after the blocking stream's kernel
  add_one_kernel<<<1, 256, 0, blocking>>>(x, 256);  // after the legacy kernel
  cudaStreamSynchronize(blocking);
  for (float v : to_host(x, 256)) EXPECT_EQ(v, 3.0f);
  cudaStreamDestroy(blocking);
}

TEST_F(Emu, EventsOrderWorkAcrossStreams) {
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  cudaEvent_t done;
  cudaEventCreate(&done);
  float* x = device_floats(256);
  cudaMemsetAsync(x, 0, 256 * sizeof(float), a);
  spin_kernel<<<1, 256, 0, a>>>(x, 3000);  // 3000 rounds of x = x/2 + 1: converges to 2
  cudaEventRecord(done, a);
  cudaStreamWaitEvent(b, done, 0);
  add_one_kernel<<<1, 256, 0, b>>>(x, 256);
  cudaStreamSynchronize(b);
  for (float v : to_host(x, 256)) EXPECT_EQ(v, 3.0f);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, a);
  spin_kernel<<<1, 64, 0, a>>>(x, 100);
  cudaEventRecord(stop, a);
  cudaEventSynchronize(stop);
  float ms = -1.0f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  cudaEvent_t no_timing;
  cudaEventCreateWithFlags(&no_timing, cudaEventDisableTiming);
  cudaEventRecord(no_timing, a);
  cudaEventSynchronize(no_timing);
  EXPECT_NE(cudaEventElapsedTime(&ms, start, no_timing), cudaSuccess);
  cudaGetLastError();
  for (cudaEvent_t e : {done, start, stop, no_timing}) cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_F(Emu, PointerAttributesTellDeviceHostAndPinnedMemoryApart) {
  float* dev = device_floats(4);
  float* pinned = nullptr;
  cudaMallocHost(&pinned, 16);
  float host[4];
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, dev + 1), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  ASSERT_EQ(cudaPointerGetAttributes(&a, pinned), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&a, host), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  cudaFreeHost(pinned);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_TRUE(has(prop.name, "emulated")) << prop.name;
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(prop.maxThreadsPerBlock, 1024);
}

// ---- the cuBLASLt stand-in
// ---------------------------------------------------------------------------

struct Lt {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Lt(int m, int n, int k, int lda, int ldb, int ldc) {
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, m, k, lda);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, k, n, ldb);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, m, n, ldc);
    cublasLtMatmulPreferenceCreate(&pref);
  }
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(h);
  }
  cublasStatus_t run(const float* A, const float* B, float* C, float beta = 0.0f) {
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, c, pref, 1, &r, &found);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    void* ws = nullptr;
    if (r.workspaceSize) cudaMalloc(&ws, r.workspaceSize);
    const float alpha = 1.0f;
    const cublasStatus_t m = cublasLtMatmul(h, desc, &alpha, A, a, B, b, &beta, C, c, C, c, &r.algo,
                                            ws, r.workspaceSize, nullptr);
    cudaDeviceSynchronize();
    cudaFree(ws);
    return m;
  }
};

// Column-major C (m x n) = A (m x k) B (k x n), against a double-precision loop.
TEST_F(Emu, CublasLtComputesTheColumnMajorProduct) {
  const int m = 5, n = 7, k = 3, lda = 6, ldb = 4, ldc = 5;
  std::vector<float> A(lda * k), B(ldb * n), C(ldc * n, 0.0f);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(i % 5) - 2.0f;
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(i % 3) * 0.5f;
  float *dA = device_floats(A.size()), *dB = device_floats(B.size()), *dC = device_floats(C.size());
  cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
  Lt lt(m, n, k, lda, ldb, ldc);
  ASSERT_EQ(lt.run(dA, dB, dC), CUBLAS_STATUS_SUCCESS);
  const std::vector<float> got = to_host(dC, C.size());
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double want = 0;
      for (int p = 0; p < k; ++p) want += static_cast<double>(A[p * lda + i]) * B[j * ldb + p];
      EXPECT_NEAR(got[j * ldc + i], want, 1e-5) << i << "," << j;
    }
  }
}

TEST_F(Emu, CublasLtRefusesMisalignedOperandsUnlessThePreferenceSaysSo) {
  const int m = 4, n = 4, k = 4;
  float* buf = device_floats(256);
  Lt lt(m, n, k, m, k, m);
  // A at a 4-byte offset (B and C 256-byte aligned): the default preference (256-byte alignment)
  // does not allow it.
  EXPECT_EQ(lt.run(buf + 1, buf + 64, buf + 128), CUBLAS_STATUS_NOT_SUPPORTED);
  const std::uint32_t four = 4;
  cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &four,
                                       sizeof(four));
  EXPECT_EQ(lt.run(buf + 1, buf + 64, buf + 128), CUBLAS_STATUS_SUCCESS);
}

TEST_F(Emu, CublasLtRefusesHostOperandsAndLayoutsThatDoNotFormAProduct) {
  float* dev = device_floats(64);
  std::vector<float> host(64);
  Lt lt(4, 4, 4, 4, 4, 4);
  EXPECT_EQ(lt.run(host.data(), dev, dev + 32), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_TRUE(has(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE), "not live device memory"));
  Lt bad(4, 4, 4, 4, 4, 4);
  cublasLtMatrixLayoutDestroy(bad.b);
  cublasLtMatrixLayoutCreate(&bad.b, CUDA_R_32F, 5, 4, 5);  // k = 5 against A's k = 4
  EXPECT_EQ(bad.run(dev, dev, dev + 32), CUBLAS_STATUS_INVALID_VALUE);
  Lt short_ld(4, 4, 4, 3, 4, 4);  // lda 3 < 4 rows
  EXPECT_EQ(short_ld.run(dev, dev, dev + 32), CUBLAS_STATUS_INVALID_VALUE);
}

}  // namespace
