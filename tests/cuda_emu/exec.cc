// cuemu's block executor: runs a kernel's blocks one at a time on the stream's worker thread, the
// threads of a block as fibers (default) or OS threads (CUEMU_THREADS=1), and enforces CUDA's rules
// for __syncthreads and the warp operations:
// - a barrier completes only when every thread of the block reaches the same __syncthreads; a
//   thread that exits while others wait there (or reaches it after others exited) is divergence;
// - a warp operation completes when every lane of its mask reaches it with the same mask; a mask
//   that does not hold the calling lane, names lanes that do not exist or have exited, or overlaps
//   another group's mask is an error; a shuffle that reads a lane outside its mask is an error;
// - when every live thread waits and nothing can complete, the block is deadlocked: reported at
//   once (no timeout), with where each thread waits.
// The first violation ends the block: every waiting thread unwinds, and the launch fails with a
// message naming the kernel, the block, the thread and the source line.
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>

#include "internal.h"

#if !defined(__x86_64__)
#error "cuemu's fibers switch x86-64 stacks; use CUEMU_THREADS=1 semantics on other machines"
#endif

// Switches stacks: saves the callee-saved registers on the current stack, stores the stack pointer
// in *save and resumes the context whose stack pointer is `to`. (The floating-point control state,
// MXCSR and the x87 control word, is not switched: device code does not change it.)
extern "C" void cuemu_switch(void** save, void* to);
extern "C" void cuemu_trampoline();
asm(R"(
  .text
  .globl cuemu_switch
  .type cuemu_switch, @function
cuemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuemu_switch, .-cuemu_switch

  .globl cuemu_trampoline
  .type cuemu_trampoline, @function
cuemu_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size cuemu_trampoline, .-cuemu_trampoline
)");

// ThreadSanitizer in thread mode (CUEMU_THREADS=1 under -fsanitize=thread). cuemu's bookkeeping
// lock is one per block: left visible, it would tell TSan that every thread taking it is ordered
// after every thread that took it before (a shuffle in warp 3 would order warp 0's reads after
// warp 3's writes), an order CUDA does not give, and a missing barrier would be reported or not
// depending on timing. So there the bookkeeping is hidden from TSan (its locks' synchronization
// and its own memory accesses), and the order CUDA does guarantee is stated instead: a barrier
// orders the whole block, a warp operation the lanes of its warp.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CUEMU_TSAN 1
#endif
#endif
#if !defined(CUEMU_TSAN) && defined(__SANITIZE_THREAD__)
#define CUEMU_TSAN 1
#endif
#ifdef CUEMU_TSAN
extern "C" {
void AnnotateIgnoreSyncBegin(const char* file, int line);
void AnnotateIgnoreSyncEnd(const char* file, int line);
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}
#endif

