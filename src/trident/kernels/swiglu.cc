// Backend dispatch of swiglu.h; CPU bodies in kernels/cpu/swiglu.cc, reference in kernels/ref/.
#include "trident/kernels/swiglu.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void swiglu_forward(const core::ExecContext& ctx, const SwiGluForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "swiglu_forward");
  TRIDENT_DISPATCH(swiglu_forward, ctx, args);
}

void swiglu_backward(const core::ExecContext& ctx, const SwiGluBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "swiglu_backward");
  TRIDENT_DISPATCH(swiglu_backward, ctx, args);
}

void swiglu(const core::ExecContext& ctx, const SwiGluViews& v) {
  constexpr const char* op = "swiglu";
  detail::check_rank(op, "out", v.out, 2);
  const std::int64_t rows = v.out.shape[0], cols = v.out.shape[1];
  detail::check_view(op, "out", v.out, core::DType::kF32, {rows, cols}, ctx);
  detail::check_view(op, "in", v.in, core::DType::kF32, {rows, 2 * cols}, ctx);
  swiglu_forward(ctx,
                 {.out = v.out.as<float>(), .in = v.in.as<float>(), .rows = rows, .cols = cols});
}

void swiglu_backward(const core::ExecContext& ctx, const SwiGluBackwardViews& v) {
  constexpr const char* op = "swiglu_backward";
  detail::check_rank(op, "d_out", v.d_out, 2);
  const std::int64_t rows = v.d_out.shape[0], cols = v.d_out.shape[1];
  detail::check_view(op, "d_out", v.d_out, core::DType::kF32, {rows, cols}, ctx);
  detail::check_views(op, ctx, core::DType::kF32, {rows, 2 * cols},
                      {{"d_in", v.d_in}, {"in", v.in}});
  swiglu_backward(ctx, SwiGluBackwardArgs{.d_in = v.d_in.as<float>(),
                                          .d_out = v.d_out.as<float>(),
                                          .in = v.in.as<float>(),
                                          .rows = rows,
                                          .cols = cols});
}

}  // namespace trident::kernels
