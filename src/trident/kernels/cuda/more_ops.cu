// CUDA bodies of the ops the first CUDA backend lacked: RMSNorm forward/backward (rmsnorm.h),
// SwiGLU forward/backward (swiglu.h), the vocab-parallel cross-entropy parts and the token-loss sum
// (vocab_parallel_cross_entropy.h), hidden dropout (dropout.h, the CPU's Philox masks) and the
// normal initialisation (init_normal.h, the CPU's Philox normals). One block per row where a row
// statistic is needed; parameter gradients are the deterministic column sums of cuda_util.cuh.
#include <cuda_runtime.h>

#include <cfloat>
#include <vector>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"
#include "trident/kernels/cuda/philox.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;

void check_rows(const char* op, std::int64_t rows, std::int64_t cols) {
  TRIDENT_CHECK(rows >= 0 && cols > 0, op, ": need rows >= 0 and cols > 0, got rows=", rows,
                " cols=", cols);
  TRIDENT_CHECK(rows <= 0x7fffffff, op, ": too many rows (", rows, ")");
}

// ---- RMSNorm ----

__global__ void rmsnorm_forward_kernel(float* out, float* rstd_out, const float* in, const float* w,
                                       std::int64_t cols, float eps) {
  const std::int64_t r = blockIdx.x;
  const float* x = in + r * cols;
  float sum_sq = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum_sq += x[c] * x[c];
  const float rstd = 1.0f / sqrtf(block_sum(sum_sq) / static_cast<float>(cols) + eps);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[r * cols + c] = x[c] * rstd * w[c];
  }
  if (threadIdx.x == 0) rstd_out[r] = rstd;
}

// d_in += rstd * (g - xhat * mean(g xhat)), g = d_out * w.
__global__ void rmsnorm_backward_rows_kernel(float* d_in, const float* d_out, const float* in,
                                             const float* w, const float* rstd_in,
                                             std::int64_t cols) {
  const std::int64_t r = blockIdx.x;
  const float* x = in + r * cols;
  const float* dy = d_out + r * cols;
  float* dx = d_in + r * cols;
  const float rstd = rstd_in[r];
  float s = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += dy[c] * w[c] * (x[c] * rstd);
  const float mean_gx = block_sum(s) / static_cast<float>(cols);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dx[c] += rstd * (dy[c] * w[c] - (x[c] * rstd) * mean_gx);
  }
}

struct RmsNormWeightGrad {
  const float* d_out;
  const float* in;
  const float* rstd;
  std::int64_t cols;
  __device__ float operator()(std::int64_t r, std::int64_t c, int) const {
    return d_out[r * cols + c] * (in[r * cols + c] * rstd[r]);
  }
};

// ---- SwiGLU ----

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(fminf(-x, 88.0f))); }

__global__ void swiglu_forward_kernel(float* out, const float* in, std::int64_t rows,
                                      std::int64_t F) {
  const std::int64_t n = rows * F;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / F, c = i - r * F;
    const float g = in[r * 2 * F + c], u = in[r * 2 * F + F + c];
    out[i] = g * sigmoid(g) * u;
  }
}

__global__ void swiglu_backward_kernel(float* d_in, const float* d_out, const float* in,
                                       std::int64_t rows, std::int64_t F) {
  const std::int64_t n = rows * F;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / F, c = i - r * F;
    const float g = in[r * 2 * F + c], u = in[r * 2 * F + F + c];
    const float s = sigmoid(g), silu = g * s;
    d_in[r * 2 * F + c] = d_out[i] * u * (s + silu * (1.0f - s));
    d_in[r * 2 * F + F + c] = d_out[i] * silu;
  }
}

// ---- vocab-parallel cross-entropy ----

__global__ void vp_max_kernel(float* row_max, const float* logits, std::int64_t Vl,
                              std::int64_t real) {
  const std::int64_t r = blockIdx.x;
  const float* l = logits + r * Vl;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < real; j += blockDim.x) m = fmaxf(m, l[j]);
  m = block_max(m);
  if (threadIdx.x == 0) row_max[r] = m;
}

