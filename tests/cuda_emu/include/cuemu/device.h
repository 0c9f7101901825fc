// cuemu's device side: what a .cu file's kernels see (built-in variables, qualifiers, math and
// bit intrinsics, atomics, barriers, warp operations, __shared__ memory) and the launch that
// cuemu_rewrite substitutes for kernel<<<grid, block, smem, stream>>>(args).
//
// Execution model (exec.cc): a kernel's blocks run one at a time on its stream's worker thread.
// The threads of a block are fibers switched only at __syncthreads and warp operations (default),
// or OS threads (CUEMU_THREADS=1, for ThreadSanitizer). Either way a barrier or warp operation
// that a GPU would not complete (divergence, exited lanes, deadlock) fails the launch naming the
// kernel, block, thread and the source line.
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuemu/types.h"

// ---- qualifiers
// ----------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __constant__
#define __managed__
// cuemu_rewrite replaces every __shared__ declaration; one that reaches the compiler was missed.
#define __shared__ cuemu_error_a_shared_declaration_was_not_rewritten_by_cuemu_rewrite

#define CUEMU_TLS thread_local __attribute__((tls_model("initial-exec")))

// ---- built-in variables
// ---------------------------------------------------------------------------- Thread-local, set by
// the block scheduler before it switches to a CUDA thread (fiber or OS thread).
inline CUEMU_TLS uint3 threadIdx{};
inline CUEMU_TLS uint3 blockIdx{};
inline CUEMU_TLS dim3 blockDim{};
inline CUEMU_TLS dim3 gridDim{};
inline constexpr int warpSize = 32;

// ---- vector types
// ----------------------------------------------------------------------------------
#define CUEMU_VEC2(T, name, al) \
  struct alignas(al) name {     \
    T x, y;                     \
  };                            \
  inline name make_##name(T x, T y) { return {x, y}; }
#define CUEMU_VEC4(T, name, al) \
  struct alignas(al) name {     \
    T x, y, z, w;               \
  };                            \
  inline name make_##name(T x, T y, T z, T w) { return {x, y, z, w}; }
CUEMU_VEC2(float, float2, 8)
CUEMU_VEC4(float, float4, 16)
CUEMU_VEC2(int, int2, 8)
CUEMU_VEC4(int, int4, 16)
CUEMU_VEC2(unsigned int, uint2, 8)
CUEMU_VEC4(unsigned int, uint4, 16)
CUEMU_VEC2(double, double2, 16)
CUEMU_VEC2(long long, longlong2, 16)
#undef CUEMU_VEC2
#undef CUEMU_VEC4
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }

// ---- math
// -------------------------------------------------------------------------------------------- The
// device's math functions are glibc's here: device expf/logf/rsqrtf differ from these by the ulps
// the CUDA Programming Guide lists (docs/gpu.md: what the emulator cannot show).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) {
  return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1;
}
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// CUDA's min/max overloads: the usual arithmetic conversions; floating point as fminf/fmaxf.
template <class A, class B>
requires(std::is_arithmetic_v<A>&& std::is_arithmetic_v<B>) inline auto min(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<C>) {
    return static_cast<C>(std::fmin(static_cast<C>(a), static_cast<C>(b)));
  } else {
    return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
  }
}
template <class A, class B>
requires(std::is_arithmetic_v<A>&& std::is_arithmetic_v<B>) inline auto max(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<C>) {
    return static_cast<C>(std::fmax(static_cast<C>(a), static_cast<C>(b)));
  } else {
    return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
  }
}

// ---- atomics
// -------------------------------------------------------------------------------------- Real
// atomics: blocks of different streams run on different OS threads, and thread mode runs a block's
// threads on OS threads.
template <class T>
inline T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
template <class T>
inline T atomicSub(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_sub(v);
}
template <class T>
inline T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v);
}
template <class T>
inline T atomicCAS(T* p, T expected, T desired) {
  std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired);
  return expected;  // the old value either way
}
template <class T>
inline T atomicOr(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_or(v);
}
template <class T>
inline T atomicAnd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_and(v);
}
template <class T>
inline T atomicXor(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_xor(v);
}
template <class T>
inline T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
long long clock64();

