// Device memory, streams, copies and CUDA error reporting. See device.h and cuda_util.cuh.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "trident/core/error.h"
#include "trident/kernels/cuda/cuda_util.cuh"
#include "trident/kernels/cuda/device.h"

namespace trident::kernels::cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  cudaGetLastError();  // clear a sticky launch error so that the next call starts clean
  const std::string msg = core::str("CUDA error in ", what, " (", file, ":", line,
                                    "): ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) {
    throw core::Unavailable(core::str(msg,
                                      "; the GPU is out of memory: use a smaller micro-batch, "
                                      "more model parallelism, ZeRO or activation recomputation"));
  }
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    throw core::Unavailable(core::str(msg,
                                      "; no usable NVIDIA GPU (check nvidia-smi and "
                                      "CUDA_VISIBLE_DEVICES), or run on the CPU"));
  }
  throw core::InternalError(msg);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return core::str("no CUDA device: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
  return n == 0 ? "no CUDA device: the CUDA runtime reports 0 GPUs" : "";
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

void device_peak(int device, double& bf16_tflops, double& fp32_tflops, std::string& basis) {
  int major = 0, minor = 0, sms = 0, clock_khz = 0;
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  TRIDENT_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  // The datasheets' dense figures (sparsity not counted) for the parts MFU is usually quoted on;
  // they are a little under SMs x maximum clock x rate, as NVIDIA counts at its boost clock.
  struct Known {
    int major, minor, sms;
    double bf16, fp32;
    const char* part;
  };
  static constexpr Known kKnown[] = {
      {9, 0, 132, 989.4, 66.9, "H100 SXM / H200 / GH200 datasheet"},
      {9, 0, 114, 756.5, 51.2, "H100 PCIe datasheet"},
      {8, 0, 108, 312.0, 19.5, "A100 datasheet"},
  };
  for (const Known& k : kKnown) {
    if (k.major == major && k.minor == minor && k.sms == sms) {
      bf16_tflops = k.bf16;
      fp32_tflops = k.fp32;
      basis = core::str(k.part, ", dense");
      return;
    }
  }
  // Otherwise: dense BF16 tensor-core and FP32 FLOP per clock per SM of the architecture.
  double bf16_per_clock = 1024, fp32_per_clock = 256;
  if (major == 8 && minor == 0) {
    bf16_per_clock = 2048;
    fp32_per_clock = 128;
  } else if (major == 9) {
    bf16_per_clock = 4096;
  } else if (major >= 10) {
    bf16_per_clock = 8192;
  }
  const double clocks = static_cast<double>(sms) * clock_khz * 1e3;
  bf16_tflops = clocks * bf16_per_clock / 1e12;
  fp32_tflops = clocks * fp32_per_clock / 1e12;
  basis = core::str(sms, " SMs x ", clock_khz / 1000, " MHz x sm_", major, minor,
                    "'s dense FLOP per clock");
}

void set_device(int device) { TRIDENT_CUDA_CHECK(cudaSetDevice(device)); }

void* create_stream() {
  cudaStream_t s = nullptr;
  TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroy_stream(void* stream) {
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void synchronize(void* stream) {
  // Waits, and reports the stream's pending checks of device-resident inputs.
  read_back_bytes(static_cast<cudaStream_t>(stream), nullptr, nullptr, 0);
}

void* create_timing_event() {
  cudaEvent_t e = nullptr;
  TRIDENT_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void destroy_event(void* event) noexcept {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void record_event(void* event, void* stream) {
  TRIDENT_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

void synchronize_event(void* event) {
  TRIDENT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

double seconds_between_events(void* start, void* stop) {
  float ms = 0;
  TRIDENT_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)));
  return static_cast<double>(ms) * 1e-3;
}

void copy_to_device(void* dst, const void* src, std::int64_t bytes, void* stream) {
  if (bytes <= 0) return;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                     static_cast<cudaStream_t>(stream)));
}

void copy_to_host(void* dst, const void* src, std::int64_t bytes, void* stream) {
  if (bytes <= 0) return;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                     static_cast<cudaStream_t>(stream)));
}

void copy_device_to_device(void* dst, const void* src, std::int64_t bytes, void* stream) {
  if (bytes <= 0) return;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                                     static_cast<cudaStream_t>(stream)));
}

void fill_zero(void* dst, std::int64_t bytes, void* stream) {
  if (bytes <= 0) return;
  TRIDENT_CUDA_CHECK(
      cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), static_cast<cudaStream_t>(stream)));
}

