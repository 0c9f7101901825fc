// CPU BF16 matrix products through oneDNN's matmul primitive (bf16 x bf16 -> f32), with transposes
// as strides and a small thread-safe cache of primitives, plus the linear layer built on it. See
// matmul_bf16.h for the contract.
#include "trident/kernels/matmul_bf16.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif
#include "trident/kernels/cpu_util.h"

namespace trident::kernels {

namespace {

using Dt = dnnl::memory::data_type;

// Everything a primitive depends on. oneDNN sizes its per-thread buffers (and so the scratchpad)
// for the thread count at creation, hence `threads` is part of the key.
struct GemmKey {
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  Trans trans_a = Trans::kNo, trans_b = Trans::kNo;
  bool has_bias = false;
  std::uint32_t beta_bits = 0;
  int threads = 1;
  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& key) const {
    std::uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
    mix(static_cast<std::uint64_t>(key.m));
    mix(static_cast<std::uint64_t>(key.n));
    mix(static_cast<std::uint64_t>(key.k));
    mix(static_cast<std::uint64_t>(key.lda));
    mix(static_cast<std::uint64_t>(key.ldb));
    mix(static_cast<std::uint64_t>(key.ldc));
    mix(static_cast<std::uint64_t>(key.trans_a) << 8 | static_cast<std::uint64_t>(key.trans_b));
    mix(key.has_bias ? 1u : 0u);
    mix(key.beta_bits);
    mix(static_cast<std::uint64_t>(key.threads));
    return static_cast<std::size_t>(h);
  }
};

// Tile of C the upconverting path (below) computes per FP32 product: the op(A) rows and op(B)
// columns of one tile are widened to FP32 in the scratch, so its size bounds the scratch.
constexpr std::int64_t kUpconvertTile = 1024;

struct GemmPrimitive {
  dnnl::matmul matmul;
  dnnl::memory::desc a_desc, b_desc, c_desc, bias_desc, scratch_desc;
  std::int64_t scratch_bytes = 0;
  std::string implementation;
  // No native BF16 matmul on this CPU (oneDNN has none, or only its reference loop, e.g. on AVX2
  // processors): the operands are widened to FP32 tile by tile and multiplied by sgemm. A bf16 x
  // bf16 product is exact in FP32, so this is the same arithmetic (FP32 accumulation of exact
  // products) as the BF16 dot-product instructions, in another summation order.
  bool upconvert = false;
};

std::int64_t upconvert_scratch_bytes(std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::int64_t mb = std::min(m, kUpconvertTile), nb = std::min(n, kUpconvertTile);
  return static_cast<std::int64_t>(sizeof(float)) * (mb * k + k * nb);
}

// The process-wide primitive cache. A training run uses a few dozen configurations (three products
// per linear layer shape); when the cache is full it is simply emptied and refilled.
class PrimitiveCache {
 public:
  static PrimitiveCache& instance() {
    static PrimitiveCache cache;
    return cache;
  }
  const dnnl::engine& engine() const { return engine_; }

  // Returns a shared handle, so the caller runs the product without holding the lock, and a hit
  // copies no strings (a warm call allocates nothing here).
  std::shared_ptr<const GemmPrimitive> get(const GemmKey& key) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      const auto it = entries_.find(key);
      if (it != entries_.end()) return it->second;
    }
    // Outside the lock: creation takes milliseconds.
    auto created = std::make_shared<const GemmPrimitive>(create(key));
    created_.fetch_add(1, std::memory_order_relaxed);
    const std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() >= kCapacity) entries_.clear();
    entries_.emplace(key, created);
    return created;
  }
  std::int64_t created() const { return created_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::size_t kCapacity = 256;

  PrimitiveCache() : engine_(dnnl::engine::kind::cpu, 0) {}

  GemmPrimitive create(const GemmKey& key) const;
  static GemmPrimitive upconverting(const GemmKey& key, const std::string& onednn_impl) {
    GemmPrimitive p;
    p.upconvert = true;
    p.scratch_bytes = upconvert_scratch_bytes(key.m, key.n, key.k);
    p.implementation = "upconvert:f32_sgemm (oneDNN bf16 matmul: " + onednn_impl + ")";
    return p;
  }

  dnnl::engine engine_;
  std::mutex mutex_;
  std::unordered_map<GemmKey, std::shared_ptr<const GemmPrimitive>, GemmKeyHash> entries_;
  std::atomic<std::int64_t> created_{0};
};

