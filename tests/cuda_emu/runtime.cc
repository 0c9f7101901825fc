// cuemu's runtime: devices, errors, memory, streams, events, copies and launches, with the CUDA
// runtime's documented semantics (CUDA Runtime API, "API synchronization behavior" and "Stream
// synchronization behavior"). See cuda_runtime.h for the summary and docs/gpu.md for what the
// emulator checks and what it cannot.
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>

#include "cuemu/cuemu.h"
#include "internal.h"

long long clock64() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace cuemu::detail {

namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

const Config& config() {
  static const Config cfg = [] {
    Config c;
    c.threads = env_flag("CUEMU_THREADS");
    if (const char* v = std::getenv("CUEMU_DEVICE_COUNT"))
      c.device_count = std::max(0, std::atoi(v));
    if (const char* v = std::getenv("CUEMU_DEVICE_MODEL")) c.model = v;
    if (c.model != "h200" && c.model != "h100" && c.model != "a100") {
      std::fprintf(stderr, "cuemu: CUEMU_DEVICE_MODEL=%s is not h200, h100 or a100; using h200\n",
                   c.model.c_str());
      c.model = "h200";
    }
    if (const char* v = std::getenv("CUEMU_SCHEDULE")) c.schedule = v;
    if (c.schedule != "forward" && c.schedule != "reverse" && c.schedule != "random") {
      std::fprintf(stderr, "cuemu: CUEMU_SCHEDULE=%s is not forward, reverse or random\n",
                   c.schedule.c_str());
      c.schedule = "forward";
    }
    if (const char* v = std::getenv("CUEMU_BLOCK_ORDER"))
      c.reverse_blocks = std::strcmp(v, "reverse") == 0;
    if (const char* v = std::getenv("CUEMU_SEED")) c.seed = std::strtoull(v, nullptr, 10);
    if (const char* v = std::getenv("CUEMU_QUARANTINE_MB"))
      c.quarantine_bytes = std::atoll(v) << 20;
    c.host_pinned_in_kernels = env_flag("CUEMU_ALLOW_PINNED_IN_KERNELS");
    c.quiet = env_flag("CUEMU_QUIET");
    c.strict_host = env_flag("CUEMU_STRICT_HOST");
    // CUDA_VISIBLE_DEVICES: the listed indices, up to the first invalid one (as the driver reads
    // it).
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
      int visible = 0;
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        const long idx = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || idx < 0 || idx >= c.device_count) break;
        ++visible;
      }
      c.device_count = visible;
    }
    return c;
  }();
  return cfg;
}

// ---- global state
// ----------------------------------------------------------------------------------------
namespace {

struct DeviceState {
  Stream* legacy = nullptr;
  std::vector<Stream*> streams;  // every stream of the device, the legacy one included
  cudaError_t sticky = cudaSuccess;
  std::string sticky_message;
  std::int64_t used = 0, peak = 0;                 // all device allocations
  std::int64_t pool_used = 0, pool_used_high = 0;  // stream-ordered ones
  std::uint64_t release_threshold = 0;
};

struct EventState {
  int device = 0;
  unsigned flags = 0;
  bool recorded = false;
  Stream* stream = nullptr;
  std::uint64_t seq = 0;
  std::shared_ptr<std::atomic<double>> time;  // ms, set when the record is reached
  bool completion_seen = false;  // CUEMU_HOST_WAITS: a host query found this record complete
};

struct Global {
  std::mutex mu;  // streams, events, device state
  std::condition_variable progress;
  std::vector<DeviceState> devices;
  std::set<Stream*> live_streams;
  std::vector<std::unique_ptr<Stream>> all_streams;  // never freed: late dependencies read them
  std::set<EventState*> live_events;
  std::map<std::pair<std::thread::id, int>, Stream*> per_thread;

  std::mutex alloc_mu;  // the allocation registry
  std::map<std::uintptr_t, Allocation> allocs;
  std::deque<std::uintptr_t> quarantine;
  std::int64_t quarantine_bytes = 0;
  std::uint64_t next_id = 1;
  int max_dynamic_smem = 48 * 1024;
};

Global& g() {
  static Global* state = [] {
    auto* s = new Global;  // never destroyed: stream workers may outlive static destructors
    s->devices.resize(static_cast<std::size_t>(std::max(1, config().device_count)));
    return s;
  }();
  return *state;
}

CUEMU_TLS int t_device = 0;
CUEMU_TLS cudaError_t t_last_error = cudaSuccess;
thread_local std::unordered_map<int, std::string> t_details;  // the last detail per error code

std::atomic<std::uint64_t> g_faults{0};
std::mutex g_detail_mu;
std::unordered_map<int, std::string> g_details;  // sticky details, any thread

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidSymbol:
      return "cudaErrorInvalidSymbol";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorAssert:
      return "cudaErrorAssert";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

const char* error_text(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
    default:
      return "unknown error";
  }
}

DeviceState& dev_state(int device) { return g().devices.at(static_cast<std::size_t>(device)); }

}  // namespace

int current_device() { return t_device; }

void fault(int device, cudaError_t code, const std::string& message) {
  g_faults.fetch_add(1);
  const std::string text = "cuemu: " + message;
  if (!config().quiet) std::fprintf(stderr, "%s\n", text.c_str());
  {
    std::lock_guard<std::mutex> lock(g_detail_mu);
    g_details[code] = text;
  }
  std::lock_guard<std::mutex> lock(g().mu);
  DeviceState& d = dev_state(device);
  if (d.sticky == cudaSuccess) {
    d.sticky = code;
    d.sticky_message = text;
  }
}

cudaError_t call_error(cudaError_t code, const std::string& message) {
  t_last_error = code;
  t_details[code] = "cuemu: " + message;
  return code;
}

cudaError_t sticky_error(int device) {
  std::lock_guard<std::mutex> lock(g().mu);
  if (device < 0 || device >= static_cast<int>(g().devices.size())) return cudaSuccess;
  return dev_state(device).sticky;
}

std::string describe_error(cudaError_t code) {
  std::string s = error_text(code);
  auto it = t_details.find(code);
  if (it != t_details.end()) return s + " [" + it->second + "]";
  std::lock_guard<std::mutex> lock(g_detail_mu);
  auto jt = g_details.find(code);
  if (jt != g_details.end()) return s + " [" + jt->second + "]";
  return s;
}

// ---- memory
// -----------------------------------------------------------------------------------------------
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kAlign = 256;

std::mutex g_open_mu;  // CUEMU_STRICT_HOST: device memory is open while g_open > 0
int g_open = 0;        // stream operations running

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

const char* kind_name(MemKind k) {
  switch (k) {
    case MemKind::kDevice:
      return "device memory";
    case MemKind::kManaged:
      return "managed memory";
    case MemKind::kPinnedHost:
      return "pinned host memory (cudaHostAlloc)";
    case MemKind::kRegisteredHost:
      return "registered host memory (cudaHostRegister)";
  }
  return "memory";
}

