// Array conversions between FP32 and BF16 for mixed precision: FP32 master weights to BF16 model
// weights, FP32 activations and gradients to BF16 matmul operands, and back. Bandwidth-bound
// (6 bytes per element); OpenMP over contiguous ranges, AVX-512 inside each range.
#pragma once

#include <cstdint>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

// dst[i] = core::bf16::from_float(src[i]) for i in [0, n), bit for bit: round to nearest, ties to
// even; NaN stays NaN (sign and top payload bits kept, quiet bit set); infinities, signed zeros and
// subnormals (rounded, not flushed) as in core/bf16.h. Overwrites dst. dst and src must not
// overlap. Uses the avx512_bf16 instruction vcvtne2ps2bf16 when the processor has it (see
// detail::has_avx512bf16_convert), else an integer-arithmetic loop; both give the same bits.
void convert_f32_to_bf16(const core::ExecContext& ctx, core::bf16* dst, const float* src,
                         std::int64_t n);

// dst[i] = src[i].to_float() for i in [0, n) (exact: a bf16 is the top half of a float).
// Overwrites dst. dst and src must not overlap.
void convert_bf16_to_f32(const core::ExecContext& ctx, float* dst, const core::bf16* src,
                         std::int64_t n);

// The conversion over typed views: the dtypes pick the direction (f32 -> bf16 or bf16 -> f32, as
// the two functions above), the shapes must be equal, both views on ctx.device (checked as
// kernels/view_check.h says; a mismatch is a core::InvalidArgument naming the view).
struct ConvertViews {
  core::TensorView out{};  // bf16 (from f32) or f32 (from bf16), written (=)
  core::TensorView in{};   // f32 or bf16, the same shape, disjoint from out
};
void convert(const core::ExecContext& ctx, const ConvertViews& v);

namespace detail {

// The two single-threaded bodies behind convert_f32_to_bf16, exposed so that the tests can compare
// them bit for bit. Neither checks its arguments.
void f32_to_bf16_portable(core::bf16* dst, const float* src, std::int64_t n);
// vcvtne2ps2bf16 on 32 floats at a time. The instruction flushes subnormal inputs to zero, so
// blocks that contain one are redone with the portable formula. Throws core::Unavailable on a
// processor without avx512_bf16.
void f32_to_bf16_avx512bf16(core::bf16* dst, const float* src, std::int64_t n);
// True when this processor has avx512_bf16 (so convert_f32_to_bf16 uses vcvtne2ps2bf16).
bool has_avx512bf16_convert();

}  // namespace detail

}  // namespace trident::kernels
