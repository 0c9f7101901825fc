// Deferred checks of device-resident inputs and the read-back that reports them (cuda_util.cuh).
//
// Each stream has a ledger: device slots (a flag and a value per pending check), a page-locked
// copy of them and of one read-back value, and the host's list of what each slot checks. A check
// is three stream operations (zero the slot, test every element, record the first bad one's
// value); a read-back copies the used slots and the value into the page-locked buffer (both
// asynchronous) and synchronizes once, delivering the deferred reads queued since the last one
// (device.h read_later) as well.
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "trident/kernels/cuda/cuda_util.cuh"
#include "trident/kernels/cuda/device.h"

namespace trident::kernels::cuda {

namespace {

// The first bad element of n: the largest n - i over the bad i is the lowest i (0: none).
__global__ void check_values_kernel(unsigned long long* slot, const std::int32_t* values,
                                    std::int64_t n, int below, std::int64_t bound) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const bool bad = below != 0 ? values[i] >= bound : values[i] < 0;
    if (bad) atomicMax(slot, static_cast<unsigned long long>(n - i));
  }
}

// The value at the first bad index, read while the values are still those checked.
__global__ void capture_value_kernel(unsigned long long* slot, const std::int32_t* values,
                                     std::int64_t n) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const unsigned long long flag = slot[0];
  slot[1] = flag == 0 ? 0ull
                      : static_cast<unsigned long long>(
                            static_cast<std::int64_t>(values[n - static_cast<std::int64_t>(flag)]));
}

constexpr int kSlots = 512;                 // checks pending at once (then a read-back is forced)
constexpr std::int64_t kValueBytes = 256;   // the largest read_back_bytes
constexpr std::int64_t kLaterBytes = 1024;  // deferred reads pending at once (bytes)
constexpr std::int64_t kSlotBytes = kSlots * 2 * sizeof(unsigned long long);

struct Pending {
  std::int64_t n = 0;
  CheckFailure fail;
};

class Ledger {
 public:
  explicit Ledger(cudaStream_t stream) : stream_(stream) {
    TRIDENT_CUDA_CHECK(cudaMalloc(&slots_, kSlots * 2 * sizeof(unsigned long long)));
    TRIDENT_CUDA_CHECK(cudaMallocHost(&host_, kSlotBytes + kValueBytes + kLaterBytes));
  }
  // Never destroyed (held by a process-wide table): the CUDA runtime frees it at exit.