namespace cuemu::detail {

namespace {

struct KillBlock {};  // unwinds a CUDA thread of a block that has failed

const char* warp_kind_name(WarpKind k) {
  switch (k) {
    case WarpKind::kShflIdx:
      return "__shfl_sync";
    case WarpKind::kShflUp:
      return "__shfl_up_sync";
    case WarpKind::kShflDown:
      return "__shfl_down_sync";
    case WarpKind::kShflXor:
      return "__shfl_xor_sync";
    case WarpKind::kBallot:
      return "__ballot_sync";
    case WarpKind::kAny:
      return "__any_sync";
    case WarpKind::kAll:
      return "__all_sync";
    case WarpKind::kSyncWarp:
      return "__syncwarp";
  }
  return "a warp operation";
}

std::string at(const Loc& l) {
  std::string f = l.file_name();
  const auto slash = f.rfind('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(l.line());
}

bool same_site(const Loc& a, const Loc& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         std::string_view(a.file_name()) == b.file_name();
}

std::string mask_text(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", m);
  return buf;
}

std::string lanes_text(unsigned m) {
  std::string s;
  for (int i = 0; i < 32; ++i) {
    if (m >> i & 1u) s += (s.empty() ? "" : ",") + std::to_string(i);
  }
  return s;
}

// ---- fiber stacks
// --------------------------------------------------------------------------------
constexpr std::size_t kStackBytes = 256 * 1024;
constexpr std::size_t kGuard = 4096;

struct StackPool {
  std::vector<char*> stacks;  // each kStackBytes, a guard page below
  char* get(std::size_t i) {
    while (stacks.size() <= i) {
      void* m = mmap(nullptr, kStackBytes + kGuard, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) throw std::runtime_error("cuemu: cannot map a fiber stack");
      mprotect(m, kGuard, PROT_NONE);
      stacks.push_back(static_cast<char*>(m) + kGuard);
    }
    return stacks[i];
  }
};

// ---- the block
// -------------------------------------------------------------------------------------
enum class TState : std::uint8_t { kReady, kWaiting, kExited };

// A warp operation some lanes of a mask wait at (their values are in the block's lane arrays).
struct WarpOp {
  WarpKind kind{};
  unsigned mask = 0;  // 0: a free slot
  int width = 32;
  Loc loc;
  unsigned arrived = 0;
};

struct Block;
CUEMU_TLS Block* t_block = nullptr;
CUEMU_TLS int t_tid = 0;

struct Block {
  const KernelRun& run;
  const bool threaded;
  int nthreads = 0;
  uint3 bidx{};
  std::vector<TState> state;
  std::vector<uint3> tidx;
  struct Site {
    const char* what = "";
    Loc loc;
  };
  std::vector<Site> waiting_at;  // for deadlock reports
  int exited = 0, waiting = 0;
  bool killed = false;
  std::string error;

  // What ThreadSanitizer is told orders the threads (thread mode under TSan; only addresses):
  // the barrier's two alternating generations, each thread's count of barriers passed (read and
  // written by that thread only), one per warp.
  char bar_order[2] = {};
  std::vector<std::uint64_t> bars_passed;
  std::vector<char> warp_order;

  // __syncthreads
  int bar_arrived = 0;
  std::uint64_t bar_gen = 0;
  Loc bar_loc;
  BarrierKind bar_kind = BarrierKind::kPlain;
  int bar_acc = 0, bar_result = 0;

  // warps
  // Pending warp operations, per warp: a few groups of one warp may wait at once (a slot is free
  // when its mask is 0).
  static constexpr int kSlots = 8;
  std::vector<std::array<WarpOp, kSlots>> pending;
  std::vector<unsigned> present, gone;  // lanes that exist / have exited, per warp
  std::vector<std::uint64_t> result;
  std::vector<std::uint8_t> result_ready;
  std::vector<std::uint64_t> lane_bits;  // a waiting lane's value (per thread)
  std::vector<int> lane_arg;             // and its source lane, delta or lane mask

  // shared memory (the launch's layout, this block's contents)
  std::vector<std::pair<const void*, std::size_t>>* slots = nullptr;
  std::size_t* static_used = nullptr;
  unsigned char* static_smem = nullptr;
  unsigned char* dynamic_smem = nullptr;

  // thread mode: one condition variable per thread, so that a wake-up wakes only its thread
  std::mutex mu;
  std::unique_ptr<std::condition_variable[]> cvs;

  // fiber mode
  void* sched_sp = nullptr;
  std::vector<void*> fiber_sp;
  std::deque<int> runq;

  Block(const KernelRun& r, bool t) : run(r), threaded(t) {}

  std::string thread_name(int tid) const {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "block (%u,%u,%u) thread (%u,%u,%u)", bidx.x, bidx.y, bidx.z,
                  tidx[tid].x, tidx[tid].y, tidx[tid].z);
    return buf;
  }

  std::string prefix(int tid) const {
    return std::string("kernel ") + run.config.kernel + " (launched at " + run.config.file + ":" +
           std::to_string(run.config.line) + "), " + thread_name(tid) + ": ";
  }

  // Under the lock. Records the first error and releases every waiting thread to unwind.
  void kill(const std::string& message) {
    if (error.empty()) error = message;
    killed = true;
    for (int t = 0; t < nthreads; ++t) {
      if (state[t] == TState::kWaiting) wake(t);
    }
  }
  [[noreturn]] void fail(int tid, const std::string& what) {
    kill(prefix(tid) + what);
    throw KillBlock{};
  }

  void wake(int tid) {
    if (state[tid] != TState::kWaiting) return;
    state[tid] = TState::kReady;
    --waiting;
    if (threaded) {
      cvs[static_cast<std::size_t>(tid)].notify_one();
    } else {
      runq.push_back(tid);
    }
  }
  void wake_done() {}

  std::string deadlock_report() const {
    std::map<std::string, std::vector<int>> by_site;
    for (int t = 0; t < nthreads; ++t) {
      if (state[t] == TState::kWaiting) {
        by_site[std::string(waiting_at[t].what) + " at " + at(waiting_at[t].loc)].push_back(t);
      }
    }
    std::ostringstream os;
    os << "deadlock: all " << nthreads - exited << " live threads of the block wait and none can "
       << "go on (" << exited << " exited):";
    for (const auto& [site, ts] : by_site) {
      os << " " << ts.size() << " at " << site << " (threads " << ts.front();
      if (ts.size() > 1) os << ".." << ts.back();
      os << ");";
    }
    return os.str();
  }

  // Fiber mode: leaves the current fiber (its stack pointer saved in *save) for the next runnable
  // one directly, or for the scheduler when none is (the block is done, or deadlocked).
  void switch_away(void** save) {
    if (!runq.empty()) {
      const int t = runq.front();
      runq.pop_front();
      t_tid = t;
      threadIdx = tidx[static_cast<std::size_t>(t)];
      cuemu_switch(save, fiber_sp[static_cast<std::size_t>(t)]);
    } else {
      cuemu_switch(save, sched_sp);
    }
  }

  // Under the lock: the calling thread waits until woken; throws KillBlock if the block fails.
  template <class Lock>
  void wait(int tid, Lock& lock, const char* what, const Loc& loc) {
    waiting_at[tid] = {what, loc};
    if (waiting + 1 == nthreads - exited) {
      // Every other live thread waits too: nothing can complete. (The calling thread is named in
      // the report as waiting, but is not marked so: it unwinds now, not when woken.)
      state[tid] = TState::kWaiting;
      const std::string report = deadlock_report();
      state[tid] = TState::kReady;
      fail(tid, report);
    }
    state[tid] = TState::kWaiting;
    ++waiting;
    if (threaded) {
      cvs[static_cast<std::size_t>(tid)].wait(lock, [&] { return state[tid] != TState::kWaiting; });
    } else {
      switch_away(&fiber_sp[static_cast<std::size_t>(tid)]);
    }
    if (killed) throw KillBlock{};
  }

  // Under the lock.
  void exit_thread(int tid) {
    state[tid] = TState::kExited;
    ++exited;
    if (killed) return;
    const int w = tid >> 5;
    const unsigned bit = 1u << (tid & 31);
    gone[static_cast<std::size_t>(w)] |= bit;
    if (bar_arrived > 0) {
      kill(prefix(tid) + "exited while " + std::to_string(bar_arrived) +
           " threads wait at __syncthreads at " + at(bar_loc) +
           ": a barrier in divergent code (every thread of the block must reach it)");
      return;
    }
    for (const WarpOp& op : pending[static_cast<std::size_t>(w)]) {
      if (op.mask != 0 && (op.mask & bit)) {
        kill(prefix(tid) + "exited while lanes " + lanes_text(op.arrived) + " wait for it at " +
             warp_kind_name(op.kind) + " at " + at(op.loc) + " with mask " + mask_text(op.mask) +
             ": the mask names a lane that has exited");
        return;
      }
    }
    if (waiting > 0 && waiting == nthreads - exited) kill(prefix(tid) + deadlock_report());
  }
};

std::unique_lock<std::mutex> lock_of(Block& b) {
  return b.threaded ? std::unique_lock<std::mutex>(b.mu) : std::unique_lock<std::mutex>();
}

// While it lives, ThreadSanitizer ignores this thread's synchronization and memory accesses
// (thread mode under TSan; nothing otherwise).
class HiddenFromTsan {
 public:
  explicit HiddenFromTsan(bool on) : on_(on) {
#ifdef CUEMU_TSAN
    if (on_) {
      AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
      AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
      AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
#endif
  }
  ~HiddenFromTsan() {
#ifdef CUEMU_TSAN
    if (on_) {
      AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
      AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
      AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    }
#endif
  }
  HiddenFromTsan(const HiddenFromTsan&) = delete;
  HiddenFromTsan& operator=(const HiddenFromTsan&) = delete;

 private:
  [[maybe_unused]] bool on_;
};

// The block's bookkeeping lock (thread mode), hidden from ThreadSanitizer for as long as it is
// held: the members are built in order, so the hiding starts before the lock and ends after it.
class BlockLock {
 public:
  explicit BlockLock(Block& b) : hidden_(b.threaded), lock_(lock_of(b)) {}
  std::unique_lock<std::mutex>& get() { return lock_; }

