// Reference implementations: the specification of every kernel. Plain loops, double
// accumulation, single thread. Tests compare the fast kernels against these.
#pragma once

#include "trident/kernels/adamw.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/document_ids.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/lion.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/overflow.h"
#include "trident/kernels/rmsnorm.h"
#include "trident/kernels/rope.h"
#include "trident/kernels/swiglu.h"

namespace trident::kernels::ref {

void gemm(const GemmArgs& args);
void linear_forward(const LinearForwardArgs& args);
void linear_backward(const LinearBackwardArgs& args);
void layernorm_forward(const LayerNormForwardArgs& args);
void layernorm_backward(const LayerNormBackwardArgs& args);
void gelu_forward(float* out, const float* in, std::int64_t n);
void gelu_backward(float* d_in, const float* d_out, const float* in, std::int64_t n);
void attention_forward(const AttentionForwardArgs& args);
void attention_backward(const AttentionBackwardArgs& args);
void embedding_forward(const EmbeddingForwardArgs& args);
void embedding_backward(const EmbeddingBackwardArgs& args);
void cross_entropy_forward_backward(const CrossEntropyArgs& args);
void document_ids(const DocumentIdsArgs& args);
void adamw_update(const AdamWHyper& hp, const AdamWArgs& args);
void lion_update(const LionHyper& hp, const LionArgs& args);
void fill(const FillArgs& args);
void copy(const CopyArgs& args);
std::int64_t overflow_count(const OverflowCountArgs& args);
void rmsnorm_forward(const RmsNormForwardArgs& args);
void rmsnorm_backward(const RmsNormBackwardArgs& args);
void rope_qkv_forward(const RopeQkvForwardArgs& args);
void rope_qkv_backward(const RopeQkvBackwardArgs& args);
void swiglu_forward(const SwiGluForwardArgs& args);
void swiglu_backward(const SwiGluBackwardArgs& args);

}  // namespace trident::kernels::ref
