// Memory and transfers on the device of an ExecContext, for everything above kernels/: the arenas'
// memory (memory_for), host <-> device copies through staging buffers, device copies, the stream,
// and which GPU a rank uses. On the CPU every call is a plain host operation; on a CUDA device
// the CUDA runtime's (kernels/cuda/device.h), in the context's stream order. A CUDA context in a
// build without CUDA is core::Unavailable naming the call.
//
// Nothing above kernels/ copies training state with memcpy: it calls these, so that the same
// code runs on either device (docs/gpu.md, "Where memory lives").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "trident/core/exec_context.h"
#include "trident/core/memory.h"
#include "trident/core/profile.h"

namespace trident::kernels {

// The memory of ctx's device: the host's, or CUDA device ctx.device.index's (cudaMalloc; the
// zero-fill of a new arena is queued on ctx.stream). The reference lives as long as the process.
core::MemoryResource& memory_for(const core::ExecContext& ctx);

// Copies on ctx's stream. `host` may be pageable (staged before the call returns) or a
// HostBuffer (pinned: fully asynchronous; keep it alive and unwritten until synchronize()).
void copy_to_device(const core::ExecContext& ctx, void* device_dst, const void* host_src,
                    std::int64_t bytes);
// Queues the copy; the host buffer holds the data only after synchronize(ctx).
void copy_to_host(const core::ExecContext& ctx, void* host_dst, const void* device_src,
                  std::int64_t bytes);
void copy_on_device(const core::ExecContext& ctx, void* dst, const void* src, std::int64_t bytes);
void zero_on_device(const core::ExecContext& ctx, void* dst, std::int64_t bytes);
// Waits until every operation queued on ctx's stream has finished (a no-op on the CPU), then
// reports what the kernels found wrong in device-resident inputs (a negative token id, a target
// outside the vocabulary: the error the CPU backend throws at the call; on a CUDA device it comes
// at the next read-back of a result or here).
void synchronize(const core::ExecContext& ctx);
// A device-to-host read that rides on the stream's next host sync instead of making its own:
// queued now (the value as the stream has it at this point); host_dst (at most 1 KiB, kept alive)
// holds it once complete_read(ctx, ticket) returns, which synchronizes only when no read-back
// (a result read by a kernel op, synchronize()) has happened on the stream since. On the CPU the
// copy is made at once.
std::uint64_t read_later(const core::ExecContext& ctx, void* host_dst, const void* device_src,
                         std::int64_t bytes);
void complete_read(const core::ExecContext& ctx, std::uint64_t ticket);
// The device's clock for the profile's scopes (core/profile.h): timing events recorded on
// ctx.stream, reused across windows. Null on the CPU (the scopes' wall time is the kernels').
std::shared_ptr<core::profile::DeviceTimer> make_device_timer(const core::ExecContext& ctx);
// copy_to_host then synchronize.
void download(const core::ExecContext& ctx, void* host_dst, const void* device_src,
              std::int64_t bytes);

// A host buffer for transfers: page-locked on a CUDA context (copies from and to it are fully
// asynchronous), ordinary memory on the CPU.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const core::ExecContext& ctx, std::int64_t bytes);
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();
  void* data() const { return data_; }
  std::int64_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  std::int64_t bytes_ = 0;
  bool pinned_ = false;
};

// The GPUs this process sees (0 without CUDA in the build or without a driver), why there are
// none, and a GPU's name.
int cuda_device_count();
std::string cuda_no_device_reason();
std::string cuda_device_name(int device);
// A GPU's dense peak arithmetic rates, the denominator of MFU: BF16 (and FP16) on the tensor
// cores with FP32 accumulation, and plain FP32 (the FP32 GEMMs use no TF32). Datasheet figures
// for the parts known by compute capability and SM count (H100 SXM / H200 / GH200, H100 PCIe,
// A100), else SMs x clock x the architecture's rate per clock; `basis` says which.
struct DevicePeak {
  double bf16_tflops = 0;
  double fp32_tflops = 0;
  std::string basis;
};
DevicePeak cuda_device_peak(int device);
// Makes `device` current on the calling thread and returns an ExecContext on it, with a new
// non-blocking stream of its own (destroy it with destroy_context_stream).
core::ExecContext make_cuda_context(int device);
void destroy_context_stream(const core::ExecContext& ctx);
// The device memory in use at its peak since the start (arenas and device buffers), in bytes.
std::int64_t peak_device_bytes(const core::ExecContext& ctx);
// The high-water of the kernels' stream-ordered temporaries (the CUDA pool), in bytes; 0 on the
// CPU. With peak_device_bytes an upper bound of the device's peak (the two need not coincide).
std::int64_t peak_device_pool_bytes(const core::ExecContext& ctx);

}  // namespace trident::kernels