std::string device_memory_problem(const void* p, int device) {
  if (p == nullptr) return "";
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return core::str("unknown to CUDA (", cudaGetErrorString(err), ")");
  }
  char at[32];
  std::snprintf(at, sizeof(at), "%p", p);
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      if (attr.device == device) return "";
      return core::str("memory of CUDA device ", attr.device, " (", at, "), not of device ",
                       device);
    case cudaMemoryTypeManaged:
      return "";
    case cudaMemoryTypeHost:
      return core::str("pinned host memory (", at, "), not device memory");
    case cudaMemoryTypeUnregistered:
      break;
  }
  return core::str("host memory (", at, "), not memory of CUDA device ", device);
}

bool pointer_checks_enabled() {
#if defined(TRIDENT_CUDA_EMULATED) || !defined(NDEBUG)
  return true;
#else
  static const bool on = [] {
    const char* v = std::getenv("TRIDENT_CUDA_CHECK_POINTERS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
#endif
}

namespace {
std::atomic<std::int64_t> g_in_use{0}, g_peak{0};
}

void* device_alloc(std::int64_t bytes) {
  TRIDENT_CHECK(bytes >= 0, "device_alloc: negative size ", bytes);
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    throw core::Unavailable(
        core::str("cudaMalloc of ", bytes, " bytes failed (", cudaGetErrorString(err),
                  "); the GPU has ", free_b, " of ", total_b,
                  " bytes free: use a smaller micro-batch, more model parallelism, "
                  "ZeRO or activation recomputation"));
  }
  const std::int64_t now = g_in_use.fetch_add(bytes) + bytes;
  std::int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

namespace {
void free_counted(void* p, std::int64_t bytes) {
  if (!p) return;
  cudaFree(p);
  g_in_use.fetch_sub(bytes);
}
}  // namespace

void device_free_counted(void* p, std::int64_t bytes) noexcept { free_counted(p, bytes); }

void* pinned_alloc(std::int64_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw core::Unavailable(core::str("cudaHostAlloc of ", bytes,
                                      " bytes of page-locked host memory "
                                      "failed (",
                                      cudaGetErrorString(err), ")"));
  }
  return p;
}

void pinned_free(void* p) noexcept {
  if (p) cudaFreeHost(p);
}

void device_free(void* p) {
  if (p) cudaFree(p);  // uncounted: callers of the raw API track their own sizes
}

std::int64_t peak_device_bytes() { return g_peak.load(); }

std::int64_t pool_peak_bytes() {
  int device = 0;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  TRIDENT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t high = 0;
  TRIDENT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  return static_cast<std::int64_t>(high);
}

DeviceBuffer::DeviceBuffer(std::int64_t bytes) : data_(device_alloc(bytes)), bytes_(bytes) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    free_counted(data_, bytes_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { free_counted(data_, bytes_); }

DeviceArena::DeviceArena(std::int64_t capacity_bytes, void* stream) : buffer_(capacity_bytes) {
  int dev = 0;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&dev));
  device_ = {core::DeviceKind::kCuda, dev};
  if (capacity_bytes > 0) {
    if (stream != nullptr) {
      // Stream-ordered: work queued on `stream` after this sees the zeros.
      TRIDENT_CUDA_CHECK(cudaMemsetAsync(buffer_.data(), 0, static_cast<size_t>(capacity_bytes),
                                         static_cast<cudaStream_t>(stream)));
    } else {
      // cudaMemset runs on the legacy default stream, which trident's non-blocking streams do not
      // order after: wait for it, so that any stream sees the zeros (arenas are made at start-up).
      TRIDENT_CUDA_CHECK(cudaMemset(buffer_.data(), 0, static_cast<size_t>(capacity_bytes)));
      TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
}

core::TensorView DeviceArena::alloc(core::DType dtype, const core::Shape& shape) {
  const std::int64_t need = footprint(dtype, shape);
  TRIDENT_ASSERT(used_ + need <= capacity(), "DeviceArena: out of space: asked for ", need,
                 " bytes with ", capacity() - used_, " of ", capacity(),
                 " left (the size table is wrong)");
  core::TensorView v;
  v.data = static_cast<char*>(buffer_.data()) + used_;
  v.dtype = dtype;
  v.device = device_;
  v.shape = shape;
  used_ += need;
  return v;
}

}  // namespace trident::kernels::cuda
