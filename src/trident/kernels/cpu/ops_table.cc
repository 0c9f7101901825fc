// This variant's CpuOps table (see cpu_ops.h).
#include "trident/kernels/cpu/cpu_ops.h"

#define TRIDENT_STRINGIFY_(x) #x
#define TRIDENT_STRINGIFY(x) TRIDENT_STRINGIFY_(x)

namespace trident::kernels::TRIDENT_CPU_ISA {

// "cpu_avx2" -> "avx2"
const CpuOps kOps = {
    .isa = TRIDENT_STRINGIFY(TRIDENT_CPU_ISA) + 4,
    .adamw_update = &adamw_update,
    .lion_update = &lion_update,
    .attention_forward = &attention_forward,
    .attention_backward = &attention_backward,
    .convert_f32_to_bf16 = &convert_f32_to_bf16,
    .convert_bf16_to_f32 = &convert_bf16_to_f32,
    .cross_entropy_forward_backward = &cross_entropy_forward_backward,
    .document_ids = &document_ids,
    .gelu_forward = &gelu_forward,
    .gelu_backward = &gelu_backward,
    .add_forward = &add_forward,
    .scale_inplace = &scale_inplace,
    .sum_squares = &sum_squares,
    .all_finite = &all_finite,
    .embedding_forward = &embedding_forward,
    .embedding_backward = &embedding_backward,
    .fill = &fill,
    .copy = &copy,
    .flash_attention_forward = &flash_attention_forward,
    .flash_attention_backward = &flash_attention_backward,
    .bias_gelu_forward = &bias_gelu_forward,
    .bias_gelu_backward = &bias_gelu_backward,
    .residual_layernorm_forward = &residual_layernorm_forward,
    .residual_layernorm_backward = &residual_layernorm_backward,
    .layernorm_forward = &layernorm_forward,
    .layernorm_backward = &layernorm_backward,
    .overflow_count = &overflow_count,
    .hidden_dropout = &hidden_dropout,
    .kv_cache_attention = &kv_cache_attention,
    .vocab_parallel_ce_max = &vocab_parallel_ce_max,
    .vocab_parallel_ce_sum_target = &vocab_parallel_ce_sum_target,
    .vocab_parallel_ce_loss = &vocab_parallel_ce_loss,
    .sum_token_losses = &sum_token_losses,
    .init_normal = &init_normal,
    .rmsnorm_forward = &rmsnorm_forward,
    .rmsnorm_backward = &rmsnorm_backward,
    .rope_qkv_forward = &rope_qkv_forward,
    .rope_qkv_backward = &rope_qkv_backward,
    .swiglu_forward = &swiglu_forward,
    .swiglu_backward = &swiglu_backward,
};

}  // namespace trident::kernels::TRIDENT_CPU_ISA
