// CUDA elementwise kernels (elementwise.h), BF16 conversions (bf16.h) and fused AdamW (adamw.h):
// grid-stride loops, bandwidth-bound. The reductions (sum_squares, all_finite) use a fixed grid so
// that the result is bitwise reproducible.
#include <cuda_runtime.h>

#include <cmath>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"
#include "trident/kernels/cuda/philox.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

void check_n(const char* op, std::int64_t n, bool pointers_ok) {
  TRIDENT_CHECK(n >= 0, op, ": n must be >= 0, got ", n);
  TRIDENT_CHECK(n == 0 || pointers_ok, op, ": a pointer is null for n=", n);
}

// exp saturated at exp(88) as the CPU's exp_approx, so that gelu of a large negative x stays
// finite and its derivative never forms inf * 0.
__device__ __forceinline__ float exp_sat(float x) { return expf(fminf(x, 88.0f)); }

__global__ void gelu_forward_kernel(float* out, const float* in, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float x = in[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = x / (1.0f + exp_sat(-2.0f * u));
  }
}

__global__ void gelu_backward_kernel(float* d_in, const float* d_out, const float* in,
                                     std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float x = in[i];
    const float x2 = x * x;
    const float u = kSqrt2OverPi * (x + kGeluCubic * x2 * x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x2);
    const float e = exp_sat(-2.0f * u);
    const float s = 1.0f / (1.0f + e);
    d_in[i] = d_out[i] * (s + 2.0f * x * du * ((e * s) * s));
  }
}

__global__ void add_kernel(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

__global__ void scale_kernel(float* x, float s, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

// A partition fixed by n: parts_for(n) contiguous ranges (at most kParts, about 4 elements per
// thread each), one block each, summed in double by a fixed tree, then in order.
constexpr int kParts = 512;
int parts_for(std::int64_t n) {
  const std::int64_t parts = (n + 4 * kThreads - 1) / (4 * kThreads);
  return static_cast<int>(parts < 1 ? 1 : (parts > kParts ? kParts : parts));
}

__global__ void sum_squares_partial_kernel(double* partial, const float* x, std::int64_t n) {
  const std::int64_t chunk = (n + gridDim.x - 1) / gridDim.x;
  const std::int64_t begin = min(n, chunk * blockIdx.x), end = min(n, begin + chunk);
  double acc = 0.0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *out = (or +=, accumulating over ranges) the partials added in order.
__global__ void sum_partials_kernel(double* out, const double* partial, int parts, int accumulate) {
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int p = 0; p < parts; ++p) total += partial[p];
  *out = accumulate != 0 ? *out + total : total;
}

__global__ void nonfinite_kernel(unsigned* bad, const float* x, std::int64_t n) {
  unsigned local = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    local |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
  }
  if (__any_sync(0xffffffffu, local) && (threadIdx.x & 31) == 0) atomicOr(bad, 1u);
}

__global__ void f32_to_bf16_kernel(std::uint16_t* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = bf16_bits_from_float_bits(__float_as_uint(src[i]));
  }
}

__global__ void bf16_to_f32_kernel(float* dst, const std::uint16_t* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = __uint_as_float(static_cast<std::uint32_t>(src[i]) << 16);
  }
}

__global__ void fill_kernel(float* out, float value, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

__global__ void overflow_kernel(unsigned long long* count, const float* x, float threshold,
                                std::int64_t n) {
  unsigned long long local = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    local += !(fabsf(x[i]) <= threshold) ? 1ull : 0ull;  // NaN compares false: counted
  }
  local = warp_sum(local);
  if ((threadIdx.x & 31) == 0 && local != 0) atomicAdd(count, local);
}

struct AdamWScalars {
  float step_size, inv_sqrt_bc2, decay, b1, b2, one_minus_b1, one_minus_b2, eps, grad_scale;
};

__global__ void adamw_kernel(float* p, float* m, float* v, const float* grad, AdamWScalars s,
                             std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i] * s.grad_scale;
    const float mi = s.b1 * m[i] + s.one_minus_b1 * g;
    const float vi = s.b2 * v[i] + s.one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float decayed = p[i] * s.decay;
    p[i] = decayed - s.step_size * mi / (sqrtf(vi) * s.inv_sqrt_bc2 + s.eps);
  }
}

}  // namespace

