// The kernel tests' backend (TRIDENT_TEST_BACKEND) and the device mirrors of their buffers (see
// kernel_test_util.h, "Test buffers that follow the backend").
//
// A mirror's lifetime is its host memory's: this file replaces the global operator new and
// delete (plain malloc / free underneath), and a delete of the first byte of a mirrored vector's
// memory drops the mirror. Without that, a vector allocated at the address of a dead one would
// inherit the dead one's device contents (and snapshot), and a test could compare stale data.
// Under ASan or TSan the sanitizer owns operator new and delete (TSan's runtime defines them in
// the same archive member as symbols it needs, so a replacement does not link): there the
// sanitizer's free hook tells the mirrors instead.
#include "kernel_test_util.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_set>

#include "trident/core/error.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TRIDENT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TRIDENT_TEST_SANITIZED 1
#endif
#endif
#ifdef TRIDENT_TEST_SANITIZED
#include <sanitizer/allocator_interface.h>
#endif
#ifdef TRIDENT_TEST_CUDA
#include "trident/kernels/cuda/device.h"
#endif

namespace trident::kernels::testing {

namespace {

// Whether mirrors exist in this process (the cuda backend): operator delete looks only then.
std::atomic<bool> g_mirrors_on{false};

// The host begins of live mirrors, and those whose memory was freed since the registry last
// looked. Guarded by g_begins_mu, which is never held across a CUDA call, so that operator delete
// on any thread (the emulator's stream workers included) never waits for a kernel.
std::mutex g_begins_mu;
std::unordered_set<const void*>* g_begins = nullptr;
std::vector<const void*>* g_freed = nullptr;
// Set while this thread is inside the registry: its own frees are not looked at (no recursion).
thread_local bool t_inside = false;

struct InsideGuard {
  bool was = t_inside;
  InsideGuard() { t_inside = true; }
  ~InsideGuard() { t_inside = was; }
};

}  // namespace

namespace detail {

// Called by operator delete before memory goes back to malloc.
void note_free(void* p) noexcept {
  if (p == nullptr || t_inside || !g_mirrors_on.load(std::memory_order_acquire)) return;
  InsideGuard inside;
  std::lock_guard<std::mutex> lock(g_begins_mu);
  if (g_begins != nullptr && g_begins->erase(p) != 0) g_freed->push_back(p);
}

}  // namespace detail

#ifdef TRIDENT_TEST_CUDA
namespace {

struct Mirror {
  std::size_t bytes = 0;
  void* device = nullptr;
  std::vector<std::byte> snapshot;  // what host and device both held at the last hand-over
};

class Registry {
 public:
  explicit Registry(void* stream) : stream_(stream) {
    InsideGuard inside;
    std::lock_guard<std::mutex> lock(g_begins_mu);
    g_begins = new std::unordered_set<const void*>();
    g_freed = new std::vector<const void*>();
  }

  void* mirror(const void* host, std::size_t bytes) {
    InsideGuard inside;
    drain();
    if (bytes == 0) return nullptr;
    const auto* begin = static_cast<const std::byte*>(host);
    auto it = mirrors_.find(begin);
    if (it != mirrors_.end() && it->second.bytes != bytes) {
      // The same vector resized in place: settle the old extent, then start over.
      reconcile(begin, it->second);
      drop(it);
      it = mirrors_.end();
    }
    if (it == mirrors_.end()) {
      const auto o = overlapping(begin, bytes);
      if (o != mirrors_.end() && o->first < begin + bytes) {
        // Live vectors do not overlap: a mirror here outlived its memory.
        throw std::logic_error(
            core::str("test buffers: a mirror of host memory ", static_cast<const void*>(o->first),
                      " (", o->second.bytes, " bytes) overlaps the vector at ", host,
                      "; its memory was freed without operator delete (kernel_test_util.cc)"));
      }
      Mirror m;
      m.bytes = bytes;
      m.device = cuda::device_alloc(static_cast<std::int64_t>(bytes));
      m.snapshot.assign(begin, begin + bytes);
      cuda::copy_to_device(m.device, host, static_cast<std::int64_t>(bytes), stream_);
      it = mirrors_.emplace(begin, std::move(m)).first;
      std::lock_guard<std::mutex> lock(g_begins_mu);
      g_begins->insert(host);
      return it->second.device;
    }
    reconcile(begin, it->second);
    return it->second.device;
  }