Lookup find_locked(std::uintptr_t p) {
  Global& s = g();
  auto it = s.allocs.upper_bound(p);
  if (it == s.allocs.begin()) return {};
  --it;
  const Allocation& a = it->second;
  if (p >= a.base && p <= a.base + a.bytes) return {true, a};
  return {};
}

// Device or managed memory at the end of its own mapping, a guard page after it, poisoned.
void* map_device(std::size_t bytes, MemKind kind, int device, bool stream_ordered) {
  const std::size_t rounded = round_up(std::max<std::size_t>(bytes, 1), kAlign);
  const std::size_t map_bytes = round_up(rounded, kPage) + kPage;
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* end = static_cast<char*>(m) + map_bytes - kPage;
  mprotect(end, kPage, PROT_NONE);
  char* base = end - rounded;
  std::memset(base, 0xff, rounded);
  Allocation a;
  a.base = reinterpret_cast<std::uintptr_t>(base);
  a.bytes = bytes;
  a.kind = kind;
  a.device = device;
  a.map_base = m;
  a.map_bytes = map_bytes;
  a.stream_ordered = stream_ordered;
  {
    std::lock_guard<std::mutex> lock(g().alloc_mu);
    a.id = g().next_id++;
    g().allocs[a.base] = a;
  }
  if (config().strict_host && kind == MemKind::kDevice) {
    std::lock_guard<std::mutex> lock(g_open_mu);
    if (g_open == 0) mprotect(m, map_bytes - kPage, PROT_NONE);
  }
  {
    std::lock_guard<std::mutex> lock(g().mu);
    DeviceState& d = dev_state(device);
    d.used += static_cast<std::int64_t>(bytes);
    d.peak = std::max(d.peak, d.used);
    if (stream_ordered) {
      d.pool_used += static_cast<std::int64_t>(bytes);
      d.pool_used_high = std::max(d.pool_used_high, d.pool_used);
    }
  }
  return base;
}

// Marks the allocation at `base` freed and unmaps its pages (kept reserved while quarantined, so
// that a late access faults and the SIGSEGV handler names it).
bool release(std::uintptr_t base, const std::string& by) {
  Allocation a;
  {
    std::lock_guard<std::mutex> lock(g().alloc_mu);
    auto it = g().allocs.find(base);
    if (it == g().allocs.end() || it->second.freed) return false;
    it->second.freed = true;
    it->second.freed_by = by;
    a = it->second;
    if (a.map_base) {
      mprotect(a.map_base, a.map_bytes, PROT_NONE);
      g().quarantine.push_back(base);
      g().quarantine_bytes += static_cast<std::int64_t>(a.map_bytes);
      while (g().quarantine_bytes > config().quarantine_bytes && !g().quarantine.empty()) {
        auto old = g().allocs.find(g().quarantine.front());
        g().quarantine.pop_front();
        if (old == g().allocs.end()) continue;
        munmap(old->second.map_base, old->second.map_bytes);
        g().quarantine_bytes -= static_cast<std::int64_t>(old->second.map_bytes);
        g().allocs.erase(old);
      }
    }
  }
  if (a.kind == MemKind::kDevice || a.kind == MemKind::kManaged) {
    std::lock_guard<std::mutex> lock(g().mu);
    DeviceState& d = dev_state(a.device);
    d.used -= static_cast<std::int64_t>(a.bytes);
    if (a.stream_ordered) d.pool_used -= static_cast<std::int64_t>(a.bytes);
  }
  return true;
}

// ---- strict host access (CUEMU_STRICT_HOST=1) ----
// Device memory is readable only while a stream operation runs (they all run inline then); the
// rest of the time host code touching it faults, and the SIGSEGV handler names the allocation.
bool protectable(const Allocation& a) {
  return a.map_base != nullptr && !a.freed && a.kind == MemKind::kDevice;
}

void set_device_access(bool open) {  // under alloc_mu
  for (const auto& [base, a] : g().allocs) {
    if (!protectable(a)) continue;
    mprotect(a.map_base, a.map_bytes - kPage, open ? PROT_READ | PROT_WRITE : PROT_NONE);
  }
}

struct OpenDeviceMemory {
  OpenDeviceMemory() {
    if (!config().strict_host) return;
    std::lock_guard<std::mutex> lock(g_open_mu);
    if (g_open++ == 0) {
      std::lock_guard<std::mutex> alloc_lock(g().alloc_mu);
      set_device_access(true);
    }
  }
  ~OpenDeviceMemory() {
    if (!config().strict_host) return;
    std::lock_guard<std::mutex> lock(g_open_mu);
    if (--g_open == 0) {
      std::lock_guard<std::mutex> alloc_lock(g().alloc_mu);
      set_device_access(false);
    }
  }
};

// The SIGSEGV handler: a fault inside a guard page or freed memory is named before the process
// dies (best effort: the registry lock may be held by the faulting thread).
CUEMU_TLS const KernelRun* t_kernel = nullptr;
struct sigaction g_old_segv;

void segv_handler(int sig, siginfo_t* info, void* ctx) {
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  char msg[512];
  int len = 0;
  if (g().alloc_mu.try_lock()) {
    for (const auto& [base, a] : g().allocs) {
      if (!a.map_base) continue;
      const auto m = reinterpret_cast<std::uintptr_t>(a.map_base);
      if (addr < m || addr >= m + a.map_bytes) continue;
      if (a.freed) {
        len = std::snprintf(msg, sizeof(msg),
                            "cuemu: access to %p: allocation %" PRIu64
                            " (%zu bytes at %p) was "
                            "freed (%s): a use after free\n",
                            info->si_addr, a.id, a.bytes, reinterpret_cast<void*>(a.base),
                            a.freed_by.c_str());
      } else if (config().strict_host && addr >= a.base && addr < a.base + a.bytes) {
        len = std::snprintf(msg, sizeof(msg),
                            "cuemu: host code accessed device memory at %p: allocation %" PRIu64
                            " (%zu bytes on device %d), offset %zu. On a GPU this is an illegal "
                            "access (or, with HMM, PCIe traffic): copy it through the staging code "
                            "(CUEMU_STRICT_HOST=1)\n",
                            info->si_addr, a.id, a.bytes, a.device,
                            static_cast<std::size_t>(addr - a.base));
      } else {
        len = std::snprintf(msg, sizeof(msg),
                            "cuemu: access to %p, %zu bytes past the end of allocation %" PRIu64
                            " (%zu bytes at %p): out of bounds\n",
                            info->si_addr, static_cast<std::size_t>(addr - a.base - a.bytes), a.id,
                            a.bytes, reinterpret_cast<void*>(a.base));
      }
      break;
    }
    g().alloc_mu.unlock();
  }
  if (len > 0) {
    (void)!write(2, msg, static_cast<std::size_t>(len));
    if (t_kernel) {
      len =
          std::snprintf(msg, sizeof(msg),
                        "cuemu: in kernel %s (launched at %s:%d), block (%u,%u,%u), thread "
                        "(%u,%u,%u)\n",
                        t_kernel->config.kernel, t_kernel->config.file, t_kernel->config.line,
                        blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
      (void)!write(2, msg, static_cast<std::size_t>(len));
    } else {
      const char host[] = "cuemu: by host code (not in a kernel); its stack:\n";
      (void)!write(2, host, sizeof(host) - 1);
      void* frames[48];
      const int n = backtrace(frames, 48);
      backtrace_symbols_fd(frames, n, 2);
    }
  }
  sigaction(SIGSEGV, &g_old_segv, nullptr);
  if (g_old_segv.sa_flags & SA_SIGINFO) {
    if (g_old_segv.sa_sigaction) g_old_segv.sa_sigaction(sig, info, ctx);
  }
  // Returning re-runs the faulting access under the previous (default) handler.
}

void install_segv_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
  });
}

}  // namespace

