// Reference implementations of the fused and BF16 kernels (fused_bias_gelu.h,
// fused_residual_layernorm.h, matmul_bf16.h), each written as the composition of the unfused
// references of ref.h: what the fused kernel must compute, step by step. Single thread; the
// temporaries they need are allocated here (references are not kernels).
#pragma once

#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/matmul_bf16.h"

namespace trident::kernels::ref {

// t = in + bias (FP32), then gelu_forward(t); out_bf16 = bf16 of the FP32 result.
void bias_gelu_forward(const BiasGeluForwardArgs& args);
// t = in + bias (FP32), gelu_backward(d_in, d_out, t), d_bias += column sums of d_in (double).
void bias_gelu_backward(const BiasGeluBackwardArgs& args);
// resid_out = a + b (FP32), then layernorm_forward(resid_out); out_bf16 = bf16 of the FP32 out.
void residual_layernorm_forward(const ResidualLayerNormForwardArgs& args);
// layernorm_backward with d_in = d_resid (+=); d_resid_bf16 = bf16 of the final d_resid.
void residual_layernorm_backward(const ResidualLayerNormBackwardArgs& args);
// The bf16 operands widened to FP32 (exact), then linear_forward / linear_backward (double sums).
// d_bias uses the FP32 d_out. The scratch fields are ignored.
void linear_forward_bf16(const LinearForwardBf16Args& args);
void linear_backward_bf16(const LinearBackwardBf16Args& args);

}  // namespace trident::kernels::ref