// op(A) is (m,k): stored (m,k) with row stride lda, or stored (k,m) and read transposed; likewise
// op(B) (k,n). A transposed operand is the same memory with the strides swapped.
GemmPrimitive PrimitiveCache::create(const GemmKey& key) const {
  using Dims = dnnl::memory::dims;
  const Dims a_strides = key.trans_a == Trans::kYes ? Dims{1, key.lda} : Dims{key.lda, 1};
  const Dims b_strides = key.trans_b == Trans::kYes ? Dims{1, key.ldb} : Dims{key.ldb, 1};
  GemmPrimitive p;
  p.a_desc = dnnl::memory::desc({key.m, key.k}, Dt::bf16, a_strides);
  p.b_desc = dnnl::memory::desc({key.k, key.n}, Dt::bf16, b_strides);
  p.c_desc = dnnl::memory::desc({key.m, key.n}, Dt::f32, Dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // the caller's scratch, see the header
  const float beta = std::bit_cast<float>(key.beta_bits);
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);  // C = product (+ bias) + beta * C
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd;
    if (key.has_bias) {
      p.bias_desc = dnnl::memory::desc({1, key.n}, Dt::f32, Dims{key.n, 1});
      pd = dnnl::matmul::primitive_desc(
          dnnl::matmul::desc(p.a_desc, p.b_desc, p.bias_desc, p.c_desc), attr, engine_);
    } else {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(p.a_desc, p.b_desc, p.c_desc), attr,
                                        engine_);
    }
    p.implementation = pd.impl_info_str();
    if (p.implementation.rfind("ref", 0) == 0) return upconverting(key, p.implementation);
    p.matmul = dnnl::matmul(pd);
    p.scratch_desc = pd.scratchpad_desc();
    p.scratch_bytes = static_cast<std::int64_t>(p.scratch_desc.get_size());
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented) return upconverting(key, "none");
    throw core::InternalError(core::str(
        "gemm_bf16: oneDNN cannot create a bf16 matmul for m=", key.m, " n=", key.n, " k=", key.k,
        " lda=", key.lda, " ldb=", key.ldb, " ldc=", key.ldc, ": ", e.what()));
  }
  return p;
}

GemmKey make_key(const core::ExecContext& ctx, const GemmBf16Args& g) {
  return {.m = g.m,
          .n = g.n,
          .k = g.k,
          .lda = g.lda,
          .ldb = g.ldb,
          .ldc = g.ldc,
          .trans_a = g.trans_a,
          .trans_b = g.trans_b,
          .has_bias = g.bias != nullptr,
          .beta_bits = std::bit_cast<std::uint32_t>(g.beta == 0.0f ? 0.0f : g.beta),
          .threads = detail::num_threads(ctx)};
}

void check_gemm_shape(const GemmBf16Args& g) {
  TRIDENT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "gemm_bf16: sizes must be >= 0, got m=", g.m,
                " n=", g.n, " k=", g.k);
  if (g.m == 0 || g.n == 0) return;
  TRIDENT_CHECK(g.ldc >= g.n, "gemm_bf16: ldc (", g.ldc, ") must be >= n (", g.n, ")");
  if (g.k == 0) return;
  const std::int64_t a_cols = g.trans_a == Trans::kYes ? g.m : g.k;
  const std::int64_t b_cols = g.trans_b == Trans::kYes ? g.k : g.n;
  TRIDENT_CHECK(g.lda >= a_cols, "gemm_bf16: lda (", g.lda, ") must be >= ", a_cols,
                " (the row length of A as stored)");
  TRIDENT_CHECK(g.ldb >= b_cols, "gemm_bf16: ldb (", g.ldb, ") must be >= ", b_cols,
                " (the row length of B as stored)");
}

// C = beta * C + bias for K == 0 (no product to run).
void scale_and_add_bias(const GemmBf16Args& g) {
  for (std::int64_t i = 0; i < g.m; ++i) {
    float* c = g.c + i * g.ldc;
    for (std::int64_t j = 0; j < g.n; ++j) {
      const float old = g.beta == 0.0f ? 0.0f : g.beta * c[j];
      c[j] = old + (g.bias != nullptr ? g.bias[j] : 0.0f);
    }
  }
}