Lookup find_allocation(const void* p) {
  std::lock_guard<std::mutex> lock(g().alloc_mu);
  return find_locked(reinterpret_cast<std::uintptr_t>(p));
}

std::string describe_pointer(const void* p) {
  const Lookup l = find_allocation(p);
  if (!l.found)
    return hex(p) +
           ", which is not memory of any CUDA allocation (host memory: the "
           "stack, the heap or a global)";
  std::ostringstream os;
  os << hex(p) << ", " << kind_name(l.a.kind) << " of device " << l.a.device << " (allocation "
     << l.a.id << ", " << l.a.bytes << " bytes at " << hex(reinterpret_cast<void*>(l.a.base))
     << ", offset " << reinterpret_cast<std::uintptr_t>(p) - l.a.base << ")";
  if (l.a.freed) os << ", FREED by " << l.a.freed_by;
  return os.str();
}

// ---- streams
// -----------------------------------------------------------------------------------------------
namespace {

void worker_loop(Stream* s) {
  Global& st = g();
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lock(st.mu);
      s->work.wait(lock, [&] { return s->stop || !s->queue.empty(); });
      if (s->queue.empty()) return;
      t = std::move(s->queue.front());
      s->queue.pop_front();
      st.progress.wait(lock, [&] {
        for (const auto& [d, seq] : t.deps) {
          if (d->completed < seq) return false;
        }
        return true;
      });
    }
    t_device = s->device;
    if (sticky_error(s->device) == cudaSuccess) {
      try {
        t.fn();
      } catch (const std::exception& e) {
        fault(s->device, cudaErrorLaunchFailure, std::string(t.what) + ": " + e.what());
      }
    }
    {
      std::lock_guard<std::mutex> lock(st.mu);
      ++s->completed;
    }
    st.progress.notify_all();
  }
}

// Under g().mu.
Stream* new_stream_locked(int device, bool legacy, bool blocking, const std::string& name) {
  auto s = std::make_unique<Stream>();
  s->device = device;
  s->legacy = legacy;
  s->blocking = blocking;
  s->name = name;
  Stream* raw = s.get();
  g().all_streams.push_back(std::move(s));
  g().live_streams.insert(raw);
  dev_state(device).streams.push_back(raw);
  if (!config().strict_host) {  // strict mode runs every operation inline
    raw->worker = std::thread(worker_loop, raw);
    raw->worker.detach();
  }
  return raw;
}

Stream* legacy_locked(int device) {
  DeviceState& d = dev_state(device);
  if (!d.legacy) {
    d.legacy = new_stream_locked(device, true, true,
                                 "the legacy default stream of device " + std::to_string(device));
  }
  return d.legacy;
}

}  // namespace

Stream* resolve_stream(cudaStream_t handle) {
  std::lock_guard<std::mutex> lock(g().mu);
  if (handle == nullptr || handle == cudaStreamLegacy) return legacy_locked(t_device);
  if (handle == cudaStreamPerThread) {
    auto key = std::make_pair(std::this_thread::get_id(), t_device);
    auto it = g().per_thread.find(key);
    if (it != g().per_thread.end()) return it->second;
    Stream* s = new_stream_locked(t_device, false, true, "a per-thread default stream");
    g().per_thread[key] = s;
    return s;
  }
  auto* s = reinterpret_cast<Stream*>(handle);
  if (!g().live_streams.count(s)) return nullptr;
  return s;
}

std::uint64_t enqueue(Stream* s, const char* what, std::function<void()> fn,
                      std::vector<std::pair<Stream*, std::uint64_t>> extra_deps) {
  if (config().strict_host) {
    // Inline: everything queued before has run, so every dependency holds.
    std::uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(g().mu);
      seq = ++s->enqueued;
    }
    if (sticky_error(s->device) == cudaSuccess) {
      const int saved = t_device;
      t_device = s->device;
      try {
        const OpenDeviceMemory open;
        fn();
      } catch (const std::exception& e) {
        fault(s->device, cudaErrorLaunchFailure, std::string(what) + ": " + e.what());
      }
      t_device = saved;
    }
    {
      std::lock_guard<std::mutex> lock(g().mu);
      ++s->completed;
    }
    g().progress.notify_all();
    return seq;
  }
  std::lock_guard<std::mutex> lock(g().mu);
  Task t;
  t.fn = std::move(fn);
  t.what = what;
  t.deps = std::move(extra_deps);
  // The legacy default stream waits for the work already queued on every blocking stream of its
  // device, and a blocking stream waits for the work already queued on the legacy stream.
  if (s->legacy) {
    for (Stream* o : dev_state(s->device).streams) {
      if (o != s && o->blocking && !o->legacy && o->enqueued > 0)
        t.deps.emplace_back(o, o->enqueued);
    }
  } else if (s->blocking) {
    Stream* l = legacy_locked(s->device);
    if (l->enqueued > 0) t.deps.emplace_back(l, l->enqueued);
  }
  s->queue.push_back(std::move(t));
  const std::uint64_t seq = ++s->enqueued;
  s->work.notify_one();
  return seq;
}

// CUEMU_HOST_WAITS=path: the host's waits on the device (each call that blocks the calling thread
// until device work completes, by API, and each event a host poll found complete), appended to the
// file as one line when the process exits, so that a test can count the host syncs of a step.
// Counted are the waits of the process's main thread, the one that feeds the device; those of
// other threads (a watchdog polling events, a background saver) do not stall its queue and are
// reported apart (other_threads=N, after the counts by API).
namespace {
struct HostWaits {
  std::mutex mu;
  std::map<std::string, std::int64_t> by_api;
  std::int64_t other_threads = 0;
};
HostWaits& host_waits() {
  static HostWaits* w = [] {
    auto* h = new HostWaits;  // never destroyed: written by the atexit hook
    std::atexit([] {
      const char* path = std::getenv("CUEMU_HOST_WAITS");
      HostWaits& hw = host_waits();
      std::lock_guard<std::mutex> lock(hw.mu);
      std::int64_t total = 0;
      std::string line;
      for (const auto& [api, n] : hw.by_api) {
        total += n;
        line += " " + api + "=" + std::to_string(n);
      }
      line += " other_threads=" + std::to_string(hw.other_threads);
      if (FILE* f = std::fopen(path, "a")) {
        std::fprintf(f, "pid=%d total=%" PRId64 "%s\n", static_cast<int>(::getpid()), total,
                     line.c_str());
        std::fclose(f);
      }
    });
    return h;
  }();
  return *w;
}

void count_host_wait(const char* api) {
  static const bool on = [] {
    const char* path = std::getenv("CUEMU_HOST_WAITS");
    return path != nullptr && *path != '\0';
  }();
  if (!on) return;
  HostWaits& w = host_waits();
  std::lock_guard<std::mutex> lock(w.mu);
  if (static_cast<pid_t>(::syscall(SYS_gettid)) != ::getpid()) {
    ++w.other_threads;
    return;
  }
  ++w.by_api[api];
  static const bool trace = env_flag("CUEMU_HOST_WAITS_TRACE");
  if (trace) {  // where each wait comes from (symbols need -rdynamic or addr2line)
    void* frames[24];
    const int n = backtrace(frames, 24);
    std::fprintf(stderr, "cuemu: host wait (%s):\n", api);
    backtrace_symbols_fd(frames, n, 2);
  }
}
}  // namespace