  void sync(const void* host, std::size_t bytes) {
    InsideGuard inside;
    drain();
    if (bytes == 0) return;
    const auto* begin = static_cast<const std::byte*>(host);
    for (auto it = overlapping(begin, bytes); it != mirrors_.end() && it->first < begin + bytes;
         ++it) {
      reconcile(it->first, it->second);
    }
  }

  // Frees every mirror (the end of the run).
  void clear() {
    InsideGuard inside;
    drain();
    cuda::synchronize(stream_);
    while (!mirrors_.empty()) drop(mirrors_.begin());
  }

 private:
  // The first mirror that may overlap [begin, begin + bytes) (callers stop at begin + bytes).
  std::map<const std::byte*, Mirror>::iterator overlapping(const std::byte* begin,
                                                           std::size_t bytes) {
    (void)bytes;
    auto it = mirrors_.upper_bound(begin);
    if (it != mirrors_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.bytes > begin) return prev;
    }
    return it;
  }

  void drop(std::map<const std::byte*, Mirror>::iterator it) {
    if (audit_) {
      // TRIDENT_TEST_BUFFERS_AUDIT=1: name the buffers whose kernel results were never fetched
      // (candidates for a host read that forgot testing::fetch; most are unchecked outputs).
      Mirror& m = it->second;
      device_copy_.resize(m.bytes);
      cuda::copy_to_host(device_copy_.data(), m.device, static_cast<std::int64_t>(m.bytes),
                         stream_);
      cuda::synchronize(stream_);
      if (std::memcmp(device_copy_.data(), m.snapshot.data(), m.bytes) != 0) {
        const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
        std::fprintf(
            stderr, "test buffers audit: %s.%s: %zu bytes written by a kernel, never fetched\n",
            t != nullptr ? t->test_suite_name() : "-", t != nullptr ? t->name() : "-", m.bytes);
      }
    }
    cuda::device_free(it->second.device);  // cudaFree waits for the work that may use it
    {
      std::lock_guard<std::mutex> lock(g_begins_mu);
      g_begins->erase(it->first);
    }
    mirrors_.erase(it);
  }

  // Drops the mirrors whose host memory was freed since the last look.
  void drain() {
    std::vector<const void*> freed;
    {
      std::lock_guard<std::mutex> lock(g_begins_mu);
      freed.swap(*g_freed);
    }
    for (const void* p : freed) {
      const auto it = mirrors_.find(static_cast<const std::byte*>(p));
      if (it != mirrors_.end()) drop(it);
    }
  }

  void reconcile(const std::byte* host, Mirror& m) {
    device_copy_.resize(m.bytes);
    cuda::copy_to_host(device_copy_.data(), m.device, static_cast<std::int64_t>(m.bytes), stream_);
    cuda::synchronize(stream_);
    const bool host_changed = std::memcmp(host, m.snapshot.data(), m.bytes) != 0;
    const bool device_changed = std::memcmp(device_copy_.data(), m.snapshot.data(), m.bytes) != 0;
    if (!host_changed && !device_changed) return;
    if (host_changed && device_changed && std::memcmp(host, device_copy_.data(), m.bytes) != 0) {
      std::size_t first = 0;
      while (host[first] == m.snapshot[first]) ++first;
      throw std::logic_error(
          core::str("test buffers: the vector at ", static_cast<const void*>(host), " (", m.bytes,
                    " bytes) was written on the host (first at byte ", first,
                    ") after a kernel wrote its device copy, which the test never fetched: call "
                    "testing::fetch(vec) before editing a kernel's output on the host"));
    }
    if (host_changed) {
      cuda::copy_to_device(m.device, host, static_cast<std::int64_t>(m.bytes), stream_);
      std::memcpy(m.snapshot.data(), host, m.bytes);
    } else {
      // Only the device changed: the host gets the kernel's results.
      std::memcpy(const_cast<std::byte*>(host), device_copy_.data(), m.bytes);
      std::memcpy(m.snapshot.data(), device_copy_.data(), m.bytes);
    }
  }

