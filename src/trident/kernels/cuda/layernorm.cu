// CUDA LayerNorm forward/backward (layernorm.h), fused residual + LayerNorm
// (fused_residual_layernorm.h) and fused bias + GeLU (fused_bias_gelu.h). One block per row for
// the row statistics; the parameter gradients are deterministic column sums (cuda_util.cuh).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"
#include "trident/kernels/cuda/philox.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;

void check_sizes(const char* op, std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0, op, ": need rows >= 0 and cols > 0, got rows=", rows,
                " cols=", cols);
}

// The fused backward passes' contract (fused_*.h): the caller's scratch holds the double
// partials of `outs` column sums (<op>_scratch_bytes) and is 8-byte aligned; the kernel never
// allocates. Refused with the CPU's message (kernels/row_partials.h).
void check_scratch(const char* op, std::span<std::byte> scratch, int outs, std::int64_t rows,
                   std::int64_t cols) {
  const auto need = static_cast<std::size_t>(outs * num_row_chunks(rows) * cols) * sizeof(double);
  TRIDENT_CHECK(scratch.size() >= need, op, ": scratch has ", scratch.size(), " bytes, needs ",
                need, " (ask ", op, "_scratch_bytes)");
  TRIDENT_CHECK(reinterpret_cast<std::uintptr_t>(scratch.data()) % alignof(double) == 0, op,
                ": scratch must be ", alignof(double), "-byte aligned");
}

__device__ __forceinline__ std::uint16_t to_bf16(float f) {
  return bf16_bits_from_float_bits(__float_as_uint(f));
}

// Forward of one row held at x (optionally x = a + b written to resid first).
__global__ void layernorm_forward_kernel(float* out, std::uint16_t* out_bf16, float* mean_out,
                                         float* rstd_out, float* resid, const float* a,
                                         const float* b, const float* w, const float* bias,
                                         std::int64_t cols, float eps) {
  const std::int64_t r = blockIdx.x;
  const float* ar = a + r * cols;
  const float* br = b ? b + r * cols : nullptr;
  float* xr = resid ? resid + r * cols : nullptr;
  float sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float x = ar[c];
    if (br) {
      x += br[c];
      xr[c] = x;  // same thread reads a[c], b[c] first: resid may alias either
    }
    sum += x;
  }
  const float* x = xr ? xr : ar;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float mean = block_sum(sum) * inv_cols;
  float sum_sq = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = x[c] - mean;
    sum_sq += d * d;
  }
  const float rstd = 1.0f / sqrtf(block_sum(sum_sq) * inv_cols + eps);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float y = (x[c] - mean) * rstd * w[c] + bias[c];
    if (out) out[r * cols + c] = y;
    if (out_bf16) out_bf16[r * cols + c] = to_bf16(y);
  }
  if (threadIdx.x == 0) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// d_in += rstd * (g - mean(g) - xhat * mean(g xhat)), g = d_out * w; optional bf16 copy of the
// final d_in.
__global__ void layernorm_backward_rows_kernel(float* d_in, std::uint16_t* d_in_bf16,
                                               const float* d_out, const float* in, const float* w,
                                               const float* mean_in, const float* rstd_in,
                                               std::int64_t cols) {
  const std::int64_t r = blockIdx.x;
  const float* x = in + r * cols;
  const float* dy = d_out + r * cols;
  float* dx = d_in + r * cols;
  const float mean = mean_in[r], rstd = rstd_in[r];
  float sg = 0.0f, sgx = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = dy[c] * w[c];
    sg += g;
    sgx += g * ((x[c] - mean) * rstd);
  }
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float mean_g = block_sum(sg) * inv_cols;
  const float mean_gx = block_sum(sgx) * inv_cols;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = (x[c] - mean) * rstd;
    const float v = dx[c] + rstd * (dy[c] * w[c] - mean_g - xhat * mean_gx);
    dx[c] = v;
    if (d_in_bf16) d_in_bf16[r * cols + c] = to_bf16(v);
  }
}