  void add(const std::int32_t* values, std::int64_t n, CheckRule rule, std::int64_t bound,
           CheckFailure fail) {
    std::unique_lock<std::mutex> lock(mu_);
    if (pending_.size() == kSlots) {
      flush(lock, nullptr, nullptr, 0);  // unlocks
      lock.lock();
    }
    unsigned long long* slot = slots_ + 2 * pending_.size();
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(slot, 0, 2 * sizeof(unsigned long long), stream_));
    check_values_kernel<<<grid_for(n, 256, 1024), 256, 0, stream_>>>(
        slot, values, n, rule == CheckRule::kBelowBound ? 1 : 0, bound);
    TRIDENT_CUDA_LAUNCH_CHECK("check_values");
    capture_value_kernel<<<1, 32, 0, stream_>>>(slot, values, n);
    TRIDENT_CUDA_LAUNCH_CHECK("check_values");
    pending_.push_back({n, std::move(fail)});
  }

  void read_back(void* host_dst, const void* device_src, std::int64_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    flush(lock, host_dst, device_src, bytes);
  }

  std::uint64_t read_later(void* host_dst, const void* device_src, std::int64_t bytes) {
    TRIDENT_CHECK(bytes > 0 && bytes <= kLaterBytes, "read_later: ", bytes, " bytes is not in (0, ",
                  kLaterBytes, "]");
    std::unique_lock<std::mutex> lock(mu_);
    if (later_bytes_ + bytes > kLaterBytes) {
      flush(lock, nullptr, nullptr, 0);
      lock.lock();
    }
    char* staged = static_cast<char*>(host_) + kSlotBytes + kValueBytes + later_bytes_;
    // Queued now: the value as the stream has it at this point, whatever runs after.
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(staged, device_src, static_cast<size_t>(bytes),
                                       cudaMemcpyDeviceToHost, stream_));
    later_.push_back({host_dst, staged, bytes});
    later_bytes_ += bytes;
    return ++tickets_;
  }

  void complete(std::uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mu_);
    if (ticket <= done_) return;  // a read-back since then delivered it
    flush(lock, nullptr, nullptr, 0);
  }

 private:
  // Called with mu_ held; releases it before reporting (the failure throws).
  void flush(std::unique_lock<std::mutex>& lock, void* host_dst, const void* device_src,
             std::int64_t bytes) {
    TRIDENT_CHECK(bytes >= 0 && bytes <= kValueBytes, "read_back: ", bytes,
                  " bytes is more than the ", kValueBytes, " of the read-back buffer");
    const std::size_t used = pending_.size();
    auto* host_slots = static_cast<unsigned long long*>(host_);
    char* host_value = static_cast<char*>(host_) + kSlotBytes;
    if (used > 0) {
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host_slots, slots_, used * 2 * sizeof(unsigned long long),
                                         cudaMemcpyDeviceToHost, stream_));
    }
    if (bytes > 0) {
      TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host_value, device_src, static_cast<size_t>(bytes),
                                         cudaMemcpyDeviceToHost, stream_));
    }
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (bytes > 0) std::memcpy(host_dst, host_value, static_cast<size_t>(bytes));
    for (const Later& l : later_) std::memcpy(l.host_dst, l.staged, static_cast<size_t>(l.bytes));
    later_.clear();
    later_bytes_ = 0;
    done_ = tickets_;
    std::vector<Pending> checks = std::move(pending_);
    pending_.clear();
    std::vector<unsigned long long> verdicts(host_slots, host_slots + 2 * used);
    lock.unlock();
    for (std::size_t i = 0; i < checks.size(); ++i) {
      const unsigned long long flag = verdicts[2 * i];
      if (flag == 0) continue;
      checks[i].fail(checks[i].n - static_cast<std::int64_t>(flag),
                     static_cast<std::int64_t>(verdicts[2 * i + 1]));
    }
  }

  std::mutex mu_;
  cudaStream_t stream_;
  unsigned long long* slots_ = nullptr;
  void* host_ = nullptr;
  std::vector<Pending> pending_;
  struct Later {
    void* host_dst;
    const char* staged;
    std::int64_t bytes;
  };
  std::vector<Later> later_;  // deferred reads: copied into host_ (queued), delivered at a flush
  std::int64_t later_bytes_ = 0;
  std::uint64_t tickets_ = 0, done_ = 0;
};

Ledger& ledger_of(cudaStream_t stream) {
  static std::mutex mu;
  static auto* ledgers = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Ledger>>;
  int device = 0;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Ledger>& l = (*ledgers)[{device, stream}];
  if (!l) l = std::make_unique<Ledger>(stream);
  return *l;
}

}  // namespace

void defer_check(cudaStream_t stream, const std::int32_t* values, std::int64_t n, CheckRule rule,
                 std::int64_t bound, CheckFailure fail) {
  if (n <= 0) return;
  ledger_of(stream).add(values, n, rule, bound, std::move(fail));
}

void read_back_bytes(cudaStream_t stream, void* host_dst, const void* device_src,
                     std::int64_t bytes) {
  ledger_of(stream).read_back(host_dst, device_src, bytes);
}

std::uint64_t read_later(void* stream, void* host_dst, const void* device_src, std::int64_t bytes) {
  return ledger_of(static_cast<cudaStream_t>(stream)).read_later(host_dst, device_src, bytes);
}

void complete_read(void* stream, std::uint64_t ticket) {
  ledger_of(static_cast<cudaStream_t>(stream)).complete(ticket);
}

}  // namespace trident::kernels::cuda