void wait_for(Stream* s, std::uint64_t seq) {
  std::unique_lock<std::mutex> lock(g().mu);
  g().progress.wait(lock, [&] { return s->completed >= seq; });
}

std::uint64_t queued(Stream* s) {
  std::lock_guard<std::mutex> lock(g().mu);
  return s->enqueued;
}

namespace {

std::uint64_t enqueued_of(Stream* s) { return queued(s); }

void sync_device(int device) {
  std::vector<std::pair<Stream*, std::uint64_t>> targets;
  {
    std::lock_guard<std::mutex> lock(g().mu);
    for (Stream* s : dev_state(device).streams) targets.emplace_back(s, s->enqueued);
  }
  for (auto& [s, seq] : targets) wait_for(s, seq);
}

void sync_all_devices() {
  for (int d = 0; d < static_cast<int>(g().devices.size()); ++d) sync_device(d);
}

// Errors every call returns once a kernel has faulted on the device.
#define CUEMU_STICKY()                                                  \
  do {                                                                  \
    const cudaError_t sticky_ = sticky_error(t_device);                 \
    if (sticky_ != cudaSuccess) return t_last_error = sticky_, sticky_; \
  } while (0)

enum class Side { kDevice, kPinned, kPageable };

struct Resolved {
  Side side = Side::kPageable;
  Lookup l;
};

Resolved resolve(const void* p) {
  Resolved r;
  r.l = find_allocation(p);
  if (!r.l.found) return r;
  switch (r.l.a.kind) {
    case MemKind::kDevice:
    case MemKind::kManaged:
      r.side = Side::kDevice;
      break;
    case MemKind::kPinnedHost:
    case MemKind::kRegisteredHost:
      r.side = Side::kPinned;
      break;
  }
  return r;
}

const char* kind_text(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault:
      return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

// Checks one side of a copy or memset: not freed, within its allocation.
std::optional<std::string> check_extent(const char* role, const void* p, std::size_t bytes,
                                        const Resolved& r) {
  if (!r.l.found) return std::nullopt;
  if (r.l.a.freed) {
    return std::string(role) + " " + describe_pointer(p) + ": a use after free";
  }
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(p) + bytes;
  if (end > r.l.a.base + r.l.a.bytes) {
    return std::string(role) + " " + describe_pointer(p) + ": " + std::to_string(bytes) +
           " bytes run " + std::to_string(end - r.l.a.base - r.l.a.bytes) +
           " bytes past the end of the allocation";
  }
  return std::nullopt;
}

// Before a queued copy runs: its device sides must still be alive in stream order.
bool alive(const void* p) {
  const Lookup l = find_allocation(p);
  return !l.found || !l.a.freed;
}

cudaError_t copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                 cudaStream_t stream, bool sync_call, const char* api) {
  CUEMU_STICKY();
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return call_error(cudaErrorInvalidValue, std::string(api) + ": a null pointer");
  Stream* s = resolve_stream(stream);
  if (!s)
    return call_error(cudaErrorInvalidResourceHandle, std::string(api) + ": an invalid stream");
  const Resolved d = resolve(dst), r = resolve(src);
  // The kind must agree with the pointers (the CUDA documentation: "Calling cudaMemcpy() with dst
  // and src pointers that do not match the direction of the copy results in undefined behavior").
  auto mismatch = [&](const char* why) {
    return call_error(cudaErrorInvalidValue, std::string(api) + " with " + kind_text(kind) + ": " +
                                                 why + " (dst " + describe_pointer(dst) + "; src " +
                                                 describe_pointer(src) + ")");
  };
  switch (kind) {
    case cudaMemcpyHostToDevice:
      if (d.side != Side::kDevice) return mismatch("the destination is not device memory");
      if (r.side == Side::kDevice && r.l.a.kind == MemKind::kDevice)
        return mismatch("the source is device memory");
      break;
    case cudaMemcpyDeviceToHost:
      if (r.side != Side::kDevice) return mismatch("the source is not device memory");
      if (d.side == Side::kDevice && d.l.a.kind == MemKind::kDevice)
        return mismatch("the destination is device memory");
      break;
    case cudaMemcpyDeviceToDevice:
      if (d.side != Side::kDevice || r.side != Side::kDevice)
        return mismatch("both pointers must be device memory");
      break;
    case cudaMemcpyHostToHost:
      if ((d.side == Side::kDevice && d.l.a.kind == MemKind::kDevice) ||
          (r.side == Side::kDevice && r.l.a.kind == MemKind::kDevice))
        return mismatch("a pointer is device memory");
      break;
    case cudaMemcpyDefault:
      break;
    default:
      return call_error(cudaErrorInvalidMemcpyDirection, std::string(api) + ": bad kind");
  }
  if (auto e = check_extent("the destination", dst, bytes, d))
    return call_error(cudaErrorInvalidValue, std::string(api) + ": " + *e);
  if (auto e = check_extent("the source", src, bytes, r))
    return call_error(cudaErrorInvalidValue, std::string(api) + ": " + *e);

  const bool src_pageable = r.side == Side::kPageable, dst_pageable = d.side == Side::kPageable;
  const int device = s->device;
  auto body = [dst, src, bytes, device, api](const void* from) {
    if (!alive(dst) || !alive(from)) {
      fault(device, cudaErrorIllegalAddress,
            std::string(api) + " ran after its memory was freed: dst " + describe_pointer(dst) +
                "; src " + describe_pointer(src));
      return;
    }
    std::memcpy(dst, from, bytes);
  };
  if (src_pageable && dst_pageable) {
    // Host to host: fully synchronous.
    count_host_wait(api);
    wait_for(s, enqueue(s, api, [=] { body(src); }));
    return sticky_error(device);
  }
  if (src_pageable) {
    // A pageable source is staged before the call returns (the buffer may be reused at once).
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    const std::uint64_t seq = enqueue(s, api, [=] { body(staged->data()); });
    // cudaMemcpy from pageable memory returns once the source is staged; the copy to the device
    // is not awaited. Either way the caller may reuse src now.
    (void)seq;
    return cudaSuccess;
  }
  const std::uint64_t seq = enqueue(s, api, [=] { body(src); });
  // A pageable destination, or a synchronous call (other than device to device), completes
  // before returning.
  const bool d2d = d.side == Side::kDevice && r.side == Side::kDevice;
  if (dst_pageable || (sync_call && !d2d)) {
    count_host_wait(api);
    wait_for(s, seq);
    return sticky_error(device);
  }
  return cudaSuccess;
}

cudaError_t memset_impl(void* p, int value, std::size_t bytes, cudaStream_t stream,
                        const char* api) {
  CUEMU_STICKY();
  if (bytes == 0) return cudaSuccess;
  Stream* s = resolve_stream(stream);
  if (!s)
    return call_error(cudaErrorInvalidResourceHandle, std::string(api) + ": an invalid stream");
  const Resolved r = resolve(p);
  if (r.side != Side::kDevice) {
    return call_error(cudaErrorInvalidValue,
                      std::string(api) + ": " + describe_pointer(p) + " is not device memory");
  }
  if (auto e = check_extent("the destination", p, bytes, r))
    return call_error(cudaErrorInvalidValue, std::string(api) + ": " + *e);
  const int device = s->device;
  enqueue(s, api, [=] {
    if (!alive(p)) {
      fault(device, cudaErrorIllegalAddress,
            std::string(api) + " ran after its memory was freed: " + describe_pointer(p));
      return;
    }
    std::memset(p, value, bytes);
  });
  return cudaSuccess;
}

struct ModelProps {
  const char* name;
  std::size_t total;
  int sms, major, minor, l2, bus;
  std::size_t smem_optin, smem_sm;
  int clock_khz;  // the maximum SM clock, as cudaDevAttrClockRate reports it
};

ModelProps model_props() {
  const std::string& m = config().model;
  if (m == "a100")
    return {"NVIDIA A100-SXM4-80GB",
            85174583296ull,
            108,
            8,
            0,
            41943040,
            5120,
            166912,
            167936,
            1410000};
  if (m == "h100")
    return {"NVIDIA H100 80GB HBM3",
            85029158912ull,
            132,
            9,
            0,
            52428800,
            5120,
            232448,
            233472,
            1980000};
  return {"NVIDIA H200", 150754820096ull, 132, 9, 0, 52428800, 6144, 232448, 233472, 1980000};
}

}  // namespace

