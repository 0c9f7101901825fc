// CPU token + position embedding forward and backward, with a vocab-parallel word embedding
// (rows [vocab_start, vocab_start + vocab_local) of wte on this rank). See embedding.h.
#include <algorithm>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

// Token ids are never negative; a negative id is corrupt input (e.g. a bad dataset file).
void check_tokens(const char* op, const std::int32_t* tokens, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    TRIDENT_CHECK(tokens[i] >= 0, op, ": tokens[", i, "] = ", tokens[i],
                  " is negative; token ids must be >= 0 (check the dataset and tokenizer)");
  }
}

void check_sizes(const char* op, std::int64_t batch, std::int64_t seq_len, std::int64_t hidden,
                 std::int64_t vocab_start, std::int64_t vocab_local) {
  TRIDENT_CHECK(batch >= 0 && seq_len >= 0 && hidden > 0, op,
                ": need batch, seq_len >= 0 and hidden > 0, got batch=", batch,
                " seq_len=", seq_len, " hidden=", hidden);
  TRIDENT_CHECK(vocab_start >= 0 && vocab_local > 0, op,
                ": need vocab_start >= 0 and vocab_local > 0, got vocab_start=", vocab_start,
                " vocab_local=", vocab_local);
}

}  // namespace

void embedding_forward(const core::ExecContext& ctx, const EmbeddingForwardArgs& args) {
  check_sizes("embedding_forward", args.batch, args.seq_len, args.hidden, args.vocab_start,
              args.vocab_local);
  const std::int64_t rows = args.batch * args.seq_len, C = args.hidden;
  if (rows == 0) return;
  TRIDENT_CHECK(args.out && args.tokens && args.wte,
                "embedding_forward: out, tokens and wte must be non-null");
  TRIDENT_CHECK(args.position_offset >= 0, "embedding_forward: position_offset must be >= 0, got ",
                args.position_offset);
  check_tokens("embedding_forward", args.tokens, rows);
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t t = row % args.seq_len;
    const std::int64_t local = args.tokens[row] - args.vocab_start;
    const bool owned = local >= 0 && local < args.vocab_local;
    float* o = args.out + row * C;
    const float* e = owned ? args.wte + local * C : nullptr;
    const std::int64_t pos = args.positions ? args.positions[row] : args.position_offset + t;
    const float* p = args.wpe ? args.wpe + pos * C : nullptr;
    if (e && p) {
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else if (e || p) {
      std::copy(e ? e : p, (e ? e : p) + C, o);
    } else {
      std::fill(o, o + C, 0.0f);
    }
  }
}

// Several rows may carry the same token, so d_wte rows are scatter-added. Threads own blocks of
// hidden columns and walk the rows in order: no races, and a result independent of the thread
// count. Positions are 0..T-1 (training never uses a position offset).
void embedding_backward(const core::ExecContext& ctx, const EmbeddingBackwardArgs& args) {
  check_sizes("embedding_backward", args.batch, args.seq_len, args.hidden, args.vocab_start,
              args.vocab_local);
  const std::int64_t rows = args.batch * args.seq_len, C = args.hidden, T = args.seq_len;
  if (rows == 0) return;
  TRIDENT_CHECK(args.d_wte && args.d_out && args.tokens,
                "embedding_backward: d_wte, d_out and tokens must be non-null");
  check_tokens("embedding_backward", args.tokens, rows);
  const int threads = detail::num_threads(ctx);
  const std::int64_t block = detail::column_block_width(C, threads, 1024);
  const std::int64_t num_blocks = (C + block - 1) / block;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t blk = 0; blk < num_blocks; ++blk) {
    const std::int64_t c0 = blk * block;
    const std::int64_t width = std::min(block, C - c0);
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t local = args.tokens[row] - args.vocab_start;
      if (local < 0 || local >= args.vocab_local) continue;
      const float* g = args.d_out + row * C + c0;
      float* w = args.d_wte + local * C + c0;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) w[j] += g[j];
    }
    if (args.d_wpe == nullptr) continue;
    if (args.positions) {  // rows in order, each into its position's row
      for (std::int64_t row = 0; row < rows; ++row) {
        const float* g = args.d_out + row * C + c0;
        float* w = args.d_wpe + static_cast<std::int64_t>(args.positions[row]) * C + c0;
#pragma omp simd
        for (std::int64_t j = 0; j < width; ++j) w[j] += g[j];
      }
      continue;
    }
    for (std::int64_t t = 0; t < T; ++t) {
      float* w = args.d_wpe + t * C + c0;
      for (std::int64_t b = 0; b < args.batch; ++b) {
        const float* g = args.d_out + (b * T + t) * C + c0;
#pragma omp simd
        for (std::int64_t j = 0; j < width; ++j) w[j] += g[j];
      }
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
