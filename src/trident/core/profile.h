// Per-op time accounting: where a step's time goes, from trident's own timers. Off by default
// (one relaxed atomic load per kernel call); on, every kernel dispatch that carries a Scope adds
// its wall time, and the FLOPs / bytes it was given, to one entry keyed by the op's name (and its
// GEMM shape). Times are exclusive: a scope nested in another (a matmul inside an attention)
// counts for the inner op only. Only the thread that enabled the profile records (the kernels'
// OpenMP workers do not call dispatch functions); calls from other threads are not counted.
//
//   core::profile::set_enabled(true); ... run steps ...; auto e = core::profile::entries();
// Used by bench/e2e/gpt_step_bench.cc --profile (docs/cpu-performance.md).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace trident::core::profile {

enum class Kind : std::uint8_t {
  kGemm,       // matrix products (linear layers, their backward)
  kAttention,  // softmax attention (its inner products included)
  kMemory,     // memory-bound elementwise / row kernels (norms, GeLU, embedding, BF16 copies)
  kLoss,       // softmax cross-entropy over the logits
  kOptimizer,  // AdamW, gradient norms
  kComm,       // collectives
};
inline constexpr std::size_t kNumKinds = 6;
const char* kind_name(Kind kind);

struct Entry {
  std::string name;
  Kind kind = Kind::kMemory;
  std::int64_t calls = 0;
  double seconds = 0;  // exclusive wall time
  double flops = 0;    // as given by the scopes (0: not a FLOP-bound op)
  double bytes = 0;    // minimum memory traffic as given by the scopes
};

namespace detail {
inline std::atomic<bool> g_enabled{false};
}
inline bool enabled() noexcept { return detail::g_enabled.load(std::memory_order_relaxed); }
// Starts (true: also clears the entries; the calling thread becomes the recording thread) or
// stops recording.
void set_enabled(bool on);
// Records again after set_enabled(false), keeping the entries and the recording thread (a pause:
// the trainer's evaluation inside a profiled window).
void resume();
void reset();
// A device's clock. On a device the kernels run after their launch returns, so a scope's wall
// time would be its launches'. With a timer set, each scope queues a mark on the device's stream
// at its start and stop (a CUDA event), and its time is the device's between the two marks,
// read when entries() is called (one wait for the last mark): the kernels' time, without a
// synchronization per op. Time the device spends idle (the host waiting on MPI, launching)
// counts for no scope.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  // Queues a mark after the work queued so far; returns its number (0, 1, ...).
  virtual std::int64_t mark() = 0;
  // Seconds between marks a and b (a before b), waiting for b to be reached.
  virtual double seconds_between(std::int64_t a, std::int64_t b) = 0;
  // Forgets the marks (their numbers restart at 0).
  virtual void clear() = 0;
};
// Set (or, with null, remove) the device timer of the recording thread's scopes; the scopes
// recorded until then are timed first.
void set_device_timer(std::shared_ptr<DeviceTimer> timer);
std::vector<Entry> entries();  // sorted by time, largest first

// Totals per kind (indexed by Kind; name = kind_name).
std::array<Entry, kNumKinds> by_kind(const std::vector<Entry>& entries);
// The entries added together by name (two intervals' entries into one), sorted by time.
std::vector<Entry> merged(const std::vector<Entry>& a, const std::vector<Entry>& b);
// Markdown tables of `entries` recorded over `steps` steps of `step_s` seconds each (on
// average): per op (the `top` slowest; GEMMs by shape) with calls and ms per step, share and rate
// (GFLOP/s or GB/s of minimum traffic), then per kind, then the time not in any scope (glue,
// waits outside collectives) and the step.
std::string format_table(const std::vector<Entry>& entries, double steps, double step_s,
                         std::size_t top = 1000);

class Scope {
 public:
  // name must outlive the scope (a literal). m, n, k >= 0 add a GEMM shape to the entry's key.
  Scope(Kind kind, const char* name, double flops = 0, double bytes = 0, std::int64_t m = -1,
        std::int64_t n = -1, std::int64_t k = -1) {
    if (enabled()) start(kind, name, flops, bytes, m, n, k);
  }
  ~Scope() {
    if (active_) stop();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void start(Kind kind, const char* name, double flops, double bytes, std::int64_t m,
             std::int64_t n, std::int64_t k);
  void stop();

  bool active_ = false;
  Kind kind_ = Kind::kMemory;
  const char* name_ = nullptr;
  double flops_ = 0, bytes_ = 0;
  std::int64_t m_ = -1, n_ = -1, k_ = -1;
  double child_s_ = 0;
  Scope* parent_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
  std::int64_t record_ = -1;  // with a device timer: this scope's record, timed later
};

}  // namespace trident::core::profile
