// Backend dispatch of rope.h; CPU bodies in kernels/cpu/rope.cc, reference in kernels/ref/.
#include "trident/kernels/rope.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

namespace {
// The arguments every backend needs, checked once here before the dispatch.
void check(const char* op, const RopeQkvShape& s, const void* a, const void* b) {
  TRIDENT_CHECK(s.rows >= 0 && s.seq_len > 0 && s.position >= 0 && s.groups > 0 &&
                    s.heads_per_group > 0 && s.head_dim > 0 && s.head_dim % 2 == 0,
                op, ": bad shape (rows ", s.rows, ", seq_len ", s.seq_len, ", position ",
                s.position, ", groups ", s.groups, ", heads_per_group ", s.heads_per_group,
                ", head_dim ", s.head_dim, "; head_dim must be even)");
  TRIDENT_CHECK(s.rows == 0 || (a && b), op, ": pointers must be non-null");
}
}  // namespace

void rope_qkv_forward(const core::ExecContext& ctx, const RopeQkvForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rope_qkv_forward");
  check("rope_qkv_forward", args.shape, args.out, args.in);
  TRIDENT_DISPATCH(rope_qkv_forward, ctx, args);
}

void rope_qkv_backward(const core::ExecContext& ctx, const RopeQkvBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "rope_qkv_backward");
  check("rope_qkv_backward", args.shape, args.d_in, args.d_out);
  TRIDENT_DISPATCH(rope_qkv_backward, ctx, args);
}

namespace {

// The raw shape after checking the views: rows from `rows_view`, which has the grouped input's
// columns (in_layout) or the expanded output's.
RopeQkvShape rope_shape_of(const char* op, const core::ExecContext& ctx, const char* name,
                           const core::TensorView& rows_view, bool in_layout,
                           const core::TensorView& inv_freq, const core::TensorView& positions,
                           const RopeQkvGeometry& g) {
  detail::check_rank(op, name, rows_view, 2);
  const std::int64_t rows = rows_view.shape[0];
  detail::check_view(op, name, rows_view, core::DType::kF32,
                     {rows, in_layout ? g.in_cols() : g.out_cols()}, ctx);
  detail::check_optional_view(op, "inv_freq", inv_freq, core::DType::kF32, {g.head_dim / 2}, ctx);
  detail::check_optional_view(op, "positions", positions, core::DType::kI32, {rows}, ctx);
  return {.rows = rows,
          .seq_len = g.seq_len,
          .position = g.position,
          .groups = g.groups,
          .heads_per_group = g.heads_per_group,
          .head_dim = g.head_dim,
          .inv_freq = detail::data_or_null<float>(inv_freq),
          .positions = detail::data_or_null<std::int32_t>(positions)};
}

}  // namespace

void rope_qkv(const core::ExecContext& ctx, const RopeQkvViews& v) {
  constexpr const char* op = "rope_qkv";
  const RopeQkvShape s =
      rope_shape_of(op, ctx, "in", v.in, true, v.inv_freq, v.positions, v.geometry);
  detail::check_view(op, "out", v.out, core::DType::kF32, {s.rows, s.out_cols()}, ctx);
  rope_qkv_forward(ctx, {.out = v.out.as<float>(), .in = v.in.as<float>(), .shape = s});
}

void rope_qkv_backward(const core::ExecContext& ctx, const RopeQkvBackwardViews& v) {
  constexpr const char* op = "rope_qkv_backward";
  const RopeQkvShape s =
      rope_shape_of(op, ctx, "d_out", v.d_out, false, v.inv_freq, v.positions, v.geometry);
  detail::check_view(op, "d_in", v.d_in, core::DType::kF32, {s.rows, s.in_cols()}, ctx);
  rope_qkv_backward(ctx, RopeQkvBackwardArgs{
                             .d_in = v.d_in.as<float>(), .d_out = v.d_out.as<float>(), .shape = s});
}

}  // namespace trident::kernels