// j = 0: d_out * xhat (d_weight), j = 1: d_out (d_bias).
struct LayerNormParamGrad {
  const float* d_out;
  const float* in;
  const float* mean;
  const float* rstd;
  std::int64_t cols;
  __device__ float operator()(std::int64_t r, std::int64_t c, int j) const {
    const float dy = d_out[r * cols + c];
    return j == 0 ? dy * ((in[r * cols + c] - mean[r]) * rstd[r]) : dy;
  }
};

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float exp_sat(float x) { return expf(fminf(x, 88.0f)); }

__device__ __forceinline__ float gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x / (1.0f + exp_sat(-2.0f * u));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float x2 = x * x;
  const float u = kSqrt2OverPi * (x + kGeluCubic * x2 * x);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x2);
  const float e = exp_sat(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  return s + 2.0f * x * du * ((e * s) * s);
}

__global__ void bias_gelu_forward_kernel(float* out, std::uint16_t* out_bf16, const float* in,
                                         const float* bias, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float y = gelu(in[i] + bias[i % cols]);
    if (out) out[i] = y;
    if (out_bf16) out_bf16[i] = to_bf16(y);
  }
}

__global__ void bias_gelu_backward_kernel(float* d_in, std::uint16_t* d_in_bf16, const float* d_out,
                                          const float* in, const float* bias, std::int64_t rows,
                                          std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = d_out[i] * gelu_grad(in[i] + bias[i % cols]);
    if (d_in) d_in[i] = g;
    if (d_in_bf16) d_in_bf16[i] = to_bf16(g);
  }
}

struct BiasGeluGrad {
  const float* d_out;
  const float* in;
  const float* bias;
  std::int64_t cols;
  __device__ float operator()(std::int64_t r, std::int64_t c, int) const {
    return d_out[r * cols + c] * gelu_grad(in[r * cols + c] + bias[c]);
  }
};

}  // namespace

void layernorm_forward(const ExecContext& ctx, const LayerNormForwardArgs& args) {
  check_sizes("layernorm_forward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.out && args.mean && args.rstd && args.in && args.weight && args.bias,
                "layernorm_forward: out, mean, rstd, in, weight and bias must be non-null");
  TRIDENT_CHECK(args.eps >= 0.0f, "layernorm_forward: eps must be >= 0, got ", args.eps);
  TRIDENT_CHECK(args.rows <= 0x7fffffff, "layernorm_forward: too many rows");
  layernorm_forward_kernel<<<static_cast<unsigned>(args.rows), kRowThreads, 0, stream_of(ctx)>>>(
      args.out, nullptr, args.mean, args.rstd, nullptr, args.in, nullptr, args.weight, args.bias,
      args.cols, args.eps);
  TRIDENT_CUDA_LAUNCH_CHECK("layernorm_forward");
}

void layernorm_backward(const ExecContext& ctx, const LayerNormBackwardArgs& args) {
  check_sizes("layernorm_backward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.d_in && args.d_weight && args.d_bias && args.d_out && args.in && args.weight &&
                    args.mean && args.rstd,
                "layernorm_backward: every pointer must be non-null");
  cudaStream_t s = stream_of(ctx);
  // Parameter sums first: they read only d_out and in, which the row pass does not write.
  column_sums<2>(s, args.d_weight, args.d_bias,
                 LayerNormParamGrad{args.d_out, args.in, args.mean, args.rstd, args.cols},
                 args.rows, args.cols);
  layernorm_backward_rows_kernel<<<static_cast<unsigned>(args.rows), kRowThreads, 0, s>>>(
      args.d_in, nullptr, args.d_out, args.in, args.weight, args.mean, args.rstd, args.cols);
  TRIDENT_CUDA_LAUNCH_CHECK("layernorm_backward");
}

