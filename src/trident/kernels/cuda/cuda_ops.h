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

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/document_ids.h"
#include "trident/kernels/dropout.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/init_normal.h"
#include "trident/kernels/kv_cache_attention.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/lion.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/kernels/overflow.h"
#include "trident/kernels/rmsnorm.h"
#include "trident/kernels/rope.h"
#include "trident/kernels/swiglu.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"

namespace trident::kernels::cuda {

using core::ExecContext;

// elementwise.h
void gelu_forward(const ExecContext& ctx, float* out, const float* in, std::int64_t n);
void gelu_backward(const ExecContext& ctx, float* d_in, const float* d_out, const float* in,
                   std::int64_t n);
void add_forward(const ExecContext& ctx, float* out, const float* a, const float* b,
                 std::int64_t n);
void scale_inplace(const ExecContext& ctx, float* x, float s, std::int64_t n);
// Bitwise reproducible: a fixed grid of contiguous ranges, each summed in double, added in order.
double sum_squares(const ExecContext& ctx, const float* x, std::int64_t n);
// Several ranges, each summed as above, added in order on the device: one host sync.
double sum_squares_ranges(const ExecContext& ctx, const float* const* xs, const std::int64_t* ns,
                          std::int64_t count);
bool all_finite(const ExecContext& ctx, const float* x, std::int64_t n);

// fill.h and overflow.h
void fill(const ExecContext& ctx, const FillArgs& args);
void copy(const ExecContext& ctx, const CopyArgs& args);
std::int64_t overflow_count(const ExecContext& ctx, const OverflowCountArgs& args);

// bf16.h (bit for bit the CPU's rounding, core/bf16.h)
void convert_f32_to_bf16(const ExecContext& ctx, core::bf16* dst, const float* src, std::int64_t n);
void convert_bf16_to_f32(const ExecContext& ctx, float* dst, const core::bf16* src, std::int64_t n);

// layernorm.h, fused_residual_layernorm.h, fused_bias_gelu.h. The parameter-gradient sums use the
// CPU's chunks of 64 rows (double partials added in chunk order). The fused backward passes keep
// their headers' contract: args.scratch (device memory of the size the CPU asks for, 8-byte
// aligned) holds the partials, and too little or misaligned scratch is refused; layernorm_backward
// (no scratch argument) takes its partials from the stream pool (cudaMallocAsync).
void layernorm_forward(const ExecContext& ctx, const LayerNormForwardArgs& args);
void layernorm_backward(const ExecContext& ctx, const LayerNormBackwardArgs& args);
void residual_layernorm_forward(const ExecContext& ctx, const ResidualLayerNormForwardArgs& args);
void residual_layernorm_backward(const ExecContext& ctx, const ResidualLayerNormBackwardArgs& args);
void bias_gelu_forward(const ExecContext& ctx, const BiasGeluForwardArgs& args);
void bias_gelu_backward(const ExecContext& ctx, const BiasGeluBackwardArgs& args);

// embedding.h: the backward walks the rows in order per column, as the CPU does (deterministic,
// the CPU's bits). Negative token ids are reported (InvalidArgument) after a stream sync.
void document_ids(const ExecContext& ctx, const DocumentIdsArgs& args);
void embedding_forward(const ExecContext& ctx, const EmbeddingForwardArgs& args);
void embedding_backward(const ExecContext& ctx, const EmbeddingBackwardArgs& args);

// cross_entropy.h
void cross_entropy_forward_backward(const ExecContext& ctx, const CrossEntropyArgs& args);

// attention.h (probabilities materialized) and flash_attention.h (online softmax, ALiBi, dropout
// with the CPU's Philox masks: kernels/cuda/philox.h).
void attention_forward(const ExecContext& ctx, const AttentionForwardArgs& args);
void attention_backward(const ExecContext& ctx, const AttentionBackwardArgs& args);
void flash_attention_forward(const ExecContext& ctx, const FlashAttentionForwardArgs& args);
void flash_attention_backward(const ExecContext& ctx, const FlashAttentionBackwardArgs& args);

// adamw.h
void adamw_update(const ExecContext& ctx, const AdamWHyper& hp, const AdamWArgs& args);

// lion.h
void lion_update(const ExecContext& ctx, const LionHyper& hp, const LionArgs& args);

// matmul.h and matmul_bf16.h through cuBLASLt: FP32 (CUBLAS_COMPUTE_32F, no TF32) and BF16
// operands with FP32 accumulation and output. The cuBLASLt workspace is taken from the stream's
// pool, so the caller's scratch is not used (gemm_bf16_scratch_bytes is 0 on CUDA).
void gemm(const ExecContext& ctx, const GemmArgs& args);
void linear_forward(const ExecContext& ctx, const LinearForwardArgs& args);
void linear_backward(const ExecContext& ctx, const LinearBackwardArgs& args);
void gemm_bf16(const ExecContext& ctx, const GemmBf16Args& args);
void linear_forward_bf16(const ExecContext& ctx, const LinearForwardBf16Args& args);
void linear_backward_bf16(const ExecContext& ctx, const LinearBackwardBf16Args& args);

// more_ops.cu: rmsnorm.h and swiglu.h (Llama); vocab_parallel_cross_entropy.h (targets checked on
// the device, the token-loss sum in row order on the host after a stream sync, as the CPU);
// dropout.h and init_normal.h with the CPU's Philox draws (kernels/cuda/philox.h).
void rmsnorm_forward(const ExecContext& ctx, const RmsNormForwardArgs& args);
void rmsnorm_backward(const ExecContext& ctx, const RmsNormBackwardArgs& args);
void swiglu_forward(const ExecContext& ctx, const SwiGluForwardArgs& args);
void swiglu_backward(const ExecContext& ctx, const SwiGluBackwardArgs& args);
void vocab_parallel_ce_max(const ExecContext& ctx, const VocabParallelCeMaxArgs& args);
void vocab_parallel_ce_sum_target(const ExecContext& ctx, const VocabParallelCeSumArgs& args);
void vocab_parallel_ce_loss(const ExecContext& ctx, const VocabParallelCeLossArgs& args);
TokenLossSum sum_token_losses(const ExecContext& ctx, const float* losses,
                              const std::int32_t* targets, std::int64_t rows);
void accumulate_token_losses(const ExecContext& ctx, const float* losses,
                             const std::int32_t* targets, std::int64_t rows, TokenLossSum* acc);
void hidden_dropout(const ExecContext& ctx, const HiddenDropoutArgs& args);
void init_normal(const ExecContext& ctx, const InitNormalArgs& args);

// llama_ops.cu: rope.h (angles in double as the CPU) and kv_cache_attention.h (scratch: device
// memory; one block per head, the new rows in order).
void rope_qkv_forward(const ExecContext& ctx, const RopeQkvForwardArgs& args);
void rope_qkv_backward(const ExecContext& ctx, const RopeQkvBackwardArgs& args);
void kv_cache_attention(const ExecContext& ctx, const KvCacheAttentionArgs& args);

}  // namespace trident::kernels::cuda