// ---- barriers and warp operations (exec.cc)
// --------------------------------------------------------
namespace cuemu::detail {

// Where a barrier or warp operation is called (std::source_location's role; clang 14 with
// libstdc++ 12 lacks it, the builtins work in both compilers).
struct Loc {
  const char* file = "";
  unsigned ln = 0, col = 0;
#if defined(__has_builtin) && __has_builtin(__builtin_COLUMN)
  static constexpr Loc current(const char* f = __builtin_FILE(), unsigned l = __builtin_LINE(),
                               unsigned c = __builtin_COLUMN()) {
    return {f, l, c};
  }
#else  // GCC 12
  static constexpr Loc current(const char* f = __builtin_FILE(), unsigned l = __builtin_LINE()) {
    return {f, l, 0};
  }
#endif
  const char* file_name() const { return file; }
  unsigned line() const { return ln; }
  unsigned column() const { return col; }
};

enum class BarrierKind : int { kPlain, kCount, kAnd, kOr };
int syncthreads(BarrierKind kind, int predicate, Loc loc);

enum class WarpKind : int {
  kShflIdx,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
  kSyncWarp
};
// One warp operation of the calling lane: the value's bits (at most 8 bytes) and the operation's
// argument (source lane, delta or lane mask); returns the lane's result bits.
std::uint64_t warp_op(WarpKind kind, unsigned mask, std::uint64_t bits, int arg, int width,
                      Loc loc);
unsigned active_mask();

template <class T>
std::uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "cuemu: warp shuffles take values of at most 8 bytes, as CUDA's do");
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(std::uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace cuemu::detail

inline void __syncthreads(cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  cuemu::detail::syncthreads(cuemu::detail::BarrierKind::kPlain, 0, loc);
}
inline int __syncthreads_count(int pred, cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  return cuemu::detail::syncthreads(cuemu::detail::BarrierKind::kCount, pred, loc);
}
inline int __syncthreads_and(int pred, cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  return cuemu::detail::syncthreads(cuemu::detail::BarrierKind::kAnd, pred, loc);
}
inline int __syncthreads_or(int pred, cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  return cuemu::detail::syncthreads(cuemu::detail::BarrierKind::kOr, pred, loc);
}
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  cuemu::detail::warp_op(cuemu::detail::WarpKind::kSyncWarp, mask, 0, 0, 32, loc);
}
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
                     cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  using namespace cuemu::detail;
  return from_bits<T>(warp_op(WarpKind::kShflIdx, mask, to_bits(var), src_lane, width, loc));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                        cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  using namespace cuemu::detail;
  return from_bits<T>(
      warp_op(WarpKind::kShflUp, mask, to_bits(var), static_cast<int>(delta), width, loc));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                          cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  using namespace cuemu::detail;
  return from_bits<T>(
      warp_op(WarpKind::kShflDown, mask, to_bits(var), static_cast<int>(delta), width, loc));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                         cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  using namespace cuemu::detail;
  return from_bits<T>(warp_op(WarpKind::kShflXor, mask, to_bits(var), lane_mask, width, loc));
}
inline unsigned __ballot_sync(unsigned mask, int pred,
                              cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  using namespace cuemu::detail;
  return static_cast<unsigned>(warp_op(WarpKind::kBallot, mask, pred != 0, 0, 32, loc));
}
inline int __any_sync(unsigned mask, int pred,
                      cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  using namespace cuemu::detail;
  return static_cast<int>(warp_op(WarpKind::kAny, mask, pred != 0, 0, 32, loc));
}
inline int __all_sync(unsigned mask, int pred,
                      cuemu::detail::Loc loc = cuemu::detail::Loc::current()) {
  using namespace cuemu::detail;
  return static_cast<int>(warp_op(WarpKind::kAll, mask, pred != 0, 0, 32, loc));
}
inline unsigned __activemask() { return cuemu::detail::active_mask(); }