// dst (rows x cols, row stride cols) = src (rows x cols, row stride ld) widened to FP32 (exact).
void widen_block(float* dst, const core::bf16* src, std::int64_t ld, std::int64_t rows,
                 std::int64_t cols, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * cols > 65536)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint16_t* s = reinterpret_cast<const std::uint16_t*>(src + r * ld);
    float* d = dst + r * cols;
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) {
      d[c] = std::bit_cast<float>(static_cast<std::uint32_t>(s[c]) << 16);
    }
  }
}

// The upconverting product (GemmPrimitive::upconvert): C is computed in tiles of at most
// kUpconvertTile x kUpconvertTile; each tile's op(A) rows and op(B) columns are widened into the
// scratch (op(A) panels once per row block, op(B) panels once per tile) and multiplied by sgemm
// with C's beta, then the bias is added, as oneDNN's matmul does (C = AB + bias + beta C).
void run_upconverted(const core::ExecContext& ctx, const GemmBf16Args& g, std::int64_t need) {
  TRIDENT_CHECK(static_cast<std::int64_t>(g.scratch.size()) >= need, "gemm_bf16: scratch has ",
                g.scratch.size(), " bytes, this product needs ", need, " (m=", g.m, " n=", g.n,
                " k=", g.k, "; ask gemm_bf16_scratch_bytes or linear_bf16_scratch_bytes)");
  const int threads = detail::num_threads(ctx);
  const bool ta = g.trans_a == Trans::kYes, tb = g.trans_b == Trans::kYes;
  float* a_panel = reinterpret_cast<float*>(g.scratch.data());
  float* b_panel = a_panel + std::min(g.m, kUpconvertTile) * g.k;
  for (std::int64_t i0 = 0; i0 < g.m; i0 += kUpconvertTile) {
    const std::int64_t mb = std::min(kUpconvertTile, g.m - i0);
    // op(A) rows i0..i0+mb: stored rows (m,k) or stored columns of (k,m).
    if (ta) {
      widen_block(a_panel, g.a + i0, g.lda, g.k, mb, threads);
    } else {
      widen_block(a_panel, g.a + i0 * g.lda, g.lda, mb, g.k, threads);
    }
    for (std::int64_t j0 = 0; j0 < g.n; j0 += kUpconvertTile) {
      const std::int64_t nb = std::min(kUpconvertTile, g.n - j0);
      // op(B) columns j0..j0+nb: stored rows of (n,k) or stored columns of (k,n).
      if (tb) {
        widen_block(b_panel, g.b + j0 * g.ldb, g.ldb, nb, g.k, threads);
      } else {
        widen_block(b_panel, g.b + j0, g.ldb, g.k, nb, threads);
      }
      float* c = g.c + i0 * g.ldc + j0;
      {
        detail::OmpThreadsScope scope(ctx.num_threads);
        detail::sgemm({.trans_a = g.trans_a,
                       .trans_b = g.trans_b,
                       .m = mb,
                       .n = nb,
                       .k = g.k,
                       .a = a_panel,
                       .lda = ta ? mb : g.k,
                       .b = b_panel,
                       .ldb = tb ? g.k : nb,
                       .beta = g.beta,
                       .c = c,
                       .ldc = g.ldc});
      }
      if (g.bias != nullptr) {
        const float* bias = g.bias + j0;
#pragma omp parallel for num_threads(threads) schedule(static) if (mb * nb > 65536)
        for (std::int64_t r = 0; r < mb; ++r) {
          float* row = c + r * g.ldc;
#pragma omp simd
          for (std::int64_t j = 0; j < nb; ++j) row[j] += bias[j];
        }
      }
    }
  }
}

