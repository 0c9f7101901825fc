// Backend dispatch of dropout.h; the CPU bodies are in kernels/cpu/dropout.cc (one per
// instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/dropout.h"

#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void hidden_dropout(const core::ExecContext& ctx, const HiddenDropoutArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "hidden_dropout");
  TRIDENT_DISPATCH(hidden_dropout, ctx, args);
}

void hidden_dropout(const core::ExecContext& ctx, const HiddenDropoutViews& v) {
  constexpr const char* op = "hidden_dropout";
  detail::check_rank(op, "in", v.in, 2);
  const std::int64_t rows = v.in.shape[0], cols = v.in.shape[1];
  detail::check_view(op, "in", v.in, core::DType::kF32, {rows, cols}, ctx);
  detail::check_view(op, "out", v.out, core::DType::kF32, {rows, cols}, ctx);
  hidden_dropout(ctx, HiddenDropoutArgs{.out = v.out.as<float>(),
                                        .in = v.in.as<float>(),
                                        .rows = rows,
                                        .cols = cols,
                                        .first_row = v.first_row,
                                        .p = v.p,
                                        .seed = v.seed,
                                        .stream = v.stream});
}

}  // namespace trident::kernels
