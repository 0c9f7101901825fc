// kernels/memory.h: the host's operations, or the CUDA runtime's through kernels/cuda/device.h.
#include "trident/kernels/memory.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "trident/core/error.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/device.h"
#endif

namespace trident::kernels {

namespace {

bool on_cuda(const core::ExecContext& ctx) {
  if (ctx.device.kind != core::DeviceKind::kCuda) return false;
#ifdef TRIDENT_HAVE_CUDA
  return true;
#else
  throw core::Unavailable(
      "a CUDA context in a build without the CUDA backend: configure with the CUDA toolkit "
      "(nvcc on PATH) to build kernels/cuda/, or run with --device cpu");
#endif
}

#ifdef TRIDENT_HAVE_CUDA
class CudaMemory final : public core::MemoryResource {
 public:
  CudaMemory(int device, void* stream) : device_(device), stream_(stream) {}
  void* allocate(std::int64_t bytes) override {
    cuda::set_device(device_);
    return cuda::device_alloc(bytes);
  }
  void deallocate(void* p, std::int64_t bytes) noexcept override {
    cuda::device_free_counted(p, bytes);
  }
  void zero(void* p, std::int64_t bytes) override { cuda::fill_zero(p, bytes, stream_); }
  core::Device device() const override { return {core::DeviceKind::kCuda, device_}; }

 private:
  int device_;
  void* stream_;
};
#endif

}  // namespace

core::MemoryResource& memory_for(const core::ExecContext& ctx) {
  if (!on_cuda(ctx)) return core::host_memory();
#ifdef TRIDENT_HAVE_CUDA
  static std::mutex mu;
  static std::map<std::pair<int, void*>, std::unique_ptr<CudaMemory>> resources;
  std::lock_guard<std::mutex> lock(mu);
  auto& r = resources[{ctx.device.index, ctx.stream}];
  if (!r) r = std::make_unique<CudaMemory>(ctx.device.index, ctx.stream);
  return *r;
#else
  throw core::InternalError("memory_for: unreachable");
#endif
}

void copy_to_device(const core::ExecContext& ctx, void* device_dst, const void* host_src,
                    std::int64_t bytes) {
  if (bytes <= 0) return;
  if (!on_cuda(ctx)) {
    std::memcpy(device_dst, host_src, static_cast<std::size_t>(bytes));
    return;
  }
#ifdef TRIDENT_HAVE_CUDA
  cuda::copy_to_device(device_dst, host_src, bytes, ctx.stream);
#endif
}

void copy_to_host(const core::ExecContext& ctx, void* host_dst, const void* device_src,
                  std::int64_t bytes) {
  if (bytes <= 0) return;
  if (!on_cuda(ctx)) {
    std::memcpy(host_dst, device_src, static_cast<std::size_t>(bytes));
    return;
  }
#ifdef TRIDENT_HAVE_CUDA
  cuda::copy_to_host(host_dst, device_src, bytes, ctx.stream);
#endif
}

void copy_on_device(const core::ExecContext& ctx, void* dst, const void* src, std::int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  if (!on_cuda(ctx)) {
    std::memmove(dst, src, static_cast<std::size_t>(bytes));
    return;
  }
#ifdef TRIDENT_HAVE_CUDA
  cuda::copy_device_to_device(dst, src, bytes, ctx.stream);
#endif
}

void zero_on_device(const core::ExecContext& ctx, void* dst, std::int64_t bytes) {
  if (bytes <= 0) return;
  if (!on_cuda(ctx)) {
    std::memset(dst, 0, static_cast<std::size_t>(bytes));
    return;
  }
#ifdef TRIDENT_HAVE_CUDA
  cuda::fill_zero(dst, bytes, ctx.stream);
#endif
}

void synchronize(const core::ExecContext& ctx) {
  if (!on_cuda(ctx)) return;
#ifdef TRIDENT_HAVE_CUDA
  cuda::synchronize(ctx.stream);
#endif
}

std::uint64_t read_later(const core::ExecContext& ctx, void* host_dst, const void* device_src,
                         std::int64_t bytes) {
  if (!on_cuda(ctx)) {
    std::memcpy(host_dst, device_src, static_cast<std::size_t>(bytes));
    return 0;
  }
#ifdef TRIDENT_HAVE_CUDA
  return cuda::read_later(ctx.stream, host_dst, device_src, bytes);
#else
  return 0;
#endif
}

#ifdef TRIDENT_HAVE_CUDA
namespace {
// Timing events on one stream: mark i is events_[i] (created once, reused after clear()).
// cudaEventSynchronize on the last mark read is the one host wait of a profile window's reading.
class CudaEventTimer final : public core::profile::DeviceTimer {
 public:
  CudaEventTimer(int device, void* stream) : device_(device), stream_(stream) {}
  ~CudaEventTimer() override {
    for (void* e : events_) cuda::destroy_event(e);
  }
  std::int64_t mark() override {
    if (used_ == events_.size()) {
      cuda::set_device(device_);
      events_.push_back(cuda::create_timing_event());
    }
    cuda::record_event(events_[used_], stream_);
    return static_cast<std::int64_t>(used_++);
  }
  double seconds_between(std::int64_t a, std::int64_t b) override {
    TRIDENT_CHECK(a >= 0 && b >= a && static_cast<std::size_t>(b) < used_, "device timer: marks ",
                  a, " and ", b, " of ", used_);
    if (static_cast<std::size_t>(b) >= reached_) {  // one wait: for the last mark so far
      cuda::synchronize_event(events_[used_ - 1]);
      reached_ = used_;
    }
    return cuda::seconds_between_events(events_[static_cast<std::size_t>(a)],
                                        events_[static_cast<std::size_t>(b)]);
  }
  void clear() override { used_ = reached_ = 0; }