// ---- __shared__ memory
// --------------------------------------------------------------------------- cuemu_rewrite turns
// `__shared__ T name[N];` into
//   static ::cuemu::SharedSlot cuemu_shared_L; auto& name = cuemu_shared_L.get<T[N]>();
// and `extern __shared__ T name[];` into `T* const name = ::cuemu::dynamic_shared<T>();`.
// A slot is placed in its block's shared memory on first use and poisoned (0xff bytes: NaN for
// floats) when the block starts, as a GPU's shared memory holds garbage.
namespace cuemu {
namespace detail {
void* shared_static(const void* slot, std::size_t bytes, std::size_t align, const char* type);
void* shared_dynamic(std::size_t align);
}  // namespace detail

struct SharedSlot {
  template <class T, std::size_t A = alignof(T)>
  T& get() {
    static_assert(A >= alignof(T) && (A & (A - 1)) == 0, "cuemu: a bad __shared__ alignment");
    return *static_cast<T*>(detail::shared_static(this, sizeof(T), A, typeid_name<T>()));
  }

 private:
  template <class T>
  static const char* typeid_name() {
    return __PRETTY_FUNCTION__;
  }
};

template <class T>
T* dynamic_shared() {
  return static_cast<T*>(detail::shared_dynamic(alignof(T)));
}

// ---- launches
// -------------------------------------------------------------------------------------
namespace detail {

// A pointer a kernel receives: an argument, or a pointer field of an aggregate argument (up to two
// levels deep). Checked at launch (device memory of the launch's device, not host memory) and
// again when the kernel runs (the allocation still alive in stream order).
struct PointerArg {
  const void* p;
  std::string where;  // "argument 2" or "argument 4 (Flash) field 1"
};

namespace reflect {
struct any {
  template <class T>
  operator T() const;
};
template <class T, class... A>
concept brace_initializable = requires {
  T{std::declval<A>()...};
};
template <class T, std::size_t... I>
constexpr bool init_with(std::index_sequence<I...>) {
  return brace_initializable<T, decltype(((void)I, any{}))...>;
}
// Fields of an aggregate, up to 12 (13 means "more": not inspected).
template <class T, std::size_t N = 0>
constexpr std::size_t field_count() {
  if constexpr (N > 12) {
    return 13;
  } else if constexpr (init_with<T>(std::make_index_sequence<N + 1>{})) {
    return field_count<T, N + 1>();
  } else {
    return N;
  }
}
}  // namespace reflect

template <class T>
void collect_pointers(const T& v, const std::string& where, int depth,
                      std::vector<PointerArg>& out);

template <class F>
void visit_fields(const auto& v, F&& f) {
  using T = std::remove_cvref_t<decltype(v)>;
  constexpr std::size_t n = reflect::field_count<T>();
  if constexpr (n == 1) {
    const auto& [a] = v;
    f(a);
  } else if constexpr (n == 2) {
    const auto& [a, b] = v;
    f(a), f(b);
  } else if constexpr (n == 3) {
    const auto& [a, b, c] = v;
    f(a), f(b), f(c);
  } else if constexpr (n == 4) {
    const auto& [a, b, c, d] = v;
    f(a), f(b), f(c), f(d);
  } else if constexpr (n == 5) {
    const auto& [a, b, c, d, e] = v;
    f(a), f(b), f(c), f(d), f(e);
  } else if constexpr (n == 6) {
    const auto& [a, b, c, d, e, g] = v;
    f(a), f(b), f(c), f(d), f(e), f(g);
  } else if constexpr (n == 7) {
    const auto& [a, b, c, d, e, g, h] = v;
    f(a), f(b), f(c), f(d), f(e), f(g), f(h);
  } else if constexpr (n == 8) {
    const auto& [a, b, c, d, e, g, h, i] = v;
    f(a), f(b), f(c), f(d), f(e), f(g), f(h), f(i);
  } else if constexpr (n == 9) {
    const auto& [a, b, c, d, e, g, h, i, j] = v;
    f(a), f(b), f(c), f(d), f(e), f(g), f(h), f(i), f(j);
  } else if constexpr (n == 10) {
    const auto& [a, b, c, d, e, g, h, i, j, k] = v;
    f(a), f(b), f(c), f(d), f(e), f(g), f(h), f(i), f(j), f(k);
  } else if constexpr (n == 11) {
    const auto& [a, b, c, d, e, g, h, i, j, k, l] = v;
    f(a), f(b), f(c), f(d), f(e), f(g), f(h), f(i), f(j), f(k), f(l);
  } else if constexpr (n == 12) {
    const auto& [a, b, c, d, e, g, h, i, j, k, l, m] = v;
    f(a), f(b), f(c), f(d), f(e), f(g), f(h), f(i), f(j), f(k), f(l), f(m);
  }
}

template <class T>
void collect_pointers(const T& v, const std::string& where, int depth,
                      std::vector<PointerArg>& out) {
  if constexpr (std::is_pointer_v<T>) {
    if constexpr (!std::is_function_v<std::remove_pointer_t<T>>) {
      out.push_back({static_cast<const void*>(v), where});
    }
  } else if constexpr (std::is_array_v<T>) {
    for (std::size_t i = 0; i < std::extent_v<T>; ++i) {
      collect_pointers(v[i], where + "[" + std::to_string(i) + "]", depth, out);
    }
  } else if constexpr (std::is_class_v<T> && std::is_aggregate_v<T> && !std::is_union_v<T>) {
    // Closure types are not aggregates: a lambda's captures cannot be inspected (docs/gpu.md).
    if (depth >= 2) return;
    if constexpr (reflect::field_count<T>() <= 12) {
      int field = 0;
      visit_fields(v, [&](const auto& member) {
        collect_pointers(member, where + " field " + std::to_string(field++), depth + 1, out);
      });
    }
  }
}

struct LaunchConfig {
  const char* kernel;
  const char* file;
  int line;
  dim3 grid, block;
  std::size_t dynamic_smem;
  cudaStream_t stream;
};

// Checks the configuration and the pointers, then queues the kernel on its stream (runtime.cc).
// On a bad launch it records the error that cudaGetLastError() returns and queues nothing.
void launch(const LaunchConfig& config, std::vector<PointerArg> pointers,
            std::function<void()> thread_body);

}  // namespace detail

// The rewritten launch: Launch{"k", __FILE__, __LINE__, grid, block[, smem[, stream]]}(
//     [](auto... a) { k(a...); }, args...)
// The arguments are copied at the launch, as CUDA copies kernel parameters; every CUDA thread
// then calls the kernel with its own copy.
class Launch {
 public:
  Launch(const char* kernel, const char* file, int line, dim3 grid, dim3 block,
         std::size_t dynamic_smem = 0, cudaStream_t stream = nullptr)
      : config_{kernel, file, line, grid, block, dynamic_smem, stream} {}

  template <class F, class... A>
  void operator()(F kernel, A&&... args) const {
    auto params = std::make_tuple(std::decay_t<A>(std::forward<A>(args))...);
    std::vector<detail::PointerArg> pointers;
    std::apply(
        [&](const auto&... p) {
          int i = 0;
          ((detail::collect_pointers(p, "argument " + std::to_string(++i), 0, pointers)), ...);
        },
        params);
    detail::launch(config_, std::move(pointers),
                   [kernel, params]() { std::apply(kernel, params); });
  }

 private:
  detail::LaunchConfig config_;
};

}  // namespace cuemu