__global__ void vp_sum_target_kernel(float* sum_exp, float* target_logit, const float* logits,
                                     const float* row_max, const std::int32_t* targets,
                                     std::int64_t Vl, std::int64_t real, std::int64_t start) {
  const std::int64_t r = blockIdx.x;
  const float* l = logits + r * Vl;
  const float m = row_max[r];
  double s = 0.0;
  for (std::int64_t j = threadIdx.x; j < real; j += blockDim.x) {
    s += exp(static_cast<double>(l[j] - m));
  }
  s = block_sum(s);
  if (threadIdx.x == 0) {
    sum_exp[r] = static_cast<float>(s);
    const std::int64_t t = static_cast<std::int64_t>(targets[r]) - start;
    target_logit[r] = (targets[r] >= 0 && t >= 0 && t < real) ? l[t] : 0.0f;
  }
}

__global__ void vp_loss_kernel(float* losses, float* d_logits, const float* logits,
                               const float* row_max, const float* sum_exp,
                               const float* target_logit, const std::int32_t* targets,
                               float d_scale, std::int64_t Vl, std::int64_t real,
                               std::int64_t start) {
  const std::int64_t r = blockIdx.x;
  const bool ignored = targets[r] < 0;
  const float m = row_max[r];
  if (threadIdx.x == 0) losses[r] = ignored ? 0.0f : logf(sum_exp[r]) + m - target_logit[r];
  if (d_logits == nullptr) return;
  const float* l = logits + r * Vl;
  float* d = d_logits + r * Vl;  // may alias l: each thread reads l[j] before writing d[j]
  const float inv_sum = 1.0f / sum_exp[r];
  for (std::int64_t j = threadIdx.x; j < Vl; j += blockDim.x) {
    if (ignored || j >= real) {
      d[j] = 0.0f;
      continue;
    }
    const float p = expf(l[j] - m) * inv_sum;
    d[j] = d_scale * (p - (start + j == targets[r] ? 1.0f : 0.0f));
  }
}

// The loss the log shows (and the tests compare): the counted tokens' losses added in row order in
// double, as the CPU does, then written to (or added to) *out; one thread (a few thousand rows per
// micro-batch).
__global__ void token_loss_sum_kernel(TokenLossSum* out, const float* losses,
                                      const std::int32_t* targets, std::int64_t rows,
                                      int accumulate) {
  if (threadIdx.x != 0) return;
  double sum = 0.0;
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    if (targets[i] < 0) continue;
    sum += losses[i];
    ++count;
  }
  if (accumulate != 0) {
    out->sum += sum;
    out->count += count;
  } else {
    out->sum = sum;
    out->count = count;
  }
}

// ---- dropout and initialisation ----

__global__ void hidden_dropout_kernel(float* out, const float* in, std::int64_t rows,
                                      std::int64_t cols, std::int64_t first_row, float p,
                                      float scale, std::uint64_t seed, std::uint64_t stream) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto index = static_cast<std::uint64_t>(first_row * cols + i);
    out[i] = dropout_keep(seed, stream, index, p) ? in[i] * scale : 0.0f;
  }
}

__global__ void init_normal_kernel(float* out, std::int64_t begin, std::int64_t end,
                                   std::uint64_t seed, std::uint64_t stream, double stddev,
                                   std::int64_t base, std::int64_t local_cols,
                                   std::int64_t global_cols, std::int64_t col_offset) {
  for (std::int64_t i = begin + blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < end; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t g = base + (i / local_cols) * global_cols + col_offset + i % local_cols;
    const Philox4 r =
        philox4x32_10(static_cast<std::uint32_t>(g),
                      static_cast<std::uint32_t>(static_cast<std::uint64_t>(g) >> 32),
                      static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32),
                      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
    // core::philox_normal: Box-Muller over two (0, 1] uniforms of 53 bits each.
    const std::uint64_t b1 = (static_cast<std::uint64_t>(r.x[0]) << 21) ^ (r.x[1] >> 11);
    const std::uint64_t b2 = (static_cast<std::uint64_t>(r.x[2]) << 21) ^ (r.x[3] >> 11);
    const double u1 = (static_cast<double>(b1 & ((1ull << 53) - 1)) + 1.0) * 0x1.0p-53;
    const double u2 = (static_cast<double>(b2 & ((1ull << 53) - 1)) + 1.0) * 0x1.0p-53;
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    out[i - begin] = static_cast<float>(stddev * sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2));
  }
}

}  // namespace