// The product without argument checks (callers have checked).
void run_gemm_bf16(const core::ExecContext& ctx, const GemmBf16Args& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    scale_and_add_bias(g);
    return;
  }
  // oneDNN's OpenMP runtime takes its team size from omp_get_max_threads() of the calling thread.
  detail::OmpThreadsScope threads(ctx.num_threads);
  PrimitiveCache& cache = PrimitiveCache::instance();
  const std::shared_ptr<const GemmPrimitive> held = cache.get(make_key(ctx, g));
  const GemmPrimitive& p = *held;
  if (p.upconvert) {
    run_upconverted(ctx, g, p.scratch_bytes);
    return;
  }
  TRIDENT_CHECK(static_cast<std::int64_t>(g.scratch.size()) >= p.scratch_bytes,
                "gemm_bf16: scratch has ", g.scratch.size(), " bytes, this product needs ",
                p.scratch_bytes, " (m=", g.m, " n=", g.n, " k=", g.k,
                "; ask gemm_bf16_scratch_bytes or linear_bf16_scratch_bytes)");
  const dnnl::engine& engine = cache.engine();
  // oneDNN takes non-const handles; it only reads A, B and bias.
  dnnl::memory a(p.a_desc, engine, const_cast<core::bf16*>(g.a));
  dnnl::memory b(p.b_desc, engine, const_cast<core::bf16*>(g.b));
  dnnl::memory c(p.c_desc, engine, g.c);
  std::unordered_map<int, dnnl::memory> io = {
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
  if (g.bias != nullptr) {
    io.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias_desc, engine, const_cast<float*>(g.bias)));
  }
  if (p.scratch_bytes > 0) {
    io.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(p.scratch_desc, engine, g.scratch.data()));
  }
  dnnl::stream stream(engine);
  try {
    p.matmul.execute(stream, io);
    stream.wait();
  } catch (const dnnl::error& e) {
    throw core::InternalError(core::str("gemm_bf16: oneDNN matmul failed for m=", g.m, " n=", g.n,
                                        " k=", g.k, ": ", e.what()));
  }
}

void check_linear_sizes(const char* op, std::int64_t rows, std::int64_t in_features,
                        std::int64_t out_features) {
  TRIDENT_CHECK(rows >= 0 && in_features > 0 && out_features > 0, op,
                ": need rows >= 0 and in_features, out_features > 0, got rows=", rows,
                " in_features=", in_features, " out_features=", out_features);
}

// d_bias(cols) += column sums of d_out(rows, cols). Threads own blocks of columns and walk all rows
// in order, in double, so the result does not depend on the thread count.
void add_column_sums(const core::ExecContext& ctx, float* d_bias, const float* d_out,
                     std::int64_t rows, std::int64_t cols) {
  constexpr std::int64_t kMaxBlock = 512;
  const int threads = detail::num_threads(ctx);
  const std::int64_t block = detail::column_block_width(cols, threads, kMaxBlock);
  const std::int64_t num_blocks = (cols + block - 1) / block;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t blk = 0; blk < num_blocks; ++blk) {
    const std::int64_t c0 = blk * block;
    const std::int64_t width = std::min(block, cols - c0);
    double acc[kMaxBlock];
    std::fill(acc, acc + width, 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = d_out + r * cols + c0;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) acc[j] += row[j];
    }
    for (std::int64_t j = 0; j < width; ++j) {
      d_bias[c0 + j] = static_cast<float>(d_bias[c0 + j] + acc[j]);
    }
  }
}

// The three products of a linear layer, as gemm_bf16 arguments (pointers filled by the callers).
GemmBf16Args forward_product(std::int64_t rows, std::int64_t in_f, std::int64_t out_f) {
  // out(rows,out) = in(rows,in) @ weight(out,in)^T
  return {.trans_b = Trans::kYes,
          .m = rows,
          .n = out_f,
          .k = in_f,
          .lda = in_f,
          .ldb = in_f,
          .ldc = out_f};
}
GemmBf16Args backward_data_product(std::int64_t rows, std::int64_t in_f, std::int64_t out_f) {
  // d_in(rows,in) = d_out(rows,out) @ weight(out,in)
  return {.m = rows, .n = in_f, .k = out_f, .lda = out_f, .ldb = in_f, .ldc = in_f};
}
GemmBf16Args backward_weight_product(std::int64_t rows, std::int64_t in_f, std::int64_t out_f) {
  // d_weight(out,in) += d_out(rows,out)^T @ in(rows,in)
  return {.trans_a = Trans::kYes,
          .m = out_f,
          .n = in_f,
          .k = rows,
          .lda = out_f,
          .ldb = in_f,
          .beta = 1.0f,
          .ldc = in_f};
}

}  // namespace

void gemm_bf16(const core::ExecContext& ctx, const GemmBf16Args& args) {
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    return cuda::gemm_bf16(ctx, args);
#else
    no_cuda_backend("gemm_bf16");
#endif
  }
  check_gemm_shape(args);
  if (args.m == 0 || args.n == 0) return;
  TRIDENT_CHECK(args.c != nullptr, "gemm_bf16: c is null for a ", args.m, "x", args.n, " product");
  TRIDENT_CHECK(args.k == 0 || (args.a != nullptr && args.b != nullptr),
                "gemm_bf16: a or b is null (m=", args.m, " n=", args.n, " k=", args.k, ")");
  run_gemm_bf16(ctx, args);
}

