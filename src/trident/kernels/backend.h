// What every op's dispatch (kernels/<op>.cc) needs: the CPU variant tables and the answer for a
// device this build has no kernels for. The dispatch of an op is one visible switch:
//
//   switch (ctx.device.kind) {
//     case core::DeviceKind::kCpu:  return cpu_ops(ctx).layernorm_forward(ctx, args);
//     case core::DeviceKind::kCuda: no_cuda_backend("layernorm_forward");  // or cuda::...
//   }
#pragma once

#include "trident/kernels/cpu/cpu_ops.h"

namespace trident::kernels {

// Whether this build has the CUDA backend (a real one, or the emulated build of the tests).
bool cuda_built();

// Throws core::Unavailable: `op` was asked to run on a CUDA device, and this build (or this op)
// has no CUDA kernel. Names the op and how to get a CUDA build.
[[noreturn]] void no_cuda_backend(const char* op);
// Throws core::InternalError: ctx.device holds a kind no switch knows (a corrupted context).
[[noreturn]] void unknown_device(const char* op);

}  // namespace trident::kernels
