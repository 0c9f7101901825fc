// The CUDA backend's kernels (kernels/cuda/*.cu, built when TRIDENT_CUDA is on). Each function has
// the contract of the public op of the same name in kernels/<op>.h, with every pointer in device
// memory of ctx.device and the work queued on ctx.stream (a cudaStream_t; null: the legacy default
// stream). The public ops' dispatch (kernels/<op>.cc) calls these for core::DeviceKind::kCuda.
//
// Results that a host caller reads (sum_squares, all_finite, sum_token_losses) synchronize the
// stream, once per call; the checks of device-resident inputs (token ids, targets) are reported at
// that read-back or at synchronize() (cuda_util.cuh); everything else is asynchronous.
//
// This header needs no CUDA header, so that the dispatch files stay plain C++.
#pragma once

#include <cstdint>

#include "trident/kernels/grouped_linear.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/kernels/op_types.h"

namespace trident::kernels::cuda {

using core::ExecContext;

// The bodies of every op of the list (kernels/ops.inc). What they add to their headers' contracts:
// - sum_squares is bitwise reproducible: a fixed grid of contiguous ranges, each summed in double,
//   added in order; convert_* are bit for bit the CPU's rounding (core/bf16.h).
// - layernorm, fused_residual_layernorm, fused_bias_gelu, rmsnorm: the parameter-gradient sums use
//   the CPU's chunks of 64 rows (double partials added in chunk order). The fused backward passes
//   keep their headers' contract: args.scratch (device memory of the size the CPU asks for, 8-byte
//   aligned) holds the partials, and too little or misaligned scratch is refused;
//   layernorm_backward (no scratch argument) takes its partials from the stream pool.
// - embedding_backward walks the rows in order per column, as the CPU does (deterministic, the
//   CPU's bits); negative token ids are reported (InvalidArgument) after a stream sync.
// - flash attention: online softmax, ALiBi, dropout with the CPU's Philox masks
//   (kernels/cuda/philox.h), as hidden_dropout and init_normal draw.
// - vocab_parallel_cross_entropy: targets checked on the device, the token-loss sum in row order on
//   the host after a stream sync, as the CPU.
// - rope: angles in double as the CPU; kv_cache_attention: scratch is device memory, one block per
//   head, the new rows in order.
#define TRIDENT_KERNEL_OP(ret, name, params) \
  ret name(const ExecContext& ctx, TRIDENT_KERNEL_UNPAREN params);
#include "trident/kernels/ops.inc"
#undef TRIDENT_KERNEL_OP

// CUDA-only entry points (no CPU table entry: the CPU's products go through oneDNN, the host sums
// through the single-range op).
// Several ranges, each summed as sum_squares, added in order on the device: one host sync.
double sum_squares_ranges(const ExecContext& ctx, const float* const* xs, const std::int64_t* ns,
                          std::int64_t count);
void accumulate_token_losses(const ExecContext& ctx, const float* losses,
                             const std::int32_t* targets, std::int64_t rows, TokenLossSum* acc);
// matmul.h and matmul_bf16.h through cuBLASLt: FP32 (CUBLAS_COMPUTE_32F, no TF32) and BF16
// operands with FP32 accumulation and output. The cuBLASLt workspace is taken from the stream's
// pool, so the caller's scratch is not used (gemm_bf16_scratch_bytes is 0 on CUDA).
void gemm(const ExecContext& ctx, const GemmArgs& args);
void linear_forward(const ExecContext& ctx, const LinearForwardArgs& args);
void linear_backward(const ExecContext& ctx, const LinearBackwardArgs& args);
void gemm_bf16(const ExecContext& ctx, const GemmBf16Args& args);
void linear_forward_bf16(const ExecContext& ctx, const LinearForwardBf16Args& args);
void linear_backward_bf16(const ExecContext& ctx, const LinearBackwardBf16Args& args);
// grouped_linear.h: one cuBLASLt product per group on the stream (no padding, no scratch).
void grouped_linear_forward(const ExecContext& ctx, const GroupedLinearForwardArgs& args);
void grouped_linear_forward(const ExecContext& ctx, const GroupedLinearForwardBf16Args& args);
void grouped_linear_backward(const ExecContext& ctx, const GroupedLinearBackwardArgs& args);
void grouped_linear_backward(const ExecContext& ctx, const GroupedLinearBackwardBf16Args& args);

}  // namespace trident::kernels::cuda