void residual_layernorm_forward(const ExecContext& ctx, const ResidualLayerNormForwardArgs& args) {
  check_sizes("residual_layernorm_forward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(
      args.resid_out && args.mean && args.rstd && args.a && args.b && args.weight && args.bias,
      "residual_layernorm_forward: resid_out, mean, rstd, a, b, weight and bias must be "
      "non-null");
  TRIDENT_CHECK(args.out || args.out_bf16,
                "residual_layernorm_forward: at least one of out and out_bf16 must be non-null");
  TRIDENT_CHECK(args.eps >= 0.0f, "residual_layernorm_forward: eps must be >= 0, got ", args.eps);
  layernorm_forward_kernel<<<static_cast<unsigned>(args.rows), kRowThreads, 0, stream_of(ctx)>>>(
      args.out, reinterpret_cast<std::uint16_t*>(args.out_bf16), args.mean, args.rstd,
      args.resid_out, args.a, args.b, args.weight, args.bias, args.cols, args.eps);
  TRIDENT_CUDA_LAUNCH_CHECK("residual_layernorm_forward");
}

void residual_layernorm_backward(const ExecContext& ctx,
                                 const ResidualLayerNormBackwardArgs& args) {
  check_sizes("residual_layernorm_backward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.d_resid && args.d_weight && args.d_bias && args.d_out && args.resid &&
                    args.weight && args.mean && args.rstd,
                "residual_layernorm_backward: every pointer except d_resid_bf16 must be non-null");
  check_scratch("residual_layernorm_backward", args.scratch, 2, args.rows, args.cols);
  cudaStream_t s = stream_of(ctx);
  column_sums<2>(s, args.d_weight, args.d_bias,
                 LayerNormParamGrad{args.d_out, args.resid, args.mean, args.rstd, args.cols},
                 args.rows, args.cols, args.scratch.data(),
                 static_cast<std::int64_t>(args.scratch.size()));
  layernorm_backward_rows_kernel<<<static_cast<unsigned>(args.rows), kRowThreads, 0, s>>>(
      args.d_resid, reinterpret_cast<std::uint16_t*>(args.d_resid_bf16), args.d_out, args.resid,
      args.weight, args.mean, args.rstd, args.cols);
  TRIDENT_CUDA_LAUNCH_CHECK("residual_layernorm_backward");
}

void bias_gelu_forward(const ExecContext& ctx, const BiasGeluForwardArgs& args) {
  check_sizes("bias_gelu_forward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.in && args.bias, "bias_gelu_forward: in and bias must be non-null");
  TRIDENT_CHECK(args.out || args.out_bf16,
                "bias_gelu_forward: at least one of out and out_bf16 must be non-null");
  const std::int64_t n = args.rows * args.cols;
  bias_gelu_forward_kernel<<<grid_for(n, 256), 256, 0, stream_of(ctx)>>>(
      args.out, reinterpret_cast<std::uint16_t*>(args.out_bf16), args.in, args.bias, args.rows,
      args.cols);
  TRIDENT_CUDA_LAUNCH_CHECK("bias_gelu_forward");
}

void bias_gelu_backward(const ExecContext& ctx, const BiasGeluBackwardArgs& args) {
  check_sizes("bias_gelu_backward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.d_bias && args.d_out && args.in && args.bias,
                "bias_gelu_backward: d_bias, d_out, in and bias must be non-null");
  TRIDENT_CHECK(args.d_in || args.d_in_bf16,
                "bias_gelu_backward: at least one of d_in and d_in_bf16 must be non-null");
  check_scratch("bias_gelu_backward", args.scratch, 1, args.rows, args.cols);
  cudaStream_t s = stream_of(ctx);
  // The bias sum first: d_in may alias d_out.
  column_sums<1>(s, args.d_bias, nullptr, BiasGeluGrad{args.d_out, args.in, args.bias, args.cols},
                 args.rows, args.cols, args.scratch.data(),
                 static_cast<std::int64_t>(args.scratch.size()));
  const std::int64_t n = args.rows * args.cols;
  bias_gelu_backward_kernel<<<grid_for(n, 256), 256, 0, s>>>(
      args.d_in, reinterpret_cast<std::uint16_t*>(args.d_in_bf16), args.d_out, args.in, args.bias,
      args.rows, args.cols);
  TRIDENT_CUDA_LAUNCH_CHECK("bias_gelu_backward");
}

}  // namespace trident::kernels::cuda
