// Shared helpers of the CUDA kernels (only .cu files include this): error checks that throw the
// project's exceptions, the stream of an ExecContext, launch sizes, block reductions, and the
// deterministic column sums used by every parameter-gradient reduction.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"

namespace trident::kernels::cuda {

// Throws core::Unavailable for out-of-memory and core::InternalError for any other CUDA error,
// naming the call that failed and the CUDA error text.
void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

#define TRIDENT_CUDA_CHECK(expr)                                                                \
  do {                                                                                          \
    const cudaError_t trident_cuda_err_ = (expr);                                               \
    if (trident_cuda_err_ != cudaSuccess)                                                       \
      ::trident::kernels::cuda::throw_cuda_error(trident_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch errors (bad configuration) surface here, naming the op; faults
// inside the kernel surface at the next synchronizing call.
#define TRIDENT_CUDA_LAUNCH_CHECK(name)                                                         \
  do {                                                                                          \
    const cudaError_t trident_cuda_err_ = cudaGetLastError();                                   \
    if (trident_cuda_err_ != cudaSuccess)                                                       \
      ::trident::kernels::cuda::throw_cuda_error(                                               \
          trident_cuda_err_, (std::string("the kernel launch of ") + (name)).c_str(), __FILE__, \
          __LINE__);                                                                            \
  } while (0)

inline cudaStream_t stream_of(const core::ExecContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// Blocks for n elements at `threads` per block, capped (grid-stride loops cover the rest).
inline unsigned grid_for(std::int64_t n, int threads, std::int64_t cap = 65535LL * 16) {
  std::int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks);
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <class T>
__device__ __forceinline__ T warp_max(T v) {
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// A fixed tree: the result depends only on the values and blockDim.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  T r = lane < warps ? partial[lane] : T(0);
  return warp_sum(r);
}

template <class T>
__device__ T block_max(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  T r = lane < warps ? partial[lane] : partial[0];
  return warp_max(r);
}

// Stream-ordered temporary device memory (cudaMallocAsync; freed on the stream when it goes out
// of scope, so later work on the stream may reuse it).
class StreamScratch {
 public:
  StreamScratch(std::int64_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) TRIDENT_CUDA_CHECK(cudaMallocAsync(&p_, static_cast<size_t>(bytes), stream));
  }
  ~StreamScratch() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

// Rows per partial of the parameter-gradient sums: the CPU's chunk (kernels/row_partials.h), so a
// caller's scratch sized for the CPU also fits here.
inline constexpr std::int64_t kRowChunk = 64;
inline std::int64_t num_row_chunks(std::int64_t rows) { return (rows + kRowChunk - 1) / kRowChunk; }

// out[j][c] += sum over rows r of value(r, c, j) for j < kOut outputs, deterministically: each
// chunk of 64 rows sums in order into a double partial, and the partials are added in chunk order.
// value is a __device__ functor `float operator()(int64 r, int64 c, int j) const`. `partials`
// holds kOut * chunks * cols doubles (device memory) or is null (then taken from the stream pool).
template <int kOut, class F>
__global__ void column_partials_kernel(double* partials, F value, std::int64_t rows,
                                       std::int64_t cols) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  if (c >= cols) return;
  const std::int64_t r0 = chunk * kRowChunk;
  const std::int64_t r1 = min(rows, r0 + kRowChunk);
  double acc[kOut];
#pragma unroll
  for (int j = 0; j < kOut; ++j) acc[j] = 0.0;
  for (std::int64_t r = r0; r < r1; ++r) {
#pragma unroll
    for (int j = 0; j < kOut; ++j) acc[j] += static_cast<double>(value(r, c, j));
  }
  const std::int64_t chunks = gridDim.y;
#pragma unroll
  for (int j = 0; j < kOut; ++j) partials[(j * chunks + chunk) * cols + c] = acc[j];
}

template <int kOut>
__global__ void add_partials_kernel(float* out0, float* out1, const double* partials,
                                    std::int64_t chunks, std::int64_t cols) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
#pragma unroll
  for (int j = 0; j < kOut; ++j) {
    double acc = 0.0;
    for (std::int64_t k = 0; k < chunks; ++k) acc += partials[(j * chunks + k) * cols + c];
    float* out = j == 0 ? out0 : out1;
    out[c] = static_cast<float>(out[c] + acc);
  }
}

// Launches the two passes. out1 is used when kOut == 2. scratch_bytes / scratch: a caller's device
// scratch (used when large enough), else the stream pool.
template <int kOut, class F>
void column_sums(cudaStream_t stream, float* out0, float* out1, F value, std::int64_t rows,
                 std::int64_t cols, void* scratch = nullptr, std::int64_t scratch_bytes = 0) {
  if (rows == 0 || cols == 0) return;
  const std::int64_t chunks = num_row_chunks(rows);
  TRIDENT_CHECK(chunks <= 65535, "column sums: ", rows, " rows is more than this kernel's ",
                65535 * kRowChunk, " (split the call)");
  const std::int64_t need = kOut * chunks * cols * static_cast<std::int64_t>(sizeof(double));
  StreamScratch own(scratch != nullptr && scratch_bytes >= need ? 0 : need, stream);
  double* partials = scratch != nullptr && scratch_bytes >= need ? static_cast<double*>(scratch)
                                                                 : own.as<double>();
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(chunks));
  column_partials_kernel<kOut><<<grid, kThreads, 0, stream>>>(partials, value, rows, cols);
  TRIDENT_CUDA_LAUNCH_CHECK("column_partials");
  add_partials_kernel<kOut>
      <<<grid_for(cols, kThreads), kThreads, 0, stream>>>(out0, out1, partials, chunks, cols);
  TRIDENT_CUDA_LAUNCH_CHECK("add_partials");
}

// ---- Checks of device-resident inputs, and reading results back --------------------------------
// Token ids and targets live on the device. Their checks run as kernels and never stop the host:
// each check's verdict waits on the device until the host next reads from the stream
// (read_back(), or synchronize() of device.h), which copies every pending verdict and the value
// read in one stream sync, and then throws the first failed check's error (the message the CPU
// backend throws at the call). The kernels that use the values guard against the bad ones, so
// nothing reads out of bounds in between. One host sync per micro-batch (the loss read-back)
// covers the embedding's and the loss's checks.
enum class CheckRule { kNonNegative, kBelowBound };
// Called with the index of the first bad element and its value; throws the error.
using CheckFailure = std::function<void(std::int64_t index, std::int64_t value)>;
// Queues on `stream` the check of values[0..n) against the rule.
void defer_check(cudaStream_t stream, const std::int32_t* values, std::int64_t n, CheckRule rule,
                 std::int64_t bound, CheckFailure fail);
// Copies `bytes` (at most 256) of device memory to host_dst with the pending checks' verdicts:
// one stream sync; then reports the first failed check.
void read_back_bytes(cudaStream_t stream, void* host_dst, const void* device_src,
                     std::int64_t bytes);
template <class T>
T read_back(cudaStream_t stream, const T* device_src) {
  T host{};
  read_back_bytes(stream, &host, device_src, static_cast<std::int64_t>(sizeof(T)));
  return host;
}

}  // namespace trident::kernels::cuda
