#include "trident/kernels/view_check.h"

#include "trident/core/error.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/device.h"
#endif

namespace trident::kernels::detail {

void check_view(const char* op, const char* name, const core::TensorView& v, core::DType dtype,
                const core::Shape& shape, const core::ExecContext& ctx, const char* why) {
  // A view of no elements needs no memory (a zero-length buffer may have no address).
  TRIDENT_CHECK(!v.empty() || shape.numel() == 0, op, ": view `", name, "` is empty; it must hold ",
                core::to_string(shape), " ", core::dtype_name(dtype));
  check_optional_view(op, name, v, dtype, shape, ctx, why);
}

void check_optional_view(const char* op, const char* name, const core::TensorView& v,
                         core::DType dtype, const core::Shape& shape, const core::ExecContext& ctx,
                         const char* why) {
  if (v.empty()) return;
  TRIDENT_CHECK(v.dtype == dtype, op, ": view `", name, "` holds ", core::dtype_name(v.dtype),
                ", the op needs ", core::dtype_name(dtype), why);
  TRIDENT_CHECK(v.shape == shape, op, ": view `", name, "` has shape ", core::to_string(v.shape),
                ", the op needs ", core::to_string(shape));
  TRIDENT_CHECK(v.device == ctx.device, op, ": view `", name,
                "` is on another device than the execution context (view: ",
                v.device.kind == core::DeviceKind::kCuda ? "cuda" : "cpu", ":", v.device.index,
                ", context: ", ctx.device.kind == core::DeviceKind::kCuda ? "cuda" : "cpu", ":",
                ctx.device.index, ")");
#ifdef TRIDENT_HAVE_CUDA
  // A view's device tag is what its maker says; its memory is what cudaMalloc gave. A host buffer
  // in a CUDA view is an illegal address on a GPU (or, with HMM, PCIe traffic): named here. A view
  // of no elements touches no memory, and its address may be one past the end of an allocation
  // (a ZeRO rank's empty piece of a range), which CUDA knows as nobody's.
  if (ctx.device.kind == core::DeviceKind::kCuda && cuda::pointer_checks_enabled() &&
      v.numel() > 0) {
    const std::string problem = cuda::device_memory_problem(v.data, ctx.device.index);
    TRIDENT_CHECK(problem.empty(), op, ": view `", name, "` is ", problem,
                  ": copy it to the device (or allocate it there) first");
  }
#endif
}

void check_views(const char* op, const core::ExecContext& ctx, core::DType dtype,
                 const core::Shape& shape, std::initializer_list<NamedView> views) {
  for (const NamedView& v : views) check_view(op, v.name, v.view, dtype, shape, ctx);
}

void check_optional_views(const char* op, const core::ExecContext& ctx, core::DType dtype,
                          const core::Shape& shape, std::initializer_list<NamedView> views) {
  for (const NamedView& v : views) check_optional_view(op, v.name, v.view, dtype, shape, ctx);
}

void check_rank(const char* op, const char* name, const core::TensorView& v, int rank) {
  TRIDENT_CHECK(!v.empty(), op, ": view `", name, "` is empty; the op reads its sizes from it");
  TRIDENT_CHECK(v.shape.rank == rank, op, ": view `", name, "` must be ", rank, "-D, got shape ",
                core::to_string(v.shape));
}

RowsCols check_f32_and_bf16_outputs(const char* op, const core::ExecContext& ctx, NamedView in,
                                    NamedView f32_out, NamedView bf16_out) {
  check_rank(op, in.name, in.view, 2);
  const RowsCols s{in.view.shape[0], in.view.shape[1]};
  check_view(op, in.name, in.view, core::DType::kF32, in.view.shape, ctx);
  TRIDENT_CHECK(!f32_out.view.empty() || !bf16_out.view.empty(), op, ": views `", f32_out.name,
                "` and `", bf16_out.name, "` are both empty; give at least one");
  check_optional_view(op, f32_out.name, f32_out.view, core::DType::kF32, in.view.shape, ctx);
  check_optional_view(op, bf16_out.name, bf16_out.view, core::DType::kBF16, in.view.shape, ctx);
  return s;
}

}  // namespace trident::kernels::detail
