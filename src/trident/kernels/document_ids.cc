// Backend dispatch of document_ids.h: the views' checks and the device switch (TRIDENT_DISPATCH);
// the CPU body is in kernels/cpu/document_ids.cc (one per instruction-set variant), the CUDA one in
// kernels/cuda/embedding.cu, the reference in kernels/ref/.
#include "trident/kernels/document_ids.h"

#include <limits>

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void document_ids(const core::ExecContext& ctx, const DocumentIdsViews& v) {
  constexpr const char* op = "document_ids";
  detail::check_rank(op, "tokens", v.tokens, 2);
  const std::int64_t B = v.tokens.shape[0], T = v.tokens.shape[1];
  detail::check_views(op, ctx, core::DType::kI32, {B, T},
                      {{"tokens", v.tokens}, {"positions", v.positions}, {"docs", v.docs}});
  TRIDENT_CHECK(v.eod_token >= 0, op, ": eod_token is ", v.eod_token,
                "; documents need the tokenizer's end-of-document token (>= 0)");
  TRIDENT_CHECK(T <= std::numeric_limits<std::int32_t>::max(), op, ": seq_len ", T,
                " does not fit the int32 positions");
  const DocumentIdsArgs args{.positions = v.positions.as<std::int32_t>(),
                             .docs = v.docs.as<std::int32_t>(),
                             .tokens = v.tokens.as<std::int32_t>(),
                             .batch = B,
                             .seq_len = T,
                             .eod_token = v.eod_token};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * 3 * B * T);
  TRIDENT_DISPATCH(document_ids, ctx, args);
}

}  // namespace trident::kernels