void gelu_forward(const ExecContext& ctx, float* out, const float* in, std::int64_t n) {
  check_n("gelu_forward", n, out && in);
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(out, in, n);
  TRIDENT_CUDA_LAUNCH_CHECK("gelu_forward");
}

void gelu_backward(const ExecContext& ctx, float* d_in, const float* d_out, const float* in,
                   std::int64_t n) {
  check_n("gelu_backward", n, d_in && d_out && in);
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(d_in, d_out, in, n);
  TRIDENT_CUDA_LAUNCH_CHECK("gelu_backward");
}

void add_forward(const ExecContext& ctx, float* out, const float* a, const float* b,
                 std::int64_t n) {
  check_n("add_forward", n, out && a && b);
  if (n == 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(out, a, b, n);
  TRIDENT_CUDA_LAUNCH_CHECK("add_forward");
}

void scale_inplace(const ExecContext& ctx, float* x, float s, std::int64_t n) {
  check_n("scale_inplace", n, x != nullptr);
  if (n == 0) return;
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(x, s, n);
  TRIDENT_CUDA_LAUNCH_CHECK("scale_inplace");
}

double sum_squares(const ExecContext& ctx, const float* x, std::int64_t n) {
  return sum_squares_ranges(ctx, &x, &n, 1);
}

double sum_squares_ranges(const ExecContext& ctx, const float* const* xs, const std::int64_t* ns,
                          std::int64_t count) {
  for (std::int64_t r = 0; r < count; ++r) check_n("sum_squares", ns[r], xs[r] != nullptr);
  cudaStream_t s = stream_of(ctx);
  StreamScratch total(sizeof(double), s);
  bool first = true;
  for (std::int64_t r = 0; r < count; ++r) {
    if (ns[r] == 0) continue;
    const int parts = parts_for(ns[r]);
    StreamScratch partial(parts * static_cast<std::int64_t>(sizeof(double)), s);
    sum_squares_partial_kernel<<<parts, kThreads, 0, s>>>(partial.as<double>(), xs[r], ns[r]);
    TRIDENT_CUDA_LAUNCH_CHECK("sum_squares");
    sum_partials_kernel<<<1, 32, 0, s>>>(total.as<double>(), partial.as<double>(), parts,
                                         first ? 0 : 1);
    TRIDENT_CUDA_LAUNCH_CHECK("sum_squares");
    first = false;
  }
  if (first) return 0.0;
  return read_back(s, total.as<double>());  // one host sync for every range
}

bool all_finite(const ExecContext& ctx, const float* x, std::int64_t n) {
  check_n("all_finite", n, x != nullptr);
  if (n == 0) return true;
  cudaStream_t s = stream_of(ctx);
  StreamScratch flag(sizeof(unsigned), s);
  TRIDENT_CUDA_CHECK(cudaMemsetAsync(flag.as<unsigned>(), 0, sizeof(unsigned), s));
  nonfinite_kernel<<<grid_for(n, kThreads, 4096), kThreads, 0, s>>>(flag.as<unsigned>(), x, n);
  TRIDENT_CUDA_LAUNCH_CHECK("all_finite");
  return read_back(s, flag.as<unsigned>()) == 0;
}

void fill(const ExecContext& ctx, const FillArgs& args) {
  check_n("fill", args.n, args.out != nullptr);
  if (args.n == 0) return;
  fill_kernel<<<grid_for(args.n, kThreads), kThreads, 0, stream_of(ctx)>>>(args.out, args.value,
                                                                           args.n);
  TRIDENT_CUDA_LAUNCH_CHECK("fill");
}

void copy(const ExecContext& ctx, const CopyArgs& args) {
  check_n("copy", args.n, args.out && args.in);
  if (args.n == 0) return;
  // fill.h: out and in are disjoint (cudaMemcpyAsync of overlapping ranges is undefined).
  TRIDENT_CHECK(args.out + args.n <= args.in || args.in + args.n <= args.out,
                "copy: out and in overlap (n=", args.n, ")");
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(args.out, args.in, static_cast<size_t>(args.n) * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream_of(ctx)));
}

__global__ void copy_columns_kernel(CopyColumnsArgs a) {
  const std::int64_t n = a.rows * a.cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / a.cols, c = i % a.cols;
    a.out[r * a.out_width + a.out_col + c] = a.in[r * a.in_width + a.in_col + c];
  }
}

