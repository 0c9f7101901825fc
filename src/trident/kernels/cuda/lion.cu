// CUDA fused Lion (lion.h): a grid-stride loop over param, m and grad, bandwidth-bound; the same
// arithmetic as the CPU body (kernels/cpu/lion.cc).
#include <cuda_runtime.h>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;

struct LionScalars {
  float lr, decay, b1, b2, one_minus_b1, one_minus_b2, grad_scale;
};

__global__ void lion_kernel(float* p, float* m, const float* grad, LionScalars s, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i] * s.grad_scale;
    const float c = s.b1 * m[i] + s.one_minus_b1 * g;
    const float sign = static_cast<float>(c > 0.0f) - static_cast<float>(c < 0.0f);
    p[i] = p[i] * s.decay - s.lr * sign;
    m[i] = s.b2 * m[i] + s.one_minus_b2 * g;
  }
}

}  // namespace

void lion_update(const ExecContext& ctx, const LionHyper& hp, const LionArgs& args) {
  if (args.n == 0) return;  // the dispatch (kernels/lion.cc) checked the arguments
  LionScalars s{};
  s.lr = hp.lr;
  s.decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  s.b1 = hp.beta1;
  s.b2 = hp.beta2;
  s.one_minus_b1 = 1.0f - hp.beta1;
  s.one_minus_b2 = 1.0f - hp.beta2;
  s.grad_scale = hp.grad_scale;
  lion_kernel<<<grid_for(args.n, kThreads), kThreads, 0, stream_of(ctx)>>>(args.param, args.m,
                                                                           args.grad, s, args.n);
  TRIDENT_CUDA_LAUNCH_CHECK("lion_update");
}

}  // namespace trident::kernels::cuda