// ---- launches
// ----------------------------------------------------------------------------------------------
namespace {

// CUEMU_LAUNCH_LOG=path: each distinct (kernel, threads per block, dynamic shared memory, source
// file) of the process is appended to the file, one line each, so that the block sizes the kernels
// really run with can be checked against nvcc's register counts (scripts/check-cuda-resources).
void log_launch(const LaunchConfig& cfg) {
  static const char* path = std::getenv("CUEMU_LAUNCH_LOG");
  if (path == nullptr || *path == '\0') return;
  static std::mutex mu;
  static std::set<std::string> seen;
  const std::string line = std::string(cfg.kernel) + " " +
                           std::to_string(cfg.block.x * cfg.block.y * cfg.block.z) + " " +
                           std::to_string(cfg.dynamic_smem) + " " + cfg.file + "\n";
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(line).second) return;
  if (FILE* f = std::fopen(path, "a")) {
    std::fputs(line.c_str(), f);
    std::fclose(f);
  }
}

}  // namespace

void launch(const LaunchConfig& cfg, std::vector<PointerArg> pointers,
            std::function<void()> thread_body) {
  install_segv_handler();
  const std::string where = std::string("kernel ") + cfg.kernel + " launched at " + cfg.file + ":" +
                            std::to_string(cfg.line);
  if (const cudaError_t e = sticky_error(t_device); e != cudaSuccess) {
    t_last_error = e;
    return;
  }
  if (config().device_count == 0) {
    call_error(cudaErrorNoDevice, where +
                                      ": no emulated device (CUEMU_DEVICE_COUNT=0 or "
                                      "CUDA_VISIBLE_DEVICES lists none)");
    return;
  }
  Stream* s = resolve_stream(cfg.stream);
  if (!s) {
    call_error(cudaErrorInvalidResourceHandle, where + ": the stream is not a live stream");
    return;
  }
  const dim3 b = cfg.block, gr = cfg.grid;
  auto bad = [&](const std::string& why) {
    char dims[160];
    std::snprintf(dims, sizeof(dims), " with grid (%u,%u,%u) and block (%u,%u,%u): ", gr.x, gr.y,
                  gr.z, b.x, b.y, b.z);
    call_error(cudaErrorInvalidConfiguration, where + dims + why);
  };
  const std::uint64_t threads = std::uint64_t{b.x} * b.y * b.z;
  if (b.x == 0 || b.y == 0 || b.z == 0) return bad("an empty block");
  if (gr.x == 0 || gr.y == 0 || gr.z == 0) return bad("an empty grid");
  if (threads > 1024) return bad(std::to_string(threads) + " threads per block, more than 1024");
  if (b.x > 1024 || b.y > 1024 || b.z > 64) return bad("a block dimension beyond (1024, 1024, 64)");
  if (gr.x > 2147483647u || gr.y > 65535 || gr.z > 65535)
    return bad("a grid dimension beyond (2^31-1, 65535, 65535)");
  {
    std::lock_guard<std::mutex> lock(g().alloc_mu);
    if (cfg.dynamic_smem > static_cast<std::size_t>(g().max_dynamic_smem)) {
      return bad(std::to_string(cfg.dynamic_smem) + " bytes of dynamic shared memory, more than " +
                 std::to_string(g().max_dynamic_smem) +
                 " (raise it with cudaFuncSetAttribute(MaxDynamicSharedMemorySize))");
    }
  }
  log_launch(cfg);
  auto run = std::make_shared<KernelRun>();
  run->config = cfg;
  run->device = s->device;
  run->body = std::move(thread_body);
  // Every pointer the kernel receives must be device memory of its device, alive.
  for (const PointerArg& p : pointers) {
    if (p.p == nullptr) continue;
    const Lookup l = find_allocation(p.p);
    std::string why;
    if (!l.found) {
      why = "is not device memory: a host pointer is an illegal address on a GPU";
    } else if (l.a.freed) {
      why = "points into freed memory (a use after free)";
    } else if ((l.a.kind == MemKind::kPinnedHost || l.a.kind == MemKind::kRegisteredHost) &&
               !config().host_pinned_in_kernels) {
      why =
          "is host memory: pinned host memory reaches a GPU kernel only over PCIe (zero-copy), "
          "which is almost certainly a missing copy";
    } else if (l.a.kind == MemKind::kDevice && l.a.device != s->device) {
      why = "is memory of device " + std::to_string(l.a.device) +
            " but the kernel runs on device " + std::to_string(s->device);
    }
    if (!why.empty()) {
      fault(s->device, cudaErrorIllegalAddress,
            where + ": " + p.where + " " + why + " (" + describe_pointer(p.p) + ")");
      t_last_error = cudaErrorIllegalAddress;
      return;
    }
    run->pointer_ids.push_back(l.a.id);
  }
  run->pointers = std::move(pointers);
  enqueue(s, cfg.kernel, [run] {
    // Stream order: the memory must still be alive when the kernel runs (cudaFreeAsync).
    for (const PointerArg& p : run->pointers) {
      if (p.p == nullptr) continue;
      const Lookup l = find_allocation(p.p);
      if (!l.found || l.a.freed) {
        fault(run->device, cudaErrorIllegalAddress,
              std::string("kernel ") + run->config.kernel + " launched at " + run->config.file +
                  ":" + std::to_string(run->config.line) + ": " + p.where +
                  " was freed before the kernel ran (" + describe_pointer(p.p) + ")");
        return;
      }
    }
    t_kernel = run.get();
    run_kernel(*run);
    t_kernel = nullptr;
  });
}

}  // namespace cuemu::detail