void copy_columns(const ExecContext& ctx, const CopyColumnsArgs& args) {
  TRIDENT_CHECK(args.rows >= 0 && args.cols >= 0, "copy_columns: negative size (", args.rows, " x ",
                args.cols, ")");
  const std::int64_t n = args.rows * args.cols;
  if (n == 0) return;
  TRIDENT_CHECK(args.out != nullptr && args.in != nullptr, "copy_columns: a pointer is null");
  copy_columns_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(args);
  TRIDENT_CUDA_LAUNCH_CHECK("copy_columns");
}

std::int64_t overflow_count(const ExecContext& ctx, const OverflowCountArgs& args) {
  check_n("overflow_count", args.n, args.x != nullptr);
  TRIDENT_CHECK(args.threshold >= 0.0f, "overflow_count: threshold must be >= 0, got ",
                args.threshold);
  if (args.n == 0) return 0;
  cudaStream_t s = stream_of(ctx);
  StreamScratch count(sizeof(unsigned long long), s);
  TRIDENT_CUDA_CHECK(
      cudaMemsetAsync(count.as<unsigned long long>(), 0, sizeof(unsigned long long), s));
  overflow_kernel<<<grid_for(args.n, kThreads, 4096), kThreads, 0, s>>>(
      count.as<unsigned long long>(), args.x, args.threshold, args.n);
  TRIDENT_CUDA_LAUNCH_CHECK("overflow_count");
  return static_cast<std::int64_t>(read_back(s, count.as<unsigned long long>()));
}

void convert_f32_to_bf16(const ExecContext& ctx, core::bf16* dst, const float* src,
                         std::int64_t n) {
  check_n("convert_f32_to_bf16", n, dst && src);
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(
      reinterpret_cast<std::uint16_t*>(dst), src, n);
  TRIDENT_CUDA_LAUNCH_CHECK("convert_f32_to_bf16");
}

void convert_bf16_to_f32(const ExecContext& ctx, float* dst, const core::bf16* src,
                         std::int64_t n) {
  check_n("convert_bf16_to_f32", n, dst && src);
  if (n == 0) return;
  bf16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(
      dst, reinterpret_cast<const std::uint16_t*>(src), n);
  TRIDENT_CUDA_LAUNCH_CHECK("convert_bf16_to_f32");
}

void adamw_update(const ExecContext& ctx, const AdamWHyper& hp, const AdamWArgs& args) {
  TRIDENT_CHECK(args.n >= 0, "adamw_update: n must be >= 0, got ", args.n);
  TRIDENT_CHECK(hp.step >= 1, "adamw_update: step is 1-based, got ", hp.step);
  TRIDENT_CHECK(hp.beta1 >= 0.0f && hp.beta1 < 1.0f && hp.beta2 >= 0.0f && hp.beta2 < 1.0f,
                "adamw_update: betas must be in [0, 1), got beta1=", hp.beta1, " beta2=", hp.beta2);
  TRIDENT_CHECK(hp.lr >= 0.0f && hp.eps >= 0.0f && hp.weight_decay >= 0.0f,
                "adamw_update: lr, eps and weight_decay must be >= 0, got lr=", hp.lr,
                " eps=", hp.eps, " weight_decay=", hp.weight_decay);
  if (args.n == 0) return;
  TRIDENT_CHECK(args.param && args.m && args.v && args.grad,
                "adamw_update: param, m, v and grad must be non-null");
  // The CPU's scalars (kernels/cpu/adamw.cc), in double once.
  const double t = static_cast<double>(hp.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), t);
  AdamWScalars s{};
  s.step_size = static_cast<float>(hp.lr / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  s.b1 = hp.beta1;
  s.b2 = hp.beta2;
  s.one_minus_b1 = 1.0f - hp.beta1;
  s.one_minus_b2 = 1.0f - hp.beta2;
  s.eps = hp.eps;
  s.grad_scale = hp.grad_scale;
  adamw_kernel<<<grid_for(args.n, kThreads), kThreads, 0, stream_of(ctx)>>>(
      args.param, args.m, args.v, args.grad, s, args.n);
  TRIDENT_CUDA_LAUNCH_CHECK("adamw_update");
}

}  // namespace trident::kernels::cuda