  void* stream_;
  const bool audit_ = std::getenv("TRIDENT_TEST_BUFFERS_AUDIT") != nullptr;
  std::map<const std::byte*, Mirror> mirrors_;
  std::vector<std::byte> device_copy_;
};

Registry* g_registry = nullptr;

}  // namespace
#endif  // TRIDENT_TEST_CUDA

namespace detail {

bool mirrors_enabled() { return g_mirrors_on.load(std::memory_order_relaxed); }

void* device_mirror(const void* host, std::size_t bytes) {
#ifdef TRIDENT_TEST_CUDA
  if (g_registry != nullptr) return g_registry->mirror(host, bytes);
#endif
  return const_cast<void*>(host);
}

void sync_to_host(const void* host, std::size_t bytes) {
#ifdef TRIDENT_TEST_CUDA
  if (g_registry != nullptr) g_registry->sync(host, bytes);
#else
  (void)host;
  (void)bytes;
#endif
}

void release_test_buffers() {
#ifdef TRIDENT_TEST_CUDA
  if (g_registry != nullptr) g_registry->clear();
#endif
}

}  // namespace detail

const TestBackend& test_backend() {
  static const TestBackend backend = [] {
    const char* env = std::getenv("TRIDENT_TEST_BACKEND");
    const std::string name = env != nullptr ? env : "cpu";
    TestBackend b;
    if (name == "cpu") return b;
    if (name == "cpu-x86_64") {
      b.name = "cpu-x86_64";
      b.ctx.cpu_isa = core::CpuIsa::kX86_64;
    } else if (name == "cpu-avx2") {
      b.name = "cpu-avx2";
      b.ctx.cpu_isa = core::CpuIsa::kAvx2;
    } else if (name == "cpu-avx512") {
      b.name = "cpu-avx512";
      b.ctx.cpu_isa = core::CpuIsa::kAvx512;
#ifdef TRIDENT_TEST_CUDA
    } else if (name == "cuda") {
      b.name = "cuda";
      b.ctx.device = {core::DeviceKind::kCuda, 0};
      if (cuda::device_count() == 0) {
        b.unavailable = cuda::no_device_reason();
        return b;
      }
      cuda::set_device(0);
      // A non-blocking stream of the backend's own: work wrongly queued on the legacy default
      // stream is not ordered with it, so stream-ordering bugs can show.
      b.ctx.stream = cuda::create_stream();
      g_registry = new Registry(b.ctx.stream);
      g_mirrors_on.store(true, std::memory_order_release);
#endif
    } else {
      ADD_FAILURE() << "TRIDENT_TEST_BACKEND=" << name << " is not a backend of this build (cpu, "
                    << "cpu-x86_64, cpu-avx2, cpu-avx512"
#ifdef TRIDENT_TEST_CUDA
                    << ", cuda"
#endif
                    << ")";
    }
    return b;
  }();
  return backend;
}

}  // namespace trident::kernels::testing

// ---- operator new / delete: malloc and free, with the mirrors told about frees ----------------

#ifdef TRIDENT_TEST_SANITIZED

namespace {

void free_hook(const volatile void* p) {
  trident::kernels::testing::detail::note_free(const_cast<void*>(p));
}

// Installed before main (the backend and its mirrors come later, from the tests).
[[maybe_unused]] const int g_free_hook_installed =
    __sanitizer_install_malloc_and_free_hooks(nullptr, free_hook);

}  // namespace

#else

namespace {

void* allocate(std::size_t n) {
  if (n == 0) n = 1;
  void* p = std::malloc(n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* allocate_aligned(std::size_t n, std::align_val_t al) {
  const std::size_t a = static_cast<std::size_t>(al);
  const std::size_t size = (n + a - 1) / a * a;
  void* p = std::aligned_alloc(a, size == 0 ? a : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void release(void* p) noexcept {
  trident::kernels::testing::detail::note_free(p);
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t al) { return allocate_aligned(n, al); }
void* operator new[](std::size_t n, std::align_val_t al) { return allocate_aligned(n, al); }
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  try {
    return allocate_aligned(n, al);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  try {
    return allocate_aligned(n, al);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }

#endif  // TRIDENT_TEST_SANITIZED