 private:
  int device_;
  void* stream_;
  std::vector<void*> events_;
  std::size_t used_ = 0;
  std::size_t reached_ = 0;  // marks below it are known reached
};
}  // namespace
#endif

std::shared_ptr<core::profile::DeviceTimer> make_device_timer(const core::ExecContext& ctx) {
  if (!on_cuda(ctx)) return nullptr;
#ifdef TRIDENT_HAVE_CUDA
  return std::make_shared<CudaEventTimer>(ctx.device.index, ctx.stream);
#else
  return nullptr;
#endif
}

void complete_read(const core::ExecContext& ctx, std::uint64_t ticket) {
  if (!on_cuda(ctx)) return;
#ifdef TRIDENT_HAVE_CUDA
  cuda::complete_read(ctx.stream, ticket);
#else
  (void)ticket;
#endif
}

void download(const core::ExecContext& ctx, void* host_dst, const void* device_src,
              std::int64_t bytes) {
  copy_to_host(ctx, host_dst, device_src, bytes);
  synchronize(ctx);
}

HostBuffer::HostBuffer(const core::ExecContext& ctx, std::int64_t bytes) : bytes_(bytes) {
  if (bytes <= 0) return;
  if (on_cuda(ctx)) {
#ifdef TRIDENT_HAVE_CUDA
    data_ = cuda::pinned_alloc(bytes);
    pinned_ = true;
#endif
  } else {
    data_ = core::host_memory().allocate(bytes);
  }
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      pinned_(o.pinned_) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    this->~HostBuffer();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pinned_ = o.pinned_;
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  if (data_ == nullptr) return;
#ifdef TRIDENT_HAVE_CUDA
  if (pinned_) {
    cuda::pinned_free(data_);
    data_ = nullptr;
    return;
  }
#endif
  core::host_memory().deallocate(data_, bytes_);
  data_ = nullptr;
}

int cuda_device_count() {
#ifdef TRIDENT_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string cuda_no_device_reason() {
#ifdef TRIDENT_HAVE_CUDA
  return cuda::no_device_reason();
#else
  return "this build has no CUDA backend (configure with the CUDA toolkit, nvcc on PATH)";
#endif
}

std::string cuda_device_name(int device) {
#ifdef TRIDENT_HAVE_CUDA
  return cuda::device_name(device);
#else
  (void)device;
  throw core::Unavailable("cuda_device_name: this build has no CUDA backend");
#endif
}

DevicePeak cuda_device_peak(int device) {
#ifdef TRIDENT_HAVE_CUDA
  DevicePeak p;
  cuda::device_peak(device, p.bf16_tflops, p.fp32_tflops, p.basis);
  return p;
#else
  (void)device;
  throw core::Unavailable("cuda_device_peak: this build has no CUDA backend");
#endif
}

core::ExecContext make_cuda_context(int device) {
#ifdef TRIDENT_HAVE_CUDA
  cuda::set_device(device);
  core::ExecContext ctx;
  ctx.device = {core::DeviceKind::kCuda, device};
  ctx.stream = cuda::create_stream();
  return ctx;
#else
  (void)device;
  throw core::Unavailable(
      "--device cuda: this build has no CUDA backend (configure with the CUDA toolkit, nvcc on "
      "PATH), or run with --device cpu");
#endif
}

void destroy_context_stream(const core::ExecContext& ctx) {
#ifdef TRIDENT_HAVE_CUDA
  if (ctx.device.kind == core::DeviceKind::kCuda && ctx.stream != nullptr) {
    cuda::destroy_stream(ctx.stream);
  }
#else
  (void)ctx;
#endif
}

std::int64_t peak_device_bytes(const core::ExecContext& ctx) {
  if (ctx.device.kind != core::DeviceKind::kCuda) return 0;
#ifdef TRIDENT_HAVE_CUDA
  return cuda::peak_device_bytes();
#else
  return 0;
#endif
}

std::int64_t peak_device_pool_bytes(const core::ExecContext& ctx) {
  if (ctx.device.kind != core::DeviceKind::kCuda) return 0;
#ifdef TRIDENT_HAVE_CUDA
  return cuda::pool_peak_bytes();
#else
  return 0;
#endif
}

}  // namespace trident::kernels
