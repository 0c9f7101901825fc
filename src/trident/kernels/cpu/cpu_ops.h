// The CPU backend's kernel bodies, compiled once per instruction-set variant (see
// kernels/cpu/README.md): every file in kernels/cpu/ is built three times, with
// TRIDENT_CPU_ISA = cpu_x86_64 (-march=x86-64, any x86-64), cpu_avx2 (-march=x86-64-v3: AVX2, FMA)
// and cpu_avx512 (-march=x86-64-v4: AVX-512 F/BW/DQ/VL), each into its own namespace, and
// each variant exports one CpuOps table. The public functions in kernels/<op>.h switch on the
// device and, on the CPU, call cpu_ops(ctx).<op>: the table of the variant ctx.cpu_isa asks for,
// or (kAuto) of the widest variant this processor runs, chosen once at run time.
//
// The table's entries and the bodies' declarations come from the op list (kernels/ops.inc): a CPU
// kernel is its line there, its bodies in kernels/cpu/<op>.cc and TRIDENT_DISPATCH in the op's
// kernels/<op>.cc.
#pragma once

#include <cstdint>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/kernels/op_types.h"

namespace trident::kernels {

using core::ExecContext;

// One instruction-set variant's kernel bodies.
struct CpuOps {
  const char* isa;  // "x86_64", "avx2" or "avx512"
#define TRIDENT_KERNEL_OP(ret, name, params) \
  ret (*name)(const ExecContext& ctx, TRIDENT_KERNEL_UNPAREN params);
#include "trident/kernels/ops.inc"
#undef TRIDENT_KERNEL_OP
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

#define TRIDENT_KERNEL_OP(ret, name, params) \
  ret name(const ExecContext& ctx, TRIDENT_KERNEL_UNPAREN params);
#include "trident/kernels/ops.inc"
#undef TRIDENT_KERNEL_OP

}  // namespace trident::kernels::TRIDENT_CPU_ISA
#endif