// ---- the C API
// ------------------------------------------------------------------------------------------
using namespace cuemu::detail;

extern "C" {

const char* cudaGetErrorName(cudaError_t err) { return error_name(err); }

const char* cudaGetErrorString(cudaError_t err) {
  static thread_local std::string text;
  text = describe_error(err);
  return text.c_str();
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  if (e != cudaSuccess) return e;
  return sticky_error(t_device);
}

cudaError_t cudaPeekAtLastError() {
  if (t_last_error != cudaSuccess) return t_last_error;
  return sticky_error(t_device);
}

cudaError_t cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = config().device_count;
  if (*count == 0) {
    return call_error(cudaErrorNoDevice,
                      "no emulated device (CUEMU_DEVICE_COUNT=0 or "
                      "CUDA_VISIBLE_DEVICES lists none)");
  }
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= config().device_count) {
    return call_error(cudaErrorInvalidDevice,
                      "cudaSetDevice(" + std::to_string(device) + "): the emulator has " +
                          std::to_string(config().device_count) + " devices (CUEMU_DEVICE_COUNT)");
  }
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (config().device_count == 0) return call_error(cudaErrorNoDevice, "no emulated device");
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= config().device_count)
    return call_error(cudaErrorInvalidDevice,
                      "cudaGetDeviceProperties: no device " + std::to_string(device));
  const ModelProps m = model_props();
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "%s (cuemu: emulated on the CPU, not a GPU)",
                m.name);
  prop->totalGlobalMem = m.total;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 65536;
  prop->major = m.major;
  prop->minor = m.minor;
  prop->multiProcessorCount = m.sms;
  prop->l2CacheSize = m.l2;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->sharedMemPerMultiprocessor = m.smem_sm;
  prop->regsPerMultiprocessor = 65536;
  prop->sharedMemPerBlockOptin = m.smem_optin;
  prop->memoryBusWidth = m.bus;
  prop->pciBusID = device + 1;
  prop->unifiedAddressing = 1;
  prop->memoryPoolsSupported = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  if (const cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = p.maxThreadsPerBlock;
      break;
    case cudaDevAttrMaxBlockDimX:
      *value = p.maxThreadsDim[0];
      break;
    case cudaDevAttrMaxBlockDimY:
      *value = p.maxThreadsDim[1];
      break;
    case cudaDevAttrMaxBlockDimZ:
      *value = p.maxThreadsDim[2];
      break;
    case cudaDevAttrMaxGridDimX:
      *value = p.maxGridSize[0];
      break;
    case cudaDevAttrMaxGridDimY:
      *value = p.maxGridSize[1];
      break;
    case cudaDevAttrMaxGridDimZ:
      *value = p.maxGridSize[2];
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(p.sharedMemPerBlock);
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrMaxRegistersPerBlock:
      *value = p.regsPerBlock;
      break;
    case cudaDevAttrClockRate:
      *value = model_props().clock_khz;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = p.multiProcessorCount;
      break;
    case cudaDevAttrL2CacheSize:
      *value = p.l2CacheSize;
      break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
      *value = p.maxThreadsPerMultiProcessor;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = p.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = p.minor;
      break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = static_cast<int>(p.sharedMemPerMultiprocessor);
      break;
    case cudaDevAttrMaxRegistersPerMultiprocessor:
      *value = p.regsPerMultiprocessor;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      break;
    case cudaDevAttrMemoryPoolsSupported:
      *value = 1;
      break;
    default:
      return call_error(cudaErrorInvalidValue, "cudaDeviceGetAttribute: unknown attribute");
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  CUEMU_STICKY();
  count_host_wait("cudaDeviceSynchronize");
  sync_device(t_device);
  return sticky_error(t_device);
}

cudaError_t cudaDeviceReset() {
  sync_device(t_device);
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int, int) {
  *can = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int, unsigned) { return cudaSuccess; }

cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  CUEMU_STICKY();
  const std::size_t total = model_props().total;
  std::lock_guard<std::mutex> lock(g().mu);
  const auto used = static_cast<std::size_t>(std::max<std::int64_t>(0, dev_state(t_device).used));
  *total_bytes = total;
  *free_bytes = used > total ? 0 : total - used;
  return cudaSuccess;
}

namespace {
cudaError_t alloc_device(void** p, std::size_t bytes, MemKind kind, bool stream_ordered,
                         const char* api) {
  if (!p) return call_error(cudaErrorInvalidValue, std::string(api) + ": null result pointer");
  if (config().device_count == 0) return call_error(cudaErrorNoDevice, "no emulated device");
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g().mu);
    if (dev_state(t_device).used + static_cast<std::int64_t>(bytes) >
        static_cast<std::int64_t>(model_props().total)) {
      return call_error(cudaErrorMemoryAllocation,
                        std::string(api) + " of " + std::to_string(bytes) +
                            " bytes: more than the emulated device's memory");
    }
  }
  *p = map_device(bytes, kind, t_device, stream_ordered);
  if (!*p) {
    return call_error(cudaErrorMemoryAllocation,
                      std::string(api) + " of " + std::to_string(bytes) + " bytes: mmap failed");
  }
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  CUEMU_STICKY();
  return alloc_device(p, bytes, MemKind::kDevice, false, "cudaMalloc");
}

cudaError_t cudaMallocManaged(void** p, std::size_t bytes, unsigned) {
  CUEMU_STICKY();
  return alloc_device(p, bytes, MemKind::kManaged, false, "cudaMallocManaged");
}

