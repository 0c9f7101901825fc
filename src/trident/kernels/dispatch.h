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

#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/kernels/op_types.h"

namespace trident::kernels {

// Every op of the list (kernels/ops.inc).
#define TRIDENT_KERNEL_OP(ret, name, params) \
  ret name(const core::ExecContext& ctx, TRIDENT_KERNEL_UNPAREN params);
#include "trident/kernels/ops.inc"
#undef TRIDENT_KERNEL_OP

// matmul.h, matmul_bf16.h: the linear layer's FP32 and BF16 products (the views: linear.h), whose
// CPU bodies are oneDNN's (not in the CPU table). gemm and gemm_bf16 themselves stay public
// (strided BLAS-style products, no views form).
void linear_forward(const core::ExecContext& ctx, const LinearForwardArgs& args);
void linear_backward(const core::ExecContext& ctx, const LinearBackwardArgs& args);
void linear_forward_bf16(const core::ExecContext& ctx, const LinearForwardBf16Args& args);
void linear_backward_bf16(const core::ExecContext& ctx, const LinearBackwardBf16Args& args);

// The device switch of an entry point, once: the CPU table of ctx's variant, or the CUDA body, or
// (a build without CUDA) core::Unavailable naming the op.
//   void layernorm_forward(const core::ExecContext& ctx, const LayerNormForwardArgs& args) {
//     const core::profile::Scope prof(...);
//     TRIDENT_DISPATCH(layernorm_forward, ctx, args);
//   }
#ifdef TRIDENT_HAVE_CUDA
#define TRIDENT_DISPATCH_CUDA_(op, ...) return cuda::op(__VA_ARGS__)
#else
#define TRIDENT_DISPATCH_CUDA_(op, ...) no_cuda_backend(#op)
#endif
#define TRIDENT_DISPATCH(op, ctx, ...)                \
  switch ((ctx).device.kind) {                        \
    case core::DeviceKind::kCpu:                      \
      return cpu_ops(ctx).op((ctx), __VA_ARGS__);     \
    case core::DeviceKind::kCuda:                     \
      TRIDENT_DISPATCH_CUDA_(op, (ctx), __VA_ARGS__); \
  }                                                   \
  unknown_device(#op)

}  // namespace trident::kernels