void rmsnorm_forward(const ExecContext& ctx, const RmsNormForwardArgs& args) {
  check_rows("rmsnorm_forward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.out && args.rstd && args.in && args.weight,
                "rmsnorm_forward: out, rstd, in and weight must be non-null");
  TRIDENT_CHECK(args.eps >= 0.0f, "rmsnorm_forward: eps must be >= 0, got ", args.eps);
  rmsnorm_forward_kernel<<<static_cast<unsigned>(args.rows), kRowThreads, 0, stream_of(ctx)>>>(
      args.out, args.rstd, args.in, args.weight, args.cols, args.eps);
  TRIDENT_CUDA_LAUNCH_CHECK("rmsnorm_forward");
}

void rmsnorm_backward(const ExecContext& ctx, const RmsNormBackwardArgs& args) {
  check_rows("rmsnorm_backward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.d_in && args.d_weight && args.d_out && args.in && args.weight && args.rstd,
                "rmsnorm_backward: every pointer must be non-null");
  cudaStream_t s = stream_of(ctx);
  // The weight's sum first: it reads only d_out, in and rstd, which the row pass does not write.
  column_sums<1>(s, args.d_weight, nullptr,
                 RmsNormWeightGrad{args.d_out, args.in, args.rstd, args.cols}, args.rows,
                 args.cols);
  rmsnorm_backward_rows_kernel<<<static_cast<unsigned>(args.rows), kRowThreads, 0, s>>>(
      args.d_in, args.d_out, args.in, args.weight, args.rstd, args.cols);
  TRIDENT_CUDA_LAUNCH_CHECK("rmsnorm_backward");
}