 private:
  HiddenFromTsan hidden_;
  std::unique_lock<std::mutex> lock_;
};

// What CUDA orders, told to ThreadSanitizer (outside any BlockLock: hidden synchronization would
// be ignored too). Every thread of a group releases before it arrives and acquires after the
// group completes.
void tsan_release(const Block& b, char* order) {
#ifdef CUEMU_TSAN
  if (b.threaded) __tsan_release(order);
#else
  (void)b;
  (void)order;
#endif
}
void tsan_acquire(const Block& b, char* order) {
#ifdef CUEMU_TSAN
  if (b.threaded) __tsan_acquire(order);
#else
  (void)b;
  (void)order;
#endif
}

Block& current(const char* what) {
  if (!t_block) {
    throw std::logic_error(std::string("cuemu: ") + what + " called outside a kernel");
  }
  return *t_block;
}

// ---- fibers
// ----------------------------------------------------------------------------------------------
void fiber_main(void* arg);

struct FiberArg {
  Block* block;
  int tid;
};

void run_thread_body(Block& b, int tid) {
  try {
    bool killed = false;
    {
      BlockLock lock(b);
      killed = b.killed;
    }
    if (!killed) b.run.body();
  } catch (const KillBlock&) {
  } catch (const std::exception& e) {
    BlockLock lock(b);
    b.kill(b.prefix(tid) + "threw " + e.what());
  }
  BlockLock lock(b);
  b.exit_thread(tid);
  b.wake_done();
}

void fiber_main(void* arg) {
  auto* fa = static_cast<FiberArg*>(arg);
  Block& b = *fa->block;
  run_thread_body(b, fa->tid);
  void* dead = nullptr;
  b.switch_away(&dead);
  std::abort();  // never resumed
}

CUEMU_TLS StackPool* t_stacks = nullptr;

void* init_fiber(char* stack_low, FiberArg* arg) {
  auto top = reinterpret_cast<std::uintptr_t>(stack_low + kStackBytes);
  top &= ~std::uintptr_t{15};
  auto* sp = reinterpret_cast<std::uint64_t*>(top);
  // From the top: padding, the return address (the trampoline), rbp, rbx, r12 (arg), r13 (entry),
  // r14, r15. After the switch pops these and returns, rsp is 16-aligned at the trampoline, whose
  // call then enters fiber_main with the ABI's alignment.
  *--sp = 0;
  *--sp = 0;
  *--sp = reinterpret_cast<std::uint64_t>(&cuemu_trampoline);
  *--sp = 0;                                             // rbp
  *--sp = 0;                                             // rbx
  *--sp = reinterpret_cast<std::uint64_t>(arg);          // r12
  *--sp = reinterpret_cast<std::uint64_t>(&fiber_main);  // r13
  *--sp = 0;                                             // r14
  *--sp = 0;                                             // r15
  return sp;
}

void run_block_fibers(Block& b, const std::vector<int>& order) {
  if (!t_stacks) t_stacks = new StackPool;  // per worker thread, never freed
  std::vector<FiberArg> args(static_cast<std::size_t>(b.nthreads));
  b.fiber_sp.assign(static_cast<std::size_t>(b.nthreads), nullptr);
  for (int t = 0; t < b.nthreads; ++t) {
    args[static_cast<std::size_t>(t)] = {&b, t};
    b.fiber_sp[static_cast<std::size_t>(t)] =
        init_fiber(t_stacks->get(static_cast<std::size_t>(t)), &args[static_cast<std::size_t>(t)]);
  }
  for (int t : order) b.runq.push_back(t);
  // The fibers switch among themselves (Block::switch_away) and come back here when none is
  // runnable.
  while (!b.runq.empty()) b.switch_away(&b.sched_sp);
  // Every thread has exited (a failed block's waiting threads were woken and unwound).
}

// ---- OS threads (CUEMU_THREADS=1)
// ------------------------------------------------------------------
struct ThreadPool {
  std::mutex mu;
  std::condition_variable job_cv, done_cv;
  std::vector<std::thread> threads;
  std::uint64_t gen = 0;
  int n = 0, remaining = 0;
  std::function<void(int)> job;

