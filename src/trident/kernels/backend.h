// What every op's dispatch (kernels/<op>.cc) needs: the CPU variant tables and the answer for a
// device this build has no kernels for. The dispatch of an op is one TRIDENT_DISPATCH
// (kernels/dispatch.h): the CPU table of ctx's variant, the CUDA body, or no_cuda_backend.
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
