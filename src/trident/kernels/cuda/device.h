// Device memory for the CUDA backend: the GPU count, copies between host and device, and
// DeviceArena, core::Arena's counterpart for device memory (one cudaMalloc, bump-allocated
// TensorViews on core::DeviceKind::kCuda), sized from the same size tables as the host arenas.
// Plain C++ interface (no CUDA header needed).
#pragma once

#include <cstdint>
#include <string>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels::cuda {

// GPUs the CUDA runtime sees; 0 (never an exception) when there is no driver or no device.
int device_count();
// Why device_count() is 0 (the CUDA runtime's error text), or "" when there is a device.
std::string no_device_reason();
// "NVIDIA H200" etc.
std::string device_name(int device);
// The device's dense peak rates (kernels::DevicePeak, memory.h).
void device_peak(int device, double& bf16_tflops, double& fp32_tflops, std::string& basis);
// Makes `device` current on the calling thread.
void set_device(int device);

// A stream on the current device (non-blocking with respect to the legacy default stream).
void* create_stream();
void destroy_stream(void* stream);
// Waits for the stream's work; then throws the first failed check of device-resident inputs
// queued on it (a negative token id, a target outside the vocabulary: cuda_util.cuh).
void synchronize(void* stream);
// A device-to-host copy that waits for the stream's next host sync instead of making one: queued
// now (the value as the stream has it here), in host_dst (at most 1 KiB; keep it alive) once
// complete_read(stream, ticket) returns, which synchronizes only when no read-back of the stream
// (a result read by the kernels, synchronize()) has happened since.
std::uint64_t read_later(void* stream, void* host_dst, const void* device_src, std::int64_t bytes);
void complete_read(void* stream, std::uint64_t ticket);

// Timing events (cudaEventDefault): record on a stream, wait for one, and the seconds between
// two reached events.
void* create_timing_event();
void destroy_event(void* event) noexcept;
void record_event(void* event, void* stream);
void synchronize_event(void* event);
double seconds_between_events(void* start, void* stop);

// Stream-ordered copies (cudaMemcpyAsync with the direction inferred); the host side may be
// pageable memory. Call synchronize() before reading a device-to-host result.
void copy_to_device(void* dst, const void* src, std::int64_t bytes, void* stream);
void copy_to_host(void* dst, const void* src, std::int64_t bytes, void* stream);
void copy_device_to_device(void* dst, const void* src, std::int64_t bytes, void* stream);
void fill_zero(void* dst, std::int64_t bytes, void* stream);

void* device_alloc(std::int64_t bytes);  // cudaMalloc on the current device; throws on failure
void device_free(void* p);
// Frees a device_alloc of `bytes`, subtracting it from the in-use count of peak_device_bytes().
void device_free_counted(void* p, std::int64_t bytes) noexcept;
// Page-locked host memory (cudaHostAlloc): copies from and to it are fully asynchronous.
void* pinned_alloc(std::int64_t bytes);
void pinned_free(void* p) noexcept;

// Why `p` may not be given to a kernel on CUDA device `device` ("host memory (...)", "memory of
// CUDA device 1", ...), or "" when it may (device or managed memory of that device), from
// cudaPointerGetAttributes.
std::string device_memory_problem(const void* p, int device);
// Whether the typed views check their memory with device_memory_problem (kernels/view_check.cc):
// in debug builds, in the emulated build, and where TRIDENT_CUDA_CHECK_POINTERS=1 (a driver call
// per view: off by default in release builds on a GPU).
bool pointer_checks_enabled();

// The largest device memory in use since the process started or the last reset (bytes), from the
// arenas and DeviceBuffers; for the benchmark table.
std::int64_t peak_device_bytes();
// The high-water of the current device's stream-ordered pool (cudaMallocAsync: the kernels'
// temporaries), since the process started.
std::int64_t pool_peak_bytes();

// One device allocation, freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::int64_t bytes);
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  std::int64_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  std::int64_t bytes_ = 0;
};

// core::Arena on the GPU: one zero-filled allocation of `capacity_bytes` on the current device,
// handing out kAlign-aligned views (device = {kCuda, device index}). Throws core::InternalError
// when the arena is too small (the size table was wrong) and core::Unavailable when the GPU has not
// the memory (naming both sizes).
class DeviceArena {
 public:
  static constexpr std::int64_t kAlign = 256;  // cuBLASLt and vector loads like 256-byte alignment

  DeviceArena() = default;
  // Zero-filled on `stream` (stream-ordered), or, with no stream, before the constructor returns.
  explicit DeviceArena(std::int64_t capacity_bytes, void* stream = nullptr);

  core::TensorView alloc(core::DType dtype, const core::Shape& shape);
  void reset() { used_ = 0; }
  std::int64_t capacity() const { return buffer_.bytes(); }
  std::int64_t used() const { return used_; }
  void* base() const { return buffer_.data(); }
  core::Device device() const { return device_; }

  static std::int64_t footprint(core::DType dtype, const core::Shape& shape) {
    const std::int64_t b = shape.numel() * core::size_of(dtype);
    return (b + kAlign - 1) / kAlign * kAlign;
  }

 private:
  DeviceBuffer buffer_;
  std::int64_t used_ = 0;
  core::Device device_{core::DeviceKind::kCuda, 0};
};

// An ExecContext for `device` queued on `stream`.
inline core::ExecContext cuda_context(int device, void* stream = nullptr) {
  core::ExecContext ctx;
  ctx.device = {core::DeviceKind::kCuda, device};
  ctx.stream = stream;
  return ctx;
}

}  // namespace trident::kernels::cuda