  void run(int count, std::function<void(int)> fn) {
    std::unique_lock<std::mutex> lock(mu);
    while (static_cast<int>(threads.size()) < count) {
      const int idx = static_cast<int>(threads.size());
      threads.emplace_back([this, idx] { loop(idx); });
    }
    job = std::move(fn);
    n = count;
    remaining = count;
    ++gen;
    job_cv.notify_all();
    done_cv.wait(lock, [&] { return remaining == 0; });
  }

  void loop(int idx) {
    std::uint64_t seen = 0;
    for (;;) {
      std::function<void(int)> fn;
      {
        std::unique_lock<std::mutex> lock(mu);
        job_cv.wait(lock, [&] { return gen != seen && idx < n; });
        seen = gen;
        fn = job;
      }
      fn(idx);
      std::lock_guard<std::mutex> lock(mu);
      if (--remaining == 0) done_cv.notify_all();
    }
  }
};

CUEMU_TLS ThreadPool* t_pool = nullptr;

void run_block_threads(Block& b) {
  if (!t_pool) t_pool = new ThreadPool;  // per worker thread, never freed
  const uint3 bi = blockIdx;
  const dim3 bd = blockDim, gd = gridDim;
  t_pool->run(b.nthreads, [&b, bi, bd, gd](int t) {
    blockIdx = bi;
    blockDim = bd;
    gridDim = gd;
    threadIdx = b.tidx[static_cast<std::size_t>(t)];
    t_block = &b;
    t_tid = t;
    run_thread_body(b, t);
    t_block = nullptr;
  });
}

std::vector<int> thread_order(int n, std::mt19937_64& rng) {
  std::vector<int> order(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  if (config().schedule == "reverse") {
    std::reverse(order.begin(), order.end());
  } else if (config().schedule == "random") {
    std::shuffle(order.begin(), order.end(), rng);
  }
  return order;
}

}  // namespace

// ---- the device-side API
// ---------------------------------------------------------------------------
static int barrier(Block& b, int tid, BarrierKind kind, int predicate, const Loc& loc);

int syncthreads(BarrierKind kind, int predicate, Loc loc) {
  Block& b = current("__syncthreads");
  const int tid = t_tid;
  char* order = &b.bar_order[b.bars_passed[static_cast<std::size_t>(tid)]++ & 1];
  tsan_release(b, order);
  const int result = barrier(b, tid, kind, predicate, loc);
  tsan_acquire(b, order);
  return result;
}

static int barrier(Block& b, int tid, BarrierKind kind, int predicate, const Loc& loc) {
  BlockLock lock(b);
  if (b.killed) throw KillBlock{};
  if (b.exited > 0) {
    b.fail(tid, "reached __syncthreads at " + at(loc) + " after " + std::to_string(b.exited) +
                    " threads of the block exited: a barrier in divergent code (every thread of "
                    "the block must reach it)");
  }
  if (b.bar_arrived > 0 && !same_site(loc, b.bar_loc)) {
    b.fail(tid, "reached __syncthreads at " + at(loc) + " while " + std::to_string(b.bar_arrived) +
                    " threads wait at __syncthreads at " + at(b.bar_loc) + ": divergent barriers");
  }
  if (b.bar_arrived == 0) {
    b.bar_loc = loc;
    b.bar_kind = kind;
    b.bar_acc = kind == BarrierKind::kAnd ? 1 : 0;
  }
  switch (kind) {
    case BarrierKind::kCount:
      b.bar_acc += predicate != 0;
      break;
    case BarrierKind::kAnd:
      b.bar_acc = b.bar_acc && predicate != 0;
      break;
    case BarrierKind::kOr:
      b.bar_acc = b.bar_acc || predicate != 0;
      break;
    case BarrierKind::kPlain:
      break;
  }
  const std::uint64_t gen = b.bar_gen;
  if (++b.bar_arrived == b.nthreads) {
    b.bar_result = b.bar_acc;
    b.bar_arrived = 0;
    ++b.bar_gen;
    for (int t = 0; t < b.nthreads; ++t) b.wake(t);
    b.wake_done();
    return b.bar_result;
  }
  while (b.bar_gen == gen) b.wait(tid, lock.get(), "__syncthreads", loc);
  return b.bar_result;
}

static std::uint64_t warp_collective(Block& b, int tid, WarpKind kind, unsigned mask,
                                     std::uint64_t bits, int arg, int width, const Loc& loc);

std::uint64_t warp_op(WarpKind kind, unsigned mask, std::uint64_t bits, int arg, int width,
                      Loc loc) {
  Block& b = current(warp_kind_name(kind));
  const int tid = t_tid;
  char* order = &b.warp_order[static_cast<std::size_t>(tid >> 5)];
  tsan_release(b, order);
  const std::uint64_t result = warp_collective(b, tid, kind, mask, bits, arg, width, loc);
  tsan_acquire(b, order);
  return result;
}

static std::uint64_t warp_collective(Block& b, int tid, WarpKind kind, unsigned mask,
                                     std::uint64_t bits, int arg, int width, const Loc& loc) {
  const int lane = tid & 31;
  const auto w = static_cast<std::size_t>(tid >> 5);
  const unsigned bit = 1u << lane;
  BlockLock lock(b);
  if (b.killed) throw KillBlock{};
  auto name_of = [&] { return std::string(warp_kind_name(kind)) + " at " + at(loc); };
  if (!(mask & bit)) {
    b.fail(tid, name_of() + " with mask " + mask_text(mask) +
                    ", which does not hold the calling lane " + std::to_string(lane));
  }
  if (mask & ~b.present[w]) {
    b.fail(tid, name_of() + " with mask " + mask_text(mask) + " names lanes " +
                    lanes_text(mask & ~b.present[w]) + ", which do not exist (the block has " +
                    std::to_string(b.nthreads) + " threads)");
  }
  if (mask & b.gone[w]) {
    b.fail(tid, name_of() + " with mask " + mask_text(mask) + " names lanes " +
                    lanes_text(mask & b.gone[w]) +
                    ", which have exited (undefined behaviour: the mask must name live lanes)");
  }
  if (kind <= WarpKind::kShflXor && (width <= 0 || width > 32 || (width & (width - 1)) != 0)) {
    b.fail(tid, name_of() + ": width " + std::to_string(width) + " is not a power of two up to 32");
  }
  std::array<WarpOp, Block::kSlots>& ops = b.pending[w];
  WarpOp* op = nullptr;
  WarpOp* free_slot = nullptr;
  for (WarpOp& o : ops) {
    if (o.mask == 0) {
      if (!free_slot) free_slot = &o;
    } else if (o.mask == mask) {
      op = &o;
    } else if (o.mask & mask) {
      b.fail(tid, name_of() + " with mask " + mask_text(mask) + " while lanes " +
                      lanes_text(o.arrived) + " wait at " + warp_kind_name(o.kind) + " at " +
                      at(o.loc) + " with mask " + mask_text(o.mask) +
                      ": the masks overlap but differ");
    }
  }
  if (op != nullptr && (op->kind != kind || op->width != width)) {
    b.fail(tid, name_of() + " while lanes " + lanes_text(op->arrived) + " of the same mask " +
                    mask_text(mask) + " wait at " + warp_kind_name(op->kind) + " at " +
                    at(op->loc) + ": the lanes of one mask are at different warp operations");
  }
  if (op == nullptr) {
    if (free_slot == nullptr) {
      b.fail(tid, name_of() + ": more than " + std::to_string(Block::kSlots) +
                      " groups of one warp wait at warp operations at once (cuemu's limit)");
    }
    op = free_slot;
    op->kind = kind;
    op->mask = mask;
    op->width = width;
    op->loc = loc;
    op->arrived = 0;
  }
  b.lane_bits[static_cast<std::size_t>(tid)] = bits;
  b.lane_arg[static_cast<std::size_t>(tid)] = arg;
  op->arrived |= bit;
  b.result_ready[static_cast<std::size_t>(tid)] = 0;
  if (op->arrived != mask) {
    while (!b.result_ready[static_cast<std::size_t>(tid)])
      b.wait(tid, lock.get(), warp_kind_name(kind), loc);
    return b.result[static_cast<std::size_t>(tid)];
  }
  // The last lane of the mask: every lane's result; the slot is free again afterwards.
  const WarpOp& done = *op;
  const int base_tid = static_cast<int>(w) * 32;
  const std::uint64_t* vals = b.lane_bits.data() + base_tid;
  const int* args = b.lane_arg.data() + base_tid;
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l) {
    if ((done.mask >> l & 1u) && vals[l] != 0) ballot |= 1u << l;
  }
  for (int l = 0; l < 32; ++l) {
    if (!(done.mask >> l & 1u)) continue;
    std::uint64_t r = 0;
    const int seg = l & ~(done.width - 1);
    int src = -1;
    switch (done.kind) {
      case WarpKind::kShflIdx:
        src = seg + (args[l] & (done.width - 1));
        break;
      case WarpKind::kShflUp:
        src = (l - seg) >= args[l] ? l - args[l] : l;
        break;
      case WarpKind::kShflDown:
        src = (l - seg) + args[l] < done.width ? l + args[l] : l;
        break;
      case WarpKind::kShflXor: {
        const int x = l ^ args[l];
        src = (x >= 0 && x < seg + done.width) ? x : l;  // a later group: the lane's own value
        break;
      }
      case WarpKind::kBallot:
        r = ballot;
        break;
      case WarpKind::kAny:
        r = ballot != 0;
        break;
      case WarpKind::kAll:
        r = ballot == done.mask;
        break;
      case WarpKind::kSyncWarp:
        break;
    }
    if (src >= 0) {
      if (src > 31 || !(done.mask >> src & 1u)) {
        b.fail(base_tid + l, std::string(warp_kind_name(done.kind)) + " at " + at(done.loc) +
                                 ": lane " + std::to_string(l) + " reads lane " +
                                 std::to_string(src) + ", which is not in the mask " +
                                 mask_text(done.mask) + " (its value is undefined)");
      }
      r = vals[src];
    }
    const auto t = static_cast<std::size_t>(base_tid + l);
    b.result[t] = r;
    b.result_ready[t] = 1;
    b.wake(base_tid + l);
  }
  op->mask = 0;
  b.wake_done();
  return b.result[static_cast<std::size_t>(tid)];
}

unsigned active_mask() {
  Block& b = current("__activemask");
  BlockLock lock(b);
  const auto w = static_cast<std::size_t>(t_tid >> 5);
  return b.present[w] & ~b.gone[w];
}

void* shared_static(const void* slot, std::size_t bytes, std::size_t align, const char* type) {
  Block& b = current("a __shared__ variable");
  BlockLock lock(b);
  for (const auto& [s, off] : *b.slots) {
    if (s == slot) return b.static_smem + off;
  }
  const std::size_t off = (*b.static_used + align - 1) / align * align;
  if (off + bytes > 48 * 1024) {
    b.fail(t_tid, "static __shared__ memory of " + std::to_string(off + bytes) +
                      " bytes, more than the 48 KiB a GPU allows (" + type + ")");
  }
  b.slots->emplace_back(slot, off);
  *b.static_used = off + bytes;
  return b.static_smem + off;
}

void* shared_dynamic(std::size_t align) {
  Block& b = current("extern __shared__ memory");
  if (reinterpret_cast<std::uintptr_t>(b.dynamic_smem) % align != 0) {
    b.fail(t_tid, "dynamic shared memory is not aligned for its type");
  }
  return b.dynamic_smem;
}

// ---- kernels
// -------------------------------------------------------------------------------------------
void run_kernel(KernelRun& run) {
  const LaunchConfig& c = run.config;
  const bool threaded = config().threads;
  const int nthreads = static_cast<int>(c.block.x * c.block.y * c.block.z);
  const int nwarps = (nthreads + 31) / 32;
  std::vector<std::pair<const void*, std::size_t>> slots;
  std::size_t static_used = 0;
  alignas(64) static thread_local unsigned char static_smem[48 * 1024];
  std::vector<unsigned char> dynamic(std::max<std::size_t>(c.dynamic_smem, 1) + 64);
  unsigned char* dyn =
      dynamic.data() + (64 - reinterpret_cast<std::uintptr_t>(dynamic.data()) % 64);
  std::mt19937_64 rng(config().seed);

  gridDim = c.grid;
  blockDim = c.block;
  const std::uint64_t nblocks = std::uint64_t{c.grid.x} * c.grid.y * c.grid.z;
  std::size_t poisoned = sizeof(static_smem);
  // One Block for the whole launch, reset per block.
  Block b(run, threaded);
  b.nthreads = nthreads;
  b.waiting_at.assign(static_cast<std::size_t>(nthreads), Block::Site{});
  b.tidx.resize(static_cast<std::size_t>(nthreads));
  for (int t = 0; t < nthreads; ++t) {
    const auto u = static_cast<unsigned>(t);
    b.tidx[static_cast<std::size_t>(t)] = {u % c.block.x, u / c.block.x % c.block.y,
                                           u / (c.block.x * c.block.y)};
  }
  b.pending.assign(static_cast<std::size_t>(nwarps), {});
  b.present.assign(static_cast<std::size_t>(nwarps), 0u);
  for (int t = 0; t < nthreads; ++t) b.present[static_cast<std::size_t>(t >> 5)] |= 1u << (t & 31);
  b.gone.assign(static_cast<std::size_t>(nwarps), 0u);
  b.result.assign(static_cast<std::size_t>(nthreads), 0);
  b.result_ready.assign(static_cast<std::size_t>(nthreads), 0);
  b.lane_bits.assign(static_cast<std::size_t>(nthreads), 0);
  b.lane_arg.assign(static_cast<std::size_t>(nthreads), 0);
  b.warp_order.assign(static_cast<std::size_t>(nwarps), 0);
  b.slots = &slots;
  b.static_used = &static_used;
  b.static_smem = static_smem;
  b.dynamic_smem = dyn;
  if (threaded) {
    b.cvs = std::make_unique<std::condition_variable[]>(static_cast<std::size_t>(nthreads));
  }
  for (std::uint64_t i = 0; i < nblocks; ++i) {
    const std::uint64_t lin = config().reverse_blocks ? nblocks - 1 - i : i;
    const uint3 bi{static_cast<unsigned>(lin % c.grid.x),
                   static_cast<unsigned>(lin / c.grid.x % c.grid.y),
                   static_cast<unsigned>(lin / (std::uint64_t{c.grid.x} * c.grid.y))};
    blockIdx = bi;
    // A GPU's shared memory holds garbage when a block starts: poison it (NaN for floats).
    std::memset(static_smem, 0xff, poisoned);
    std::memset(dyn, 0xff, c.dynamic_smem);

    b.bidx = bi;
    b.state.assign(static_cast<std::size_t>(nthreads), TState::kReady);
    b.exited = b.waiting = 0;
    b.killed = false;
    b.bar_arrived = 0;
    b.bars_passed.assign(static_cast<std::size_t>(nthreads), 0);
    for (auto& slots_of_warp : b.pending) {
      for (WarpOp& o : slots_of_warp) o.mask = 0;
    }
    std::fill(b.gone.begin(), b.gone.end(), 0u);
    std::fill(b.result_ready.begin(), b.result_ready.end(), 0);
    if (threaded) {
      run_block_threads(b);
    } else {
      t_block = &b;
      run_block_fibers(b, thread_order(nthreads, rng));
      t_block = nullptr;
    }
    poisoned = std::max<std::size_t>(static_used, 1);
    if (!b.error.empty()) {
      fault(run.device, cudaErrorLaunchFailure, b.error);
      return;
    }
  }
}

}  // namespace cuemu::detail
