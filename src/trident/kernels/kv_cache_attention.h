// Causal self-attention of new tokens against a KV cache (autoregressive generation): the new
// rows' keys and values are appended to the cache at positions [position, position + rows), then
// each new query attends to every cached position up to its own:
//   s[t] = q . k_t / sqrt(HS) + slope[h] * t      (ALiBi: the key position; null slopes: none)
//   out  = sum_t softmax(s)[t] v_t,               t <= the query's position
// With the whole sequence as new rows at position 0 this is flash_attention.h's forward (no
// dropout) for one sample.
//
// Callers use the typed views (the Views struct at the end, checked as kernels/view_check.h says);
// the raw-pointer Args are the backend contract (docs/architecture.md, "The kernel seam").
#pragma once

#include <cstdint>
#include <span>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct KvCacheAttentionArgs {
  float* out = nullptr;          // (rows, NH * HS)  written (=)
  float* k_cache = nullptr;      // (max_positions, NH * HS)  rows [position, position + rows) (=)
  float* v_cache = nullptr;      // (max_positions, NH * HS)
  const float* qkv = nullptr;    // (rows, NH, 3, HS)  the new tokens
  const float* alibi = nullptr;  // (NH) slopes, or null
  std::int64_t rows = 0;         // new tokens
  std::int64_t position = 0;     // position of the first new token
  std::int64_t max_positions = 0, num_heads = 0, head_dim = 0;
  std::span<float> scratch{};  // kv_cache_attention_scratch_floats(...) floats (scores)
};
[[nodiscard]] std::int64_t kv_cache_attention_scratch_floats(std::int64_t max_positions,
                                                             std::int64_t num_heads);

// kv_cache_attention over typed views: rows, NH and HS from qkv, max_positions from the caches.
struct KvCacheAttentionViews {
  core::TensorView out{};      // (rows, NH * HS)          f32, written (=)
  core::TensorView k_cache{};  // (max_positions, NH * HS) f32, rows [position, + rows) written
  core::TensorView v_cache{};  // (max_positions, NH * HS) f32, likewise
  core::TensorView qkv{};      // (rows, NH, 3 * HS)       f32, the new tokens
  core::TensorView alibi{};    // (NH)                     f32 slopes, or empty
  std::int64_t position = 0;   // position of the first new token
  std::span<float> scratch{};  // kv_cache_attention_scratch_floats(max_positions, NH) floats
};
void kv_cache_attention(const core::ExecContext& ctx, const KvCacheAttentionViews& v);

namespace ref {
// The specification in double (cache writes as the kernel).
void kv_cache_attention(const KvCacheAttentionArgs& args);
}  // namespace ref

}  // namespace trident::kernels
