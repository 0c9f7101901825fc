// This variant's CpuOps table (see cpu_ops.h).
#include "trident/kernels/cpu/cpu_ops.h"

#define TRIDENT_STRINGIFY_(x) #x
#define TRIDENT_STRINGIFY(x) TRIDENT_STRINGIFY_(x)

namespace trident::kernels::TRIDENT_CPU_ISA {

// "cpu_avx2" -> "avx2"
const CpuOps kOps = {
    .isa = TRIDENT_STRINGIFY(TRIDENT_CPU_ISA) + 4,
#define TRIDENT_KERNEL_OP(ret, name, params) .name = &name,
#include "trident/kernels/ops.inc"
#undef TRIDENT_KERNEL_OP
};

}  // namespace trident::kernels::TRIDENT_CPU_ISA
