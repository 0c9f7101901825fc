// The sizes the attention ops' typed views (attention.h, flash_attention.h) read from their qkv
// view, and the shapes of the other views they imply. Internal to kernels/.
#pragma once

#include <cstdint>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"
#include "trident/kernels/view_check.h"

namespace trident::kernels::detail {

struct AttentionSizes {
  std::int64_t batch = 0, seq_len = 0, num_heads = 0, head_dim = 0;
  core::Shape out() const { return {batch, seq_len, num_heads * head_dim}; }
  core::Shape probs() const { return {batch, num_heads, seq_len, seq_len}; }
  core::Shape lse() const { return {batch, num_heads, seq_len}; }
  core::Shape tokens() const { return {batch, seq_len}; }
};

// qkv must be a 4-D f32 view (B, T, NH, 3 * HS) on ctx.device.
inline AttentionSizes attention_sizes(const char* op, const core::TensorView& qkv,
                                      const core::ExecContext& ctx) {
  check_rank(op, "qkv", qkv, 4);
  TRIDENT_CHECK(qkv.shape[3] % 3 == 0, op, ": view `qkv` has shape ", core::to_string(qkv.shape),
                "; its last dimension must be 3 * head_dim (each head's q, k and v)");
  const AttentionSizes s{qkv.shape[0], qkv.shape[1], qkv.shape[2], qkv.shape[3] / 3};
  check_view(op, "qkv", qkv, core::DType::kF32, qkv.shape, ctx);
  return s;
}

}  // namespace trident::kernels::detail
