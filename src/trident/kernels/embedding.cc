// Backend dispatch of embedding.h: one switch on the device per op; the CPU bodies are in
// kernels/cpu/embedding.cc (one per instruction-set variant), the reference in kernels/ref/.
#include "trident/kernels/embedding.h"

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

void embedding_forward(const core::ExecContext& ctx, const EmbeddingForwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "embedding_forward", 0,
                                  4.0 * 3 * args.batch * args.seq_len * args.hidden);
  TRIDENT_DISPATCH(embedding_forward, ctx, args);
}

void embedding_backward(const core::ExecContext& ctx, const EmbeddingBackwardArgs& args) {
  const core::profile::Scope prof(core::profile::Kind::kMemory, "embedding_backward", 0,
                                  4.0 * 3 * args.batch * args.seq_len * args.hidden);
  TRIDENT_DISPATCH(embedding_backward, ctx, args);
}

namespace {

struct EmbeddingSizes {
  std::int64_t batch = 0, seq_len = 0, vocab_local = 0, hidden = 0;
};

// Sizes from tokens (B, T) and the word table (vocab_local, C); checks both and the position
// views, whose table must hold the positions `first_position` .. + T - 1 (per-row positions: T).
EmbeddingSizes embedding_sizes(const char* op, const core::ExecContext& ctx,
                               const core::TensorView& tokens, const char* table_name,
                               const core::TensorView& table, const char* wpe_name,
                               const core::TensorView& wpe, const core::TensorView& positions,
                               std::int64_t first_position) {
  detail::check_rank(op, "tokens", tokens, 2);
  detail::check_rank(op, table_name, table, 2);
  const EmbeddingSizes s{tokens.shape[0], tokens.shape[1], table.shape[0], table.shape[1]};
  detail::check_view(op, "tokens", tokens, core::DType::kI32, tokens.shape, ctx);
  detail::check_view(op, table_name, table, core::DType::kF32, table.shape, ctx);
  detail::check_optional_view(op, "positions", positions, core::DType::kI32, tokens.shape, ctx);
  if (!wpe.empty()) {
    detail::check_rank(op, wpe_name, wpe, 2);
    detail::check_view(op, wpe_name, wpe, core::DType::kF32, {wpe.shape[0], s.hidden}, ctx);
    const std::int64_t last = positions.empty() ? first_position + s.seq_len : s.seq_len;
    TRIDENT_CHECK(last <= wpe.shape[0], op, ": view `", wpe_name, "` holds ", wpe.shape[0],
                  " positions, the op reads ", last, " (sequence of ", s.seq_len,
                  " tokens from position ", positions.empty() ? first_position : 0, ")");
  }
  return s;
}

}  // namespace

void embedding(const core::ExecContext& ctx, const EmbeddingViews& v) {
  constexpr const char* op = "embedding";
  const EmbeddingSizes s = embedding_sizes(op, ctx, v.tokens, "wte", v.wte, "wpe", v.wpe,
                                           v.positions, v.position_offset);
  detail::check_view(op, "out", v.out, core::DType::kF32, {s.batch, s.seq_len, s.hidden}, ctx);
  embedding_forward(ctx, {.out = v.out.as<float>(),
                          .tokens = v.tokens.as<std::int32_t>(),
                          .wte = v.wte.as<float>(),
                          .wpe = detail::data_or_null<float>(v.wpe),
                          .batch = s.batch,
                          .seq_len = s.seq_len,
                          .hidden = s.hidden,
                          .vocab_start = v.vocab_start,
                          .vocab_local = s.vocab_local,
                          .position_offset = v.position_offset,
                          .positions = detail::data_or_null<std::int32_t>(v.positions)});
}

void embedding_backward(const core::ExecContext& ctx, const EmbeddingBackwardViews& v) {
  constexpr const char* op = "embedding_backward";
  const EmbeddingSizes s =
      embedding_sizes(op, ctx, v.tokens, "d_wte", v.d_wte, "d_wpe", v.d_wpe, v.positions, 0);
  detail::check_view(op, "d_out", v.d_out, core::DType::kF32, {s.batch, s.seq_len, s.hidden}, ctx);
  embedding_backward(
      ctx, EmbeddingBackwardArgs{.d_wte = v.d_wte.as<float>(),
                                 .d_wpe = detail::data_or_null<float>(v.d_wpe),
                                 .d_out = v.d_out.as<float>(),
                                 .tokens = v.tokens.as<std::int32_t>(),
                                 .batch = s.batch,
                                 .seq_len = s.seq_len,
                                 .hidden = s.hidden,
                                 .vocab_start = v.vocab_start,
                                 .vocab_local = s.vocab_local,
                                 .positions = detail::data_or_null<std::int32_t>(v.positions)});
}

}  // namespace trident::kernels
