// Array conversions between FP32 and BF16 for mixed precision: FP32 master weights to BF16 model
// weights, FP32 activations and gradients to BF16 matmul operands, and back. Bandwidth-bound
// (6 bytes per element); OpenMP over contiguous ranges, AVX-512 inside each range.
#pragma once

#include <cstdint>

#include "trident/core/bf16.h"
#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

// The conversion over typed views: the dtypes pick the direction, the shapes must be equal, both
// views on ctx.device (checked as kernels/view_check.h says; a mismatch is a
// core::InvalidArgument naming the view). Overwrites out; out and in must not overlap.
//   f32 -> bf16: out[i] = core::bf16::from_float(in[i]), bit for bit: round to nearest, ties to
//     even; NaN stays NaN (sign and top payload bits kept, quiet bit set); infinities, signed
//     zeros and subnormals (rounded, not flushed) as in core/bf16.h. Uses the avx512_bf16
//     instruction vcvtne2ps2bf16 when the processor has it (see
//     detail::has_avx512bf16_convert), else an integer-arithmetic loop; both give the same bits.
//   bf16 -> f32: out[i] = in[i].to_float() (exact: a bf16 is the top half of a float).
// The raw-pointer entry points behind it (convert_f32_to_bf16, convert_bf16_to_f32: pointers and
// a length) are internal to kernels/ (kernels/dispatch.h).
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
