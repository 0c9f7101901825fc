// The raw-pointer entry points of the ops: each takes the op's Args struct (or pointers and a
// length), the backend contract the CPU bodies (kernels/cpu), the CUDA bodies (kernels/cuda) and
// the references (kernels/ref) implement, and holds the op's one `switch` on ctx.device
// (kernels/<op>.cc). The contracts (shapes, `=` or `+=`, aliasing) are the Args structs' comments
// in kernels/<op>.h.
//
// INTERNAL TO kernels/. Callers above kernels/ use the typed views of kernels/<op>.h, which check
// every view (kernels/view_check.h) and then call these. Only src/trident/kernels/ and the kernel
// tests (tests/kernels/, which test the backend contract itself: the bodies' argument checks, the
// CUDA bodies against the CPU's) include this header; scripts/check-module-order fails when any
// other file does.
#pragma once

#include <cstdint>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/cross_entropy.h"
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

namespace trident::kernels {

// adamw.h
void adamw_update(const core::ExecContext& ctx, const AdamWHyper& hp, const AdamWArgs& args);

// lion.h
void lion_update(const core::ExecContext& ctx, const LionHyper& hp, const LionArgs& args);

// attention.h (the backward needs no document ids: the masked probabilities are 0)
void attention_forward(const core::ExecContext& ctx, const AttentionForwardArgs& args);
void attention_backward(const core::ExecContext& ctx, const AttentionBackwardArgs& args);

// bf16.h: dst = the bf16 rounding of src / src widened; n elements, dst and src disjoint.
void convert_f32_to_bf16(const core::ExecContext& ctx, core::bf16* dst, const float* src,
                         std::int64_t n);
void convert_bf16_to_f32(const core::ExecContext& ctx, float* dst, const core::bf16* src,
                         std::int64_t n);

// cross_entropy.h
void cross_entropy_forward_backward(const core::ExecContext& ctx, const CrossEntropyArgs& args);

// dropout.h
void hidden_dropout(const core::ExecContext& ctx, const HiddenDropoutArgs& args);

// elementwise.h, over n elements: out may alias in (gelu), d_in may alias d_out, out may alias a
// or b (add).
void gelu_forward(const core::ExecContext& ctx, float* out, const float* in, std::int64_t n);
void gelu_backward(const core::ExecContext& ctx, float* d_in, const float* d_out, const float* in,
                   std::int64_t n);
void add_forward(const core::ExecContext& ctx, float* out, const float* a, const float* b,
                 std::int64_t n);
void scale_inplace(const core::ExecContext& ctx, float* x, float s, std::int64_t n);
double sum_squares(const core::ExecContext& ctx, const float* x, std::int64_t n);
bool all_finite(const core::ExecContext& ctx, const float* x, std::int64_t n);

// embedding.h
void embedding_forward(const core::ExecContext& ctx, const EmbeddingForwardArgs& args);
void embedding_backward(const core::ExecContext& ctx, const EmbeddingBackwardArgs& args);

// fill.h
void fill(const core::ExecContext& ctx, const FillArgs& args);
void copy(const core::ExecContext& ctx, const CopyArgs& args);

// flash_attention.h
void flash_attention_forward(const core::ExecContext& ctx, const FlashAttentionForwardArgs& args);
void flash_attention_backward(const core::ExecContext& ctx, const FlashAttentionBackwardArgs& args);

// fused_bias_gelu.h
void bias_gelu_forward(const core::ExecContext& ctx, const BiasGeluForwardArgs& args);
void bias_gelu_backward(const core::ExecContext& ctx, const BiasGeluBackwardArgs& args);

// fused_residual_layernorm.h
void residual_layernorm_forward(const core::ExecContext& ctx,
                                const ResidualLayerNormForwardArgs& args);
void residual_layernorm_backward(const core::ExecContext& ctx,
                                 const ResidualLayerNormBackwardArgs& args);

// init_normal.h
void init_normal(const core::ExecContext& ctx, const InitNormalArgs& args);

// kv_cache_attention.h
void kv_cache_attention(const core::ExecContext& ctx, const KvCacheAttentionArgs& args);

// layernorm.h
void layernorm_forward(const core::ExecContext& ctx, const LayerNormForwardArgs& args);
void layernorm_backward(const core::ExecContext& ctx, const LayerNormBackwardArgs& args);

// matmul.h, matmul_bf16.h: the linear layer's FP32 and BF16 products (the views: linear.h). gemm
// and gemm_bf16 themselves stay public (strided BLAS-style products, no views form).
void linear_forward(const core::ExecContext& ctx, const LinearForwardArgs& args);
void linear_backward(const core::ExecContext& ctx, const LinearBackwardArgs& args);
void linear_forward_bf16(const core::ExecContext& ctx, const LinearForwardBf16Args& args);
void linear_backward_bf16(const core::ExecContext& ctx, const LinearBackwardBf16Args& args);

// overflow.h
std::int64_t overflow_count(const core::ExecContext& ctx, const OverflowCountArgs& args);

// rmsnorm.h
void rmsnorm_forward(const core::ExecContext& ctx, const RmsNormForwardArgs& args);
void rmsnorm_backward(const core::ExecContext& ctx, const RmsNormBackwardArgs& args);

// rope.h
void rope_qkv_forward(const core::ExecContext& ctx, const RopeQkvForwardArgs& args);
void rope_qkv_backward(const core::ExecContext& ctx, const RopeQkvBackwardArgs& args);

// swiglu.h
void swiglu_forward(const core::ExecContext& ctx, const SwiGluForwardArgs& args);
void swiglu_backward(const core::ExecContext& ctx, const SwiGluBackwardArgs& args);

// vocab_parallel_cross_entropy.h
void vocab_parallel_ce_max(const core::ExecContext& ctx, const VocabParallelCeMaxArgs& args);
void vocab_parallel_ce_sum_target(const core::ExecContext& ctx, const VocabParallelCeSumArgs& args);
void vocab_parallel_ce_loss(const core::ExecContext& ctx, const VocabParallelCeLossArgs& args);
TokenLossSum sum_token_losses(const core::ExecContext& ctx, const float* losses,
                              const std::int32_t* targets, std::int64_t rows);

}  // namespace trident::kernels
