// Workspace: the scratch memory kernels use between their inputs and outputs (per-thread working
// rows of flash attention, for example), owned by whoever owns the ExecContext that points to it.
// Buffers grow to the largest request and are never shrunk, so once a run has seen its shapes
// (the first iteration) no kernel allocates: allocations() stops changing, which tests check.
//
// Thread safety: one kernel call at a time per Workspace. Inside a call, prepare() runs on the
// calling thread before the parallel region; each OpenMP thread then asks only for its own index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trident::core {

class Workspace {
 public:
  // Makes room for `threads` threads x `slots` buffers each (outside any parallel region).
  void prepare(int threads, int slots);
  // Buffer `slot` of thread `thread`, at least `count` floats (contents unspecified).
  float* floats(int thread, int slot, std::size_t count);

  // How many times a buffer (or the table of them) was allocated or grown, and the bytes held.
  std::int64_t allocations() const;
  std::int64_t bytes() const;

 private:
  std::vector<std::vector<std::vector<float>>> buffers_;  // [thread][slot]
  // Per thread, so that threads growing their own buffers do not share a counter.
  std::vector<std::int64_t> grown_;
  std::int64_t table_allocations_ = 0;
};

}  // namespace trident::core
