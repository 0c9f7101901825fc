// The CPU backend's kernel bodies, compiled once per instruction-set variant (see
// kernels/cpu/README.md): every file in kernels/cpu/ is built three times, with
// TRIDENT_CPU_ISA = cpu_x86_64 (-march=x86-64, any x86-64), cpu_avx2 (-march=x86-64-v3: AVX2, FMA)
// and cpu_avx512 (-march=x86-64-v4: AVX-512 F/BW/DQ/VL), each into its own namespace, and
// each variant exports one CpuOps table. The public functions in kernels/<op>.h switch on the
// device and, on the CPU, call cpu_ops(ctx).<op>: the table of the variant ctx.cpu_isa asks for,
// or (kAuto) of the widest variant this processor runs, chosen once at run time.
//
// To add a CPU kernel: declare its body below, add its entry to CpuOps and to cpu/ops_table.cc,
// and call it from the op's dispatch in kernels/<op>.cc.
#pragma once

#include <cstdint>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/document_ids.h"
#include "trident/kernels/dropout.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/init_normal.h"
#include "trident/kernels/kv_cache_attention.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/lion.h"
#include "trident/kernels/overflow.h"
#include "trident/kernels/rmsnorm.h"
#include "trident/kernels/rope.h"
#include "trident/kernels/swiglu.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"

namespace trident::kernels {

using core::ExecContext;

// One instruction-set variant's kernel bodies.
struct CpuOps {
  const char* isa;  // "x86_64", "avx2" or "avx512"
  void (*adamw_update)(const ExecContext&, const AdamWHyper&, const AdamWArgs&);
  void (*lion_update)(const ExecContext&, const LionHyper&, const LionArgs&);
  void (*attention_forward)(const ExecContext&, const AttentionForwardArgs&);
  void (*attention_backward)(const ExecContext&, const AttentionBackwardArgs&);
  void (*convert_f32_to_bf16)(const ExecContext&, core::bf16*, const float*, std::int64_t);
  void (*convert_bf16_to_f32)(const ExecContext&, float*, const core::bf16*, std::int64_t);
  void (*cross_entropy_forward_backward)(const ExecContext&, const CrossEntropyArgs&);
  void (*document_ids)(const ExecContext&, const DocumentIdsArgs&);
  void (*gelu_forward)(const ExecContext&, float*, const float*, std::int64_t);
  void (*gelu_backward)(const ExecContext&, float*, const float*, const float*, std::int64_t);
  void (*add_forward)(const ExecContext&, float*, const float*, const float*, std::int64_t);
  void (*scale_inplace)(const ExecContext&, float*, float, std::int64_t);
  double (*sum_squares)(const ExecContext&, const float*, std::int64_t);
  bool (*all_finite)(const ExecContext&, const float*, std::int64_t);
  void (*embedding_forward)(const ExecContext&, const EmbeddingForwardArgs&);
  void (*embedding_backward)(const ExecContext&, const EmbeddingBackwardArgs&);
  void (*fill)(const ExecContext&, const FillArgs&);
  void (*copy)(const ExecContext&, const CopyArgs&);
  void (*flash_attention_forward)(const ExecContext&, const FlashAttentionForwardArgs&);
  void (*flash_attention_backward)(const ExecContext&, const FlashAttentionBackwardArgs&);
  void (*bias_gelu_forward)(const ExecContext&, const BiasGeluForwardArgs&);
  void (*bias_gelu_backward)(const ExecContext&, const BiasGeluBackwardArgs&);
  void (*residual_layernorm_forward)(const ExecContext&, const ResidualLayerNormForwardArgs&);
  void (*residual_layernorm_backward)(const ExecContext&, const ResidualLayerNormBackwardArgs&);
  void (*layernorm_forward)(const ExecContext&, const LayerNormForwardArgs&);
  void (*layernorm_backward)(const ExecContext&, const LayerNormBackwardArgs&);
  std::int64_t (*overflow_count)(const ExecContext&, const OverflowCountArgs&);
  void (*hidden_dropout)(const ExecContext&, const HiddenDropoutArgs&);
  void (*kv_cache_attention)(const ExecContext&, const KvCacheAttentionArgs&);
  void (*vocab_parallel_ce_max)(const ExecContext&, const VocabParallelCeMaxArgs&);
  void (*vocab_parallel_ce_sum_target)(const ExecContext&, const VocabParallelCeSumArgs&);
  void (*vocab_parallel_ce_loss)(const ExecContext&, const VocabParallelCeLossArgs&);
  TokenLossSum (*sum_token_losses)(const ExecContext&, const float*, const std::int32_t*,
                                   std::int64_t);
  void (*init_normal)(const ExecContext&, const InitNormalArgs&);
  void (*rmsnorm_forward)(const ExecContext&, const RmsNormForwardArgs&);
  void (*rmsnorm_backward)(const ExecContext&, const RmsNormBackwardArgs&);
  void (*rope_qkv_forward)(const ExecContext&, const RopeQkvForwardArgs&);
  void (*rope_qkv_backward)(const ExecContext&, const RopeQkvBackwardArgs&);
  void (*swiglu_forward)(const ExecContext&, const SwiGluForwardArgs&);
  void (*swiglu_backward)(const ExecContext&, const SwiGluBackwardArgs&);
};

namespace cpu_x86_64 {
extern const CpuOps kOps;
}
namespace cpu_avx2 {
extern const CpuOps kOps;
}
namespace cpu_avx512 {
extern const CpuOps kOps;
}

// True when this processor can run the variant (kAuto: always).
bool cpu_supports(core::CpuIsa isa);
// True when this build compiled the variant (CMake's TRIDENT_CPU_ISAS: every variant by default,
// only x86_64 in the sanitizer build); cpu_isas_built() lists them ("x86_64,avx2,avx512").
bool cpu_built(core::CpuIsa isa);
const char* cpu_isas_built();
// The widest variant this build has and this processor runs (decided once, from cpuid).
core::CpuIsa best_cpu_isa();
const char* cpu_isa_name(core::CpuIsa isa);
// The table for ctx.cpu_isa (kAuto: best_cpu_isa()). Throws core::InvalidArgument naming the
// missing instructions when ctx asks for a variant this processor cannot run.
const CpuOps& cpu_ops(const ExecContext& ctx);

}  // namespace trident::kernels

