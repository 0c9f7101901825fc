// Documents inside the samples of a micro-batch (--reset-position-ids, --reset-attention-mask):
// Megatron's get_ltor_masks_and_position_ids. In each sample of T tokens, the document of token t
// is the number of end-of-document tokens before t, and its position is t minus the first position
// of its document (the end-of-document token ends its document, it does not start the next):
//
//   docs[b, t]      = #{ s < t : tokens[b, s] == eod_token }
//   positions[b, t] = t - (1 + the last s < t with tokens[b, s] == eod_token, or 0 if none)
//
// The op takes typed views (checked in its dispatch, kernels/document_ids.cc: every view i32,
// contiguous, on ctx.device, with the shapes below; a mismatch is a core::InvalidArgument naming
// the view). DocumentIdsArgs is the backend contract the CPU body (kernels/cpu), the CUDA body
// (kernels/cuda) and the reference (kernels/ref) implement.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct DocumentIdsViews {
  core::TensorView positions{};  // (B, T) i32, written (=)
  core::TensorView docs{};       // (B, T) i32, written (=)
  core::TensorView tokens{};     // (B, T) i32
  std::int32_t eod_token = -1;   // the tokenizer's end-of-document token (>= 0)
};
void document_ids(const core::ExecContext& ctx, const DocumentIdsViews& v);

// The backend contract: every pointer (batch * seq_len) int32, positions and docs written.
struct DocumentIdsArgs {
  std::int32_t* positions = nullptr;
  std::int32_t* docs = nullptr;
  const std::int32_t* tokens = nullptr;
  std::int64_t batch = 0, seq_len = 0;
  std::int32_t eod_token = -1;
};

namespace ref {
// The specification (ref/document_ids_ref.cc).
void document_ids(const DocumentIdsArgs& args);
}  // namespace ref

}  // namespace trident::kernels
