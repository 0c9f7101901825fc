// Backend dispatch of kv_cache_attention.h; the CPU bodies are in kernels/cpu/kv_cache_attention.cc
// (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/kv_cache_attention.h"

#include "trident/kernels/backend.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

std::int64_t kv_cache_attention_scratch_floats(std::int64_t max_positions, std::int64_t num_heads) {
  return max_positions * num_heads;
}

void kv_cache_attention(const core::ExecContext& ctx, const KvCacheAttentionArgs& args) {
  switch (ctx.device.kind) {
    case core::DeviceKind::kCpu:
      return cpu_ops(ctx).kv_cache_attention(ctx, args);
    case core::DeviceKind::kCuda:
#ifdef TRIDENT_HAVE_CUDA
      return cuda::kv_cache_attention(ctx, args);
#else
      no_cuda_backend("kv_cache_attention");
#endif
  }
}

}  // namespace trident::kernels