#ifdef TRIDENT_CPU_ISA
// The bodies of the variant being compiled (only the kernels/cpu/ files see these).
namespace trident::kernels::TRIDENT_CPU_ISA {

void adamw_update(const ExecContext& ctx, const AdamWHyper& hp, const AdamWArgs& args);
void lion_update(const ExecContext& ctx, const LionHyper& hp, const LionArgs& args);
void attention_forward(const ExecContext& ctx, const AttentionForwardArgs& args);
void attention_backward(const ExecContext& ctx, const AttentionBackwardArgs& args);
void convert_f32_to_bf16(const ExecContext& ctx, core::bf16* dst, const float* src, std::int64_t n);
void convert_bf16_to_f32(const ExecContext& ctx, float* dst, const core::bf16* src, std::int64_t n);
void cross_entropy_forward_backward(const ExecContext& ctx, const CrossEntropyArgs& args);
void document_ids(const ExecContext& ctx, const DocumentIdsArgs& args);
void gelu_forward(const ExecContext& ctx, float* out, const float* in, std::int64_t n);
void gelu_backward(const ExecContext& ctx, float* d_in, const float* d_out, const float* in,
                   std::int64_t n);
void add_forward(const ExecContext& ctx, float* out, const float* a, const float* b,
                 std::int64_t n);
void scale_inplace(const ExecContext& ctx, float* x, float s, std::int64_t n);
double sum_squares(const ExecContext& ctx, const float* x, std::int64_t n);
bool all_finite(const ExecContext& ctx, const float* x, std::int64_t n);
void embedding_forward(const ExecContext& ctx, const EmbeddingForwardArgs& args);
void embedding_backward(const ExecContext& ctx, const EmbeddingBackwardArgs& args);
void fill(const ExecContext& ctx, const FillArgs& args);
void copy(const ExecContext& ctx, const CopyArgs& args);
void flash_attention_forward(const ExecContext& ctx, const FlashAttentionForwardArgs& args);
void flash_attention_backward(const ExecContext& ctx, const FlashAttentionBackwardArgs& args);
void bias_gelu_forward(const ExecContext& ctx, const BiasGeluForwardArgs& args);
void bias_gelu_backward(const ExecContext& ctx, const BiasGeluBackwardArgs& args);
void residual_layernorm_forward(const ExecContext& ctx, const ResidualLayerNormForwardArgs& args);
void residual_layernorm_backward(const ExecContext& ctx, const ResidualLayerNormBackwardArgs& args);
void layernorm_forward(const ExecContext& ctx, const LayerNormForwardArgs& args);
void layernorm_backward(const ExecContext& ctx, const LayerNormBackwardArgs& args);
std::int64_t overflow_count(const ExecContext& ctx, const OverflowCountArgs& args);

void hidden_dropout(const ExecContext& ctx, const HiddenDropoutArgs& args);
void kv_cache_attention(const ExecContext& ctx, const KvCacheAttentionArgs& args);
void vocab_parallel_ce_max(const ExecContext& ctx, const VocabParallelCeMaxArgs& args);
void vocab_parallel_ce_sum_target(const ExecContext& ctx, const VocabParallelCeSumArgs& args);
void vocab_parallel_ce_loss(const ExecContext& ctx, const VocabParallelCeLossArgs& args);
TokenLossSum sum_token_losses(const ExecContext& ctx, const float* losses,
                              const std::int32_t* targets, std::int64_t rows);
void init_normal(const ExecContext& ctx, const InitNormalArgs& args);
void rmsnorm_forward(const ExecContext& ctx, const RmsNormForwardArgs& args);
void rmsnorm_backward(const ExecContext& ctx, const RmsNormBackwardArgs& args);
void rope_qkv_forward(const ExecContext& ctx, const RopeQkvForwardArgs& args);
void rope_qkv_backward(const ExecContext& ctx, const RopeQkvBackwardArgs& args);
void swiglu_forward(const ExecContext& ctx, const SwiGluForwardArgs& args);
void swiglu_backward(const ExecContext& ctx, const SwiGluBackwardArgs& args);
}  // namespace trident::kernels::TRIDENT_CPU_ISA
#endif