std::int64_t gemm_bf16_scratch_bytes(const core::ExecContext& ctx, const GemmBf16Args& args) {
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    return 0;  // cuBLASLt takes its workspace from the stream pool
#else
    no_cuda_backend("gemm_bf16_scratch_bytes");
#endif
  }
  check_gemm_shape(args);
  if (args.m == 0 || args.n == 0 || args.k == 0) return 0;
  detail::OmpThreadsScope threads(ctx.num_threads);
  return PrimitiveCache::instance().get(make_key(ctx, args))->scratch_bytes;
}

std::int64_t gemm_bf16_primitives_created() { return PrimitiveCache::instance().created(); }

std::string gemm_bf16_implementation(const core::ExecContext& ctx, const GemmBf16Args& args) {
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    return "cublasLt";
#else
    no_cuda_backend("gemm_bf16_implementation");
#endif
  }
  check_gemm_shape(args);
  if (args.m == 0 || args.n == 0 || args.k == 0) return "none (empty product)";
  detail::OmpThreadsScope threads(ctx.num_threads);
  return PrimitiveCache::instance().get(make_key(ctx, args))->implementation;
}

std::int64_t linear_bf16_scratch_bytes(const core::ExecContext& ctx, std::int64_t rows,
                                       std::int64_t in_features, std::int64_t out_features) {
  check_linear_sizes("linear_bf16_scratch_bytes", rows, in_features, out_features);
  GemmBf16Args forward = forward_product(rows, in_features, out_features);
  std::int64_t bytes = gemm_bf16_scratch_bytes(ctx, forward);
  const float bias_placeholder = 0.0f;  // only its non-nullness is read
  forward.bias = &bias_placeholder;
  bytes = std::max(bytes, gemm_bf16_scratch_bytes(ctx, forward));
  bytes = std::max(
      bytes, gemm_bf16_scratch_bytes(ctx, backward_data_product(rows, in_features, out_features)));
  bytes = std::max(bytes, gemm_bf16_scratch_bytes(
                              ctx, backward_weight_product(rows, in_features, out_features)));
  return bytes;
}

void linear_forward_bf16(const core::ExecContext& ctx, const LinearForwardBf16Args& args) {
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    return cuda::linear_forward_bf16(ctx, args);
#else
    no_cuda_backend("linear_forward_bf16");
#endif
  }
  const std::int64_t rows = args.rows, in_f = args.in_features, out_f = args.out_features;
  check_linear_sizes("linear_forward_bf16", rows, in_f, out_f);
  if (rows == 0) return;
  TRIDENT_CHECK(args.out && args.in && args.weight,
                "linear_forward_bf16: out, in and weight must be non-null");
  GemmBf16Args g = forward_product(rows, in_f, out_f);
  g.a = args.in;
  g.b = args.weight;
  g.bias = args.bias;
  g.c = args.out;
  g.scratch = args.scratch;
  run_gemm_bf16(ctx, g);
}

void linear_backward_bf16(const core::ExecContext& ctx, const LinearBackwardBf16Args& args) {
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    return cuda::linear_backward_bf16(ctx, args);
#else
    no_cuda_backend("linear_backward_bf16");
#endif
  }
  const std::int64_t rows = args.rows, in_f = args.in_features, out_f = args.out_features;
  check_linear_sizes("linear_backward_bf16", rows, in_f, out_f);
  if (rows == 0) return;
  TRIDENT_CHECK(args.d_weight && args.d_out_bf16 && args.in && args.weight,
                "linear_backward_bf16: d_weight, d_out_bf16, in and weight must be non-null");
  TRIDENT_CHECK(args.d_bias == nullptr || args.d_out != nullptr,
                "linear_backward_bf16: d_bias needs the f32 d_out, which is null");
  if (args.d_in != nullptr) {
    GemmBf16Args g = backward_data_product(rows, in_f, out_f);
    g.a = args.d_out_bf16;
    g.b = args.weight;
    g.c = args.d_in;
    g.scratch = args.scratch;
    run_gemm_bf16(ctx, g);
  }
  GemmBf16Args g = backward_weight_product(rows, in_f, out_f);
  g.a = args.d_out_bf16;
  g.b = args.in;
  g.c = args.d_weight;
  g.scratch = args.scratch;
  run_gemm_bf16(ctx, g);
  if (args.d_bias != nullptr) add_column_sums(ctx, args.d_bias, args.d_out, rows, out_f);
}

}  // namespace trident::kernels
