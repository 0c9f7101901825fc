// cuemu's internals, shared by the runtime (runtime.cc), the block executor (exec.cc) and the
// cuBLASLt and NCCL stand-ins (cublaslt.cc, nccl.cc). Not included by emulated code.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime.h"

namespace cuemu::detail {

// ---- configuration (environment, read once)
// ----------------------------------------------------------
struct Config {
  bool threads = false;              // CUEMU_THREADS=1: a block's threads are OS threads (TSan)
  int device_count = 1;              // CUEMU_DEVICE_COUNT (CUDA_VISIBLE_DEVICES narrows it)
  std::string model = "h200";        // CUEMU_DEVICE_MODEL: h200, h100, a100
  std::string schedule = "forward";  // CUEMU_SCHEDULE: forward, reverse, random (thread order)
  bool reverse_blocks = false;       // CUEMU_BLOCK_ORDER=reverse
  std::uint64_t seed = 1;            // CUEMU_SEED for the random schedule
  std::int64_t quarantine_bytes = 256ll << 20;  // CUEMU_QUARANTINE_MB: freed memory kept unmapped
  bool host_pinned_in_kernels = false;  // CUEMU_ALLOW_PINNED_IN_KERNELS=1: zero-copy host memory
  bool quiet = false;                   // CUEMU_QUIET=1: faults are not printed to stderr
  // CUEMU_STRICT_HOST=1: every stream operation runs at once on the calling thread, and device
  // memory is unmapped (PROT_NONE) whenever none runs, so host code that reads or writes device
  // memory faults and is named (on a GPU it would be an illegal access, or PCIe traffic with HMM).
  bool strict_host = false;
};
const Config& config();

// ---- errors
// ------------------------------------------------------------------------------------------------
// A fault the emulator found: printed to stderr at once (unless quiet) and made the device's sticky
// error, as a kernel fault on a GPU makes every later call fail; its text is appended to
// cudaGetErrorString of that code.
void fault(int device, cudaError_t code, const std::string& message);
// A non-sticky error of a call on this host thread (cudaGetLastError returns and clears it).
cudaError_t call_error(cudaError_t code, const std::string& message);
cudaError_t sticky_error(int device);
std::string describe_error(cudaError_t code);

// ---- memory
// ------------------------------------------------------------------------------------------------
enum class MemKind { kDevice, kManaged, kPinnedHost, kRegisteredHost };

struct Allocation {
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  MemKind kind = MemKind::kDevice;
  int device = 0;
  std::uint64_t id = 0;
  bool freed = false;  // cudaFree / cudaFreeAsync reached (kept while quarantined)
  bool stream_ordered = false;
  void* map_base = nullptr;  // the mapping (device memory): base is at its end, before a guard page
  std::size_t map_bytes = 0;
  std::string freed_by;  // "cudaFree" or "cudaFreeAsync on stream ..."
};

// The allocation containing [p, p + bytes) (one-past-the-end allowed for bytes == 0), live or
// quarantined; a copy, or none.
struct Lookup {
  bool found = false;
  Allocation a;
};
Lookup find_allocation(const void* p);
std::string describe_pointer(const void* p);  // "device memory (allocation 12 of 4096 bytes) ..."

// ---- streams
// ----------------------------------------------------------------------------------------------
struct Stream;
struct Task {
  std::function<void()> fn;
  std::vector<std::pair<Stream*, std::uint64_t>>
      deps;  // run after these streams reach these counts
  const char* what = "";
};

struct Stream {
  int device = 0;
  bool legacy = false;
  bool blocking = true;         // synchronizes with the legacy stream (not cudaStreamNonBlocking)
  std::uint64_t enqueued = 0;   // tasks queued (global mutex)
  std::uint64_t completed = 0;  // tasks finished (global mutex)
  std::deque<Task> queue;
  std::condition_variable work;  // a task was queued (global mutex)
  bool stop = false;
  std::thread worker;
  std::string name;
};

Stream* resolve_stream(cudaStream_t s);  // null / legacy / per-thread -> the device's legacy stream
// Queues fn on s (with the legacy stream's implicit synchronization); returns its sequence number.
std::uint64_t enqueue(Stream* s, const char* what, std::function<void()> fn,
                      std::vector<std::pair<Stream*, std::uint64_t>> extra_deps = {});
void wait_for(Stream* s, std::uint64_t seq);  // until s has completed seq tasks
std::uint64_t queued(Stream* s);              // tasks queued on s so far
int current_device();

// ---- kernels
// -----------------------------------------------------------------------------------------------
struct KernelRun {
  LaunchConfig config;
  int device = 0;
  std::function<void()> body;
  std::vector<PointerArg> pointers;
  std::vector<std::uint64_t> pointer_ids;  // the allocation each pointer was in at launch
};
// Runs every block of the kernel on the calling (stream worker) thread; a fault is reported with
// fault() and ends the kernel.
void run_kernel(KernelRun& run);

}  // namespace cuemu::detail