void swiglu_forward(const ExecContext& ctx, const SwiGluForwardArgs& args) {
  check_rows("swiglu_forward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.out && args.in, "swiglu_forward: pointers must be non-null");
  swiglu_forward_kernel<<<grid_for(args.rows * args.cols, 256), 256, 0, stream_of(ctx)>>>(
      args.out, args.in, args.rows, args.cols);
  TRIDENT_CUDA_LAUNCH_CHECK("swiglu_forward");
}

void swiglu_backward(const ExecContext& ctx, const SwiGluBackwardArgs& args) {
  check_rows("swiglu_backward", args.rows, args.cols);
  if (args.rows == 0) return;
  TRIDENT_CHECK(args.d_in && args.in && args.d_out, "swiglu_backward: pointers must be non-null");
  swiglu_backward_kernel<<<grid_for(args.rows * args.cols, 256), 256, 0, stream_of(ctx)>>>(
      args.d_in, args.d_out, args.in, args.rows, args.cols);
  TRIDENT_CUDA_LAUNCH_CHECK("swiglu_backward");
}

void vocab_parallel_ce_max(const ExecContext& ctx, const VocabParallelCeMaxArgs& a) {
  check_rows("vocab_parallel_ce_max", a.rows, a.shard.vocab_local);
  if (a.rows == 0) return;
  vp_max_kernel<<<static_cast<unsigned>(a.rows), kRowThreads, 0, stream_of(ctx)>>>(
      a.row_max, a.logits, a.shard.vocab_local, a.shard.real());
  TRIDENT_CUDA_LAUNCH_CHECK("vocab_parallel_ce_max");
}

void vocab_parallel_ce_sum_target(const ExecContext& ctx, const VocabParallelCeSumArgs& a) {
  check_rows("vocab_parallel_ce_sum_target", a.rows, a.shard.vocab_local);
  if (a.rows == 0) return;
  vp_sum_target_kernel<<<static_cast<unsigned>(a.rows), kRowThreads, 0, stream_of(ctx)>>>(
      a.sum_exp, a.target_logit, a.logits, a.row_max, a.targets, a.shard.vocab_local,
      a.shard.real(), a.shard.vocab_start);
  TRIDENT_CUDA_LAUNCH_CHECK("vocab_parallel_ce_sum_target");
}

void vocab_parallel_ce_loss(const ExecContext& ctx, const VocabParallelCeLossArgs& a) {
  check_rows("vocab_parallel_ce_loss", a.rows, a.shard.vocab_local);
  if (a.rows == 0) return;
  cudaStream_t s = stream_of(ctx);
  const std::int64_t vocab = a.shard.vocab;
  defer_check(s, a.targets, a.rows, CheckRule::kBelowBound, vocab,
              [](std::int64_t i, std::int64_t v) {
                TRIDENT_ASSERT(false, "target ", v, " at row ", i, " is outside the vocabulary");
              });
  vp_loss_kernel<<<static_cast<unsigned>(a.rows), kRowThreads, 0, s>>>(
      a.losses, a.d_logits, a.logits, a.row_max, a.sum_exp, a.target_logit, a.targets, a.d_scale,
      a.shard.vocab_local, a.shard.real(), a.shard.vocab_start);
  TRIDENT_CUDA_LAUNCH_CHECK("vocab_parallel_ce_loss");
}

TokenLossSum sum_token_losses(const ExecContext& ctx, const float* losses,
                              const std::int32_t* targets, std::int64_t rows) {
  if (rows <= 0) return {};
  cudaStream_t s = stream_of(ctx);
  StreamScratch sum(sizeof(TokenLossSum), s);
  token_loss_sum_kernel<<<1, 32, 0, s>>>(sum.as<TokenLossSum>(), losses, targets, rows, 0);
  TRIDENT_CUDA_LAUNCH_CHECK("sum_token_losses");
  // One host sync: the sum, with the verdicts of the stream's pending token and target checks.
  return read_back(s, sum.as<TokenLossSum>());
}

void accumulate_token_losses(const ExecContext& ctx, const float* losses,
                             const std::int32_t* targets, std::int64_t rows, TokenLossSum* acc) {
  if (rows <= 0) return;
  TRIDENT_CHECK(acc != nullptr, "accumulate_token_losses: a null accumulator");
  token_loss_sum_kernel<<<1, 32, 0, stream_of(ctx)>>>(acc, losses, targets, rows, 1);
  TRIDENT_CUDA_LAUNCH_CHECK("accumulate_token_losses");
}

void hidden_dropout(const ExecContext& ctx, const HiddenDropoutArgs& a) {
  TRIDENT_CHECK(a.p >= 0.0f && a.p < 1.0f, "hidden_dropout: p must be in [0, 1), got ", a.p);
  if (a.rows <= 0 || a.cols <= 0) return;
  hidden_dropout_kernel<<<grid_for(a.rows * a.cols, 256), 256, 0, stream_of(ctx)>>>(
      a.out, a.in, a.rows, a.cols, a.first_row, a.p, 1.0f / (1.0f - a.p), a.seed, a.stream);
  TRIDENT_CUDA_LAUNCH_CHECK("hidden_dropout");
}

void init_normal(const ExecContext& ctx, const InitNormalArgs& a) {
  if (a.end <= a.begin) return;
  init_normal_kernel<<<grid_for(a.end - a.begin, 256), 256, 0, stream_of(ctx)>>>(
      a.out, a.begin, a.end, a.seed, a.stream, a.stddev, a.base, a.local_cols, a.global_cols,
      a.col_offset);
  TRIDENT_CUDA_LAUNCH_CHECK("init_normal");
}

}  // namespace trident::kernels::cuda
