// Run-time choice of the CPU instruction-set variant, and the error for a missing CUDA backend.
#include "trident/kernels/backend.h"

#include <cpuid.h>

#include <string>

#include "trident/core/error.h"

namespace trident::kernels {

namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool cpuid_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

// Asked once per process and kept: cpu_ops() checks the table it returns on every kernel call,
// and CPUID traps to the hypervisor in a virtual machine (measured: a dispatch that ran CPUID
// each call took 42 % of a small model's training step on a Firecracker VM).
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("bmi2") && cpuid_f16c();
  return yes;
}

bool has_avx512() {
  static const bool yes = has_avx2() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
  return yes;
}

}  // namespace

bool cpu_built(core::CpuIsa isa) {
  switch (isa) {
    case core::CpuIsa::kAuto:
    case core::CpuIsa::kX86_64:
      return true;
    case core::CpuIsa::kAvx2:
#ifdef TRIDENT_CPU_BUILT_AVX2
      return true;
#else
      return false;
#endif
    case core::CpuIsa::kAvx512:
#ifdef TRIDENT_CPU_BUILT_AVX512
      return true;
#else
      return false;
#endif
  }
  return false;
}

const char* cpu_isas_built() { return TRIDENT_CPU_ISAS_BUILT; }

bool cpu_supports(core::CpuIsa isa) {
  switch (isa) {
    case core::CpuIsa::kAuto:
    case core::CpuIsa::kX86_64:
      return true;
    case core::CpuIsa::kAvx2:
      return has_avx2();
    case core::CpuIsa::kAvx512:
      return has_avx512();
  }
  return false;
}

core::CpuIsa best_cpu_isa() {
  static const core::CpuIsa best =
      cpu_built(core::CpuIsa::kAvx512) && has_avx512() ? core::CpuIsa::kAvx512
      : cpu_built(core::CpuIsa::kAvx2) && has_avx2()   ? core::CpuIsa::kAvx2
                                                       : core::CpuIsa::kX86_64;
  return best;
}

const char* cpu_isa_name(core::CpuIsa isa) {
  switch (isa) {
    case core::CpuIsa::kAuto:
      return "auto";
    case core::CpuIsa::kX86_64:
      return "x86_64";
    case core::CpuIsa::kAvx2:
      return "avx2";
    case core::CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

const CpuOps& cpu_ops(const ExecContext& ctx) {
  const core::CpuIsa isa = ctx.cpu_isa == core::CpuIsa::kAuto ? best_cpu_isa() : ctx.cpu_isa;
  if (!cpu_built(isa)) {
    throw core::InvalidArgument(core::str(
        "the CPU kernels for ", cpu_isa_name(isa), " were asked for, but this build has no ",
        cpu_isa_name(isa), " kernels (configured with -DTRIDENT_CPU_ISAS=", cpu_isas_built(),
        "; the sanitizer build has only the baseline); leave the instruction set on auto, or "
        "build every variant (the default)"));
  }
  switch (isa) {
    case core::CpuIsa::kAuto:  // resolved above
    case core::CpuIsa::kX86_64:
      return cpu_x86_64::kOps;
    case core::CpuIsa::kAvx2:
#ifdef TRIDENT_CPU_BUILT_AVX2
      if (!has_avx2()) break;
      return cpu_avx2::kOps;
#else
      break;
#endif
    case core::CpuIsa::kAvx512:
#ifdef TRIDENT_CPU_BUILT_AVX512
      if (!has_avx512()) break;
      return cpu_avx512::kOps;
#else
      break;
#endif
  }
  throw core::InvalidArgument(core::str(
      "the CPU kernels for ", cpu_isa_name(isa), " were asked for, but this processor lacks ",
      isa == core::CpuIsa::kAvx512 ? "AVX-512 (F, BW, DQ, VL, CD)" : "AVX2, FMA, BMI2 or F16C",
      "; it runs the ", cpu_isa_name(best_cpu_isa()),
      " kernels (leave the instruction set on auto, or pick one it has)"));
}

bool cuda_built() {
#ifdef TRIDENT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

void no_cuda_backend(const char* op) {
  throw core::Unavailable(core::str(
      op,
      ": the tensors are on a CUDA device, but this build has no CUDA kernel for it; "
      "configure with the CUDA toolkit installed (nvcc on PATH) to build kernels/cuda/, or "
      "run on the CPU"));
}

void unknown_device(const char* op) {
  throw core::InternalError(core::str(op, ": the execution context names an unknown device kind"));
}

}  // namespace trident::kernels
