// Backend dispatch of elementwise.h: the views' checks, then one switch on the device per op; the
// CPU bodies are in kernels/cpu/elementwise.cc (one per instruction-set variant), the reference in
// kernels/ref/.
#include "trident/kernels/elementwise.h"

#include <vector>

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void gelu_forward(const core::ExecContext& ctx, float* out, const float* in, std::int64_t n) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "gelu_forward", 0, 4.0 * 2 * n);
  TRIDENT_DISPATCH(gelu_forward, ctx, out, in, n);
}

void gelu_backward(const core::ExecContext& ctx, float* d_in, const float* d_out, const float* in,
                   std::int64_t n) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "gelu_backward", 0, 4.0 * 3 * n);
  TRIDENT_DISPATCH(gelu_backward, ctx, d_in, d_out, in, n);
}

void add_forward(const core::ExecContext& ctx, float* out, const float* a, const float* b,
                 std::int64_t n) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "add_forward", 0, 4.0 * 3 * n);
  TRIDENT_DISPATCH(add_forward, ctx, out, a, b, n);
}

void scale_inplace(const core::ExecContext& ctx, float* x, float s, std::int64_t n) {
  const core::profile::Scope prof(core::profile::Kind::kOptimizer, "scale_inplace", 0, 4.0 * 2 * n);
  TRIDENT_DISPATCH(scale_inplace, ctx, x, s, n);
}

double sum_squares(const core::ExecContext& ctx, const float* x, std::int64_t n) {
  const core::profile::Scope prof(core::profile::Kind::kOptimizer, "sum_squares", 0, 4.0 * n);
  TRIDENT_DISPATCH(sum_squares, ctx, x, n);
}

bool all_finite(const core::ExecContext& ctx, const float* x, std::int64_t n) {
  const core::profile::Scope prof(core::profile::Kind::kOptimizer, "all_finite", 0, 4.0 * n);
  TRIDENT_DISPATCH(all_finite, ctx, x, n);
}

constexpr core::DType kF32 = core::DType::kF32;

void gelu(const core::ExecContext& ctx, const GeluViews& v) {
  detail::check_views("gelu", ctx, kF32, v.out.shape, {{"out", v.out}, {"in", v.in}});
  gelu_forward(ctx, detail::data_or_null<float>(v.out), detail::data_or_null<float>(v.in),
               v.out.numel());
}

void gelu_backward(const core::ExecContext& ctx, const GeluBackwardViews& v) {
  detail::check_views("gelu_backward", ctx, kF32, v.d_in.shape,
                      {{"d_in", v.d_in}, {"d_out", v.d_out}, {"in", v.in}});
  gelu_backward(ctx, detail::data_or_null<float>(v.d_in), detail::data_or_null<float>(v.d_out),
                detail::data_or_null<float>(v.in), v.d_in.numel());
}

void add(const core::ExecContext& ctx, const AddViews& v) {
  detail::check_views("add", ctx, kF32, v.out.shape, {{"out", v.out}, {"a", v.a}, {"b", v.b}});
  add_forward(ctx, detail::data_or_null<float>(v.out), detail::data_or_null<float>(v.a),
              detail::data_or_null<float>(v.b), v.out.numel());
}

void scale(const core::ExecContext& ctx, const ScaleViews& v) {
  detail::check_view("scale", "x", v.x, kF32, v.x.shape, ctx);
  scale_inplace(ctx, detail::data_or_null<float>(v.x), v.s, v.x.numel());
}

double sum_squares(const core::ExecContext& ctx, const SumSquaresViews& v) {
  detail::check_view("sum_squares", "x", v.x, kF32, v.x.shape, ctx);
  return sum_squares(ctx, detail::data_or_null<float>(v.x), v.x.numel());
}

double sum_squares(const core::ExecContext& ctx, std::span<const SumSquaresViews> ranges) {
  std::int64_t n = 0;
  for (const SumSquaresViews& v : ranges) {
    detail::check_view("sum_squares", "x", v.x, kF32, v.x.shape, ctx);
    n += v.x.numel();
  }
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    const core::profile::Scope prof(core::profile::Kind::kOptimizer, "sum_squares", 0, 4.0 * n);
    std::vector<const float*> xs;
    std::vector<std::int64_t> ns;
    for (const SumSquaresViews& v : ranges) {
      xs.push_back(detail::data_or_null<float>(v.x));
      ns.push_back(v.x.numel());
    }
    return cuda::sum_squares_ranges(ctx, xs.data(), ns.data(),
                                    static_cast<std::int64_t>(xs.size()));
#else
    no_cuda_backend("sum_squares");
#endif
  }
  double sum = 0;
  for (const SumSquaresViews& v : ranges)
    sum += sum_squares(ctx, detail::data_or_null<float>(v.x), v.x.numel());
  return sum;
}

bool all_finite(const core::ExecContext& ctx, const AllFiniteViews& v) {
  detail::check_view("all_finite", "x", v.x, kF32, v.x.shape, ctx);
  return all_finite(ctx, detail::data_or_null<float>(v.x), v.x.numel());
}

}  // namespace trident::kernels