cudaError_t cudaFree(void* p) {
  CUEMU_STICKY();
  if (!p) return cudaSuccess;
  const Lookup l = find_allocation(p);
  if (!l.found || l.a.base != reinterpret_cast<std::uintptr_t>(p) ||
      (l.a.kind != MemKind::kDevice && l.a.kind != MemKind::kManaged)) {
    return call_error(cudaErrorInvalidValue, "cudaFree(" + describe_pointer(p) +
                                                 "): not the start of a device allocation");
  }
  if (l.a.freed)
    return call_error(cudaErrorInvalidValue, "cudaFree: a double free of " + describe_pointer(p));
  // cudaFree synchronizes the device implicitly.
  sync_all_devices();
  release(l.a.base, "cudaFree");
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t stream) {
  CUEMU_STICKY();
  if (!resolve_stream(stream))
    return call_error(cudaErrorInvalidResourceHandle, "cudaMallocAsync: an invalid stream");
  return alloc_device(p, bytes, MemKind::kDevice, true, "cudaMallocAsync");
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  CUEMU_STICKY();
  if (!p) return cudaSuccess;
  Stream* s = resolve_stream(stream);
  if (!s) return call_error(cudaErrorInvalidResourceHandle, "cudaFreeAsync: an invalid stream");
  const Lookup l = find_allocation(p);
  if (!l.found || l.a.base != reinterpret_cast<std::uintptr_t>(p) || l.a.kind != MemKind::kDevice) {
    return call_error(cudaErrorInvalidValue, "cudaFreeAsync(" + describe_pointer(p) +
                                                 "): not the start of a device allocation");
  }
  if (l.a.freed)
    return call_error(cudaErrorInvalidValue,
                      "cudaFreeAsync: a double free of " + describe_pointer(p));
  const std::uintptr_t base = l.a.base;
  const std::string by = "cudaFreeAsync on " + s->name;
  enqueue(s, "cudaFreeAsync", [base, by] { release(base, by); });
  return cudaSuccess;
}

namespace {
cudaError_t alloc_host(void** p, std::size_t bytes, const char* api) {
  if (!p) return call_error(cudaErrorInvalidValue, std::string(api) + ": null result pointer");
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  const std::size_t map_bytes = round_up(bytes, kPage);
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return call_error(cudaErrorMemoryAllocation, std::string(api) + ": mmap failed");
  std::memset(m, 0xff, bytes);
  Allocation a;
  a.base = reinterpret_cast<std::uintptr_t>(m);
  a.bytes = bytes;
  a.kind = MemKind::kPinnedHost;
  a.device = t_device;
  a.map_base = m;
  a.map_bytes = map_bytes;
  std::lock_guard<std::mutex> lock(g().alloc_mu);
  a.id = g().next_id++;
  g().allocs[a.base] = a;
  *p = m;
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  CUEMU_STICKY();
  return alloc_host(p, bytes, "cudaMallocHost");
}
cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) {
  CUEMU_STICKY();
  return alloc_host(p, bytes, "cudaHostAlloc");
}

cudaError_t cudaFreeHost(void* p) {
  CUEMU_STICKY();
  if (!p) return cudaSuccess;
  const Lookup l = find_allocation(p);
  if (!l.found || l.a.base != reinterpret_cast<std::uintptr_t>(p) ||
      l.a.kind != MemKind::kPinnedHost || l.a.freed) {
    return call_error(cudaErrorInvalidValue, "cudaFreeHost(" + describe_pointer(p) +
                                                 "): not a live cudaHostAlloc pointer");
  }
  sync_all_devices();  // the pinned buffer may still be the end of a queued copy
  release(l.a.base, "cudaFreeHost");
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, std::size_t bytes, unsigned) {
  CUEMU_STICKY();
  if (!p || bytes == 0) return call_error(cudaErrorInvalidValue, "cudaHostRegister: empty range");
  if (find_allocation(p).found) {
    return call_error(cudaErrorInvalidValue,
                      "cudaHostRegister: " + describe_pointer(p) + " is already registered");
  }
  Allocation a;
  a.base = reinterpret_cast<std::uintptr_t>(p);
  a.bytes = bytes;
  a.kind = MemKind::kRegisteredHost;
  a.device = t_device;
  std::lock_guard<std::mutex> lock(g().alloc_mu);
  a.id = g().next_id++;
  g().allocs[a.base] = a;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
  CUEMU_STICKY();
  sync_all_devices();
  std::lock_guard<std::mutex> lock(g().alloc_mu);
  auto it = g().allocs.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == g().allocs.end() || it->second.kind != MemKind::kRegisteredHost) {
    return call_error(cudaErrorInvalidValue, "cudaHostUnregister: not a registered range");
  }
  g().allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  CUEMU_STICKY();
  *attr = cudaPointerAttributes{};
  attr->device = -2;
  const Lookup l = find_allocation(p);
  if (!l.found || l.a.freed) {
    attr->type = cudaMemoryTypeUnregistered;
    return cudaSuccess;
  }
  attr->device = l.a.device;
  switch (l.a.kind) {
    case MemKind::kDevice:
      attr->type = cudaMemoryTypeDevice;
      attr->devicePointer = const_cast<void*>(p);
      break;
    case MemKind::kManaged:
      attr->type = cudaMemoryTypeManaged;
      attr->devicePointer = attr->hostPointer = const_cast<void*>(p);
      break;
    case MemKind::kPinnedHost:
    case MemKind::kRegisteredHost:
      attr->type = cudaMemoryTypeHost;
      attr->devicePointer = attr->hostPointer = const_cast<void*>(p);
      break;
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (device < 0 || device >= config().device_count)
    return call_error(cudaErrorInvalidDevice, "no such device");
  *pool = reinterpret_cast<cudaMemPool_t>(static_cast<std::uintptr_t>(device + 1));
  return cudaSuccess;
}
cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* pool, int device) {
  return cudaDeviceGetDefaultMemPool(pool, device);
}

namespace {
int pool_device(cudaMemPool_t pool) {
  return static_cast<int>(reinterpret_cast<std::uintptr_t>(pool)) - 1;
}
}  // namespace

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  const int d = pool_device(pool);
  if (d < 0 || d >= config().device_count) return call_error(cudaErrorInvalidValue, "bad pool");
  std::lock_guard<std::mutex> lock(g().mu);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold:
      dev_state(d).release_threshold = *static_cast<std::uint64_t*>(value);
      return cudaSuccess;
    case cudaMemPoolAttrUsedMemHigh:
    case cudaMemPoolAttrReservedMemHigh:
      dev_state(d).pool_used_high = dev_state(d).pool_used;  // reset to the current value
      return cudaSuccess;
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
      return cudaSuccess;
    default:
      return call_error(cudaErrorInvalidValue, "cudaMemPoolSetAttribute: read-only attribute");
  }
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  const int d = pool_device(pool);
  if (d < 0 || d >= config().device_count) return call_error(cudaErrorInvalidValue, "bad pool");
  std::lock_guard<std::mutex> lock(g().mu);
  const DeviceState& s = dev_state(d);
  auto* out = static_cast<std::uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold:
      *out = s.release_threshold;
      break;
    case cudaMemPoolAttrReservedMemCurrent:
    case cudaMemPoolAttrUsedMemCurrent:
      *out = static_cast<std::uint64_t>(s.pool_used);
      break;
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh:
      *out = static_cast<std::uint64_t>(s.pool_used_high);
      break;
    default:
      *static_cast<int*>(value) = 1;
      break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, std::size_t) { return cudaSuccess; }

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  return copy(dst, src, bytes, kind, nullptr, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy(dst, src, bytes, kind, stream, false, "cudaMemcpyAsync");
}

cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  // On the legacy default stream, asynchronous for device memory.
  return memset_impl(p, value, bytes, nullptr, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream) {
  return memset_impl(p, value, bytes, stream, "cudaMemsetAsync");
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  CUEMU_STICKY();
  if (config().device_count == 0) return call_error(cudaErrorNoDevice, "no emulated device");
  std::lock_guard<std::mutex> lock(g().mu);
  const bool blocking = (flags & cudaStreamNonBlocking) == 0;
  Stream* s = new_stream_locked(t_device, false, blocking,
                                std::string(blocking ? "a blocking" : "a non-blocking") +
                                    " stream of device " + std::to_string(t_device));
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int) {
  return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Stream* s = resolve_stream(stream);
  if (!s || s->legacy)
    return call_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a created stream");
  // The stream's work completes first (the resources are released once it is done).
  wait_for(s, enqueued_of(s));
  std::lock_guard<std::mutex> lock(g().mu);
  g().live_streams.erase(s);
  s->stop = true;
  s->work.notify_one();
  auto& v = dev_state(s->device).streams;
  v.erase(std::remove(v.begin(), v.end(), s), v.end());
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUEMU_STICKY();
  Stream* s = resolve_stream(stream);
  if (!s)
    return call_error(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: an invalid stream");
  count_host_wait("cudaStreamSynchronize");
  wait_for(s, enqueued_of(s));
  return sticky_error(s->device);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUEMU_STICKY();
  Stream* s = resolve_stream(stream);
  if (!s) return call_error(cudaErrorInvalidResourceHandle, "cudaStreamQuery: an invalid stream");
  std::lock_guard<std::mutex> lock(g().mu);
  return s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  CUEMU_STICKY();
  Stream* s = resolve_stream(stream);
  if (!s)
    return call_error(cudaErrorInvalidResourceHandle, "cudaLaunchHostFunc: an invalid stream");
  enqueue(s, "cudaLaunchHostFunc", [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  CUEMU_STICKY();
  auto* e = new EventState;
  e->device = t_device;
  e->flags = flags;
  std::lock_guard<std::mutex> lock(g().mu);
  g().live_events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

namespace {
EventState* live_event(cudaEvent_t event) {
  auto* e = reinterpret_cast<EventState*>(event);
  std::lock_guard<std::mutex> lock(g().mu);
  return g().live_events.count(e) ? e : nullptr;
}
}  // namespace

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  EventState* e = live_event(event);
  if (!e) return call_error(cudaErrorInvalidResourceHandle, "cudaEventDestroy: not a live event");
  std::lock_guard<std::mutex> lock(g().mu);
  g().live_events.erase(e);
  // Freed later: a queued record still holds its time cell (shared_ptr), not the event.
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  CUEMU_STICKY();
  EventState* e = live_event(event);
  if (!e) return call_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: not a live event");
  Stream* s = resolve_stream(stream);
  if (!s) return call_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: an invalid stream");
  auto cell = std::make_shared<std::atomic<double>>(0.0);
  const std::uint64_t seq = enqueue(s, "cudaEventRecord", [cell] {
    *cell = std::chrono::duration<double, std::milli>(
                std::chrono::steady_clock::now().time_since_epoch())
                .count();
  });
  std::lock_guard<std::mutex> lock(g().mu);
  e->recorded = true;
  e->stream = s;
  e->seq = seq;
  e->time = cell;
  e->completion_seen = false;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  CUEMU_STICKY();
  EventState* e = live_event(event);
  if (!e) return call_error(cudaErrorInvalidResourceHandle, "cudaEventQuery: not a live event");
  std::lock_guard<std::mutex> lock(g().mu);
  if (!e->recorded) return cudaSuccess;  // an event never recorded is complete
  if (e->stream->completed < e->seq) return cudaErrorNotReady;
  // The host learnt that the recorded work is done: one wait on the device per record (counted
  // whether or not an earlier poll found it pending, so that the count does not depend on timing).
  if (!e->completion_seen) {
    e->completion_seen = true;
    count_host_wait("cudaEventQuery");
  }
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  CUEMU_STICKY();
  EventState* e = live_event(event);
  if (!e)
    return call_error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: not a live event");
  Stream* s = nullptr;
  std::uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(g().mu);
    if (!e->recorded) return cudaSuccess;
    s = e->stream;
    seq = e->seq;
  }
  count_host_wait("cudaEventSynchronize");
  wait_for(s, seq);
  return sticky_error(s->device);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  CUEMU_STICKY();
  Stream* s = resolve_stream(stream);
  if (!s)
    return call_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: an invalid stream");
  EventState* e = live_event(event);
  if (!e)
    return call_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: not a live event");
  Stream* es = nullptr;
  std::uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(g().mu);
    if (!e->recorded) return cudaSuccess;  // waits on the most recent record only
    es = e->stream;
    seq = e->seq;
  }
  enqueue(s, "cudaStreamWaitEvent", [] {}, {{es, seq}});
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  CUEMU_STICKY();
  EventState* a = live_event(start);
  EventState* b = live_event(end);
  if (!a || !b)
    return call_error(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: not a live event");
  std::lock_guard<std::mutex> lock(g().mu);
  if ((a->flags | b->flags) & cudaEventDisableTiming) {
    return call_error(cudaErrorInvalidResourceHandle,
                      "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  }
  if (!a->recorded || !b->recorded) {
    return call_error(cudaErrorInvalidResourceHandle,
                      "cudaEventElapsedTime: an event was not recorded");
  }
  if (a->stream->completed < a->seq || b->stream->completed < b->seq) return cudaErrorNotReady;
  *ms = static_cast<float>(b->time->load() - a->time->load());
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<std::size_t>(value) > model_props().smem_optin) {
      return call_error(cudaErrorInvalidValue,
                        "cudaFuncSetAttribute: " + std::to_string(value) +
                            " bytes of dynamic shared memory, more than the device's opt-in "
                            "maximum " +
                            std::to_string(model_props().smem_optin));
    }
    std::lock_guard<std::mutex> lock(g().alloc_mu);
    g().max_dynamic_smem = std::max(g().max_dynamic_smem, value);
  }
  return cudaSuccess;
}

}  // extern "C"

// ---- the emulator's own API (cuemu/cuemu.h)
// ----------------------------------------------------------
namespace cuemu {

bool emulated() { return true; }

void reset_errors() {
  sync_all_devices();
  std::lock_guard<std::mutex> lock(g().mu);
  for (auto& d : g().devices) {
    d.sticky = cudaSuccess;
    d.sticky_message.clear();
  }
  t_last_error = cudaSuccess;
  t_details.clear();
}

std::uint64_t fault_count() { return g_faults.load(); }

std::string last_fault(int device) {
  std::lock_guard<std::mutex> lock(g().mu);
  return dev_state(device).sticky_message;
}

std::int64_t device_bytes_in_use(int device) {
  std::lock_guard<std::mutex> lock(g().mu);
  return dev_state(device).used;
}

std::int64_t device_bytes_peak(int device) {
  std::lock_guard<std::mutex> lock(g().mu);
  return dev_state(device).peak;
}

}  // namespace cuemu
