// Reference token + position embedding forward and backward: plain loops, one thread.
#include "trident/kernels/embedding.h"

namespace trident::kernels::ref {

namespace {
// The local wte row of `token`, or -1 when another rank owns it.
std::int64_t local_row(std::int32_t token, std::int64_t vocab_start, std::int64_t vocab_local) {
  const std::int64_t local = token - vocab_start;
  return local >= 0 && local < vocab_local ? local : -1;
}
}  // namespace

// out[b,t,:] = wte[tokens[b,t] - vocab_start, :] (0 if not owned) + wpe[position_offset + t, :]
void embedding_forward(const EmbeddingForwardArgs& a) {
  const std::int64_t C = a.hidden;
  for (std::int64_t b = 0; b < a.batch; ++b) {
    for (std::int64_t t = 0; t < a.seq_len; ++t) {
      const std::int64_t row = b * a.seq_len + t;
      const std::int64_t local = local_row(a.tokens[row], a.vocab_start, a.vocab_local);
      for (std::int64_t c = 0; c < C; ++c) {
        double v = local >= 0 ? a.wte[local * C + c] : 0.0;
        const std::int64_t pos = a.positions ? a.positions[row] : a.position_offset + t;
        if (a.wpe) v += a.wpe[pos * C + c];
        a.out[row * C + c] = static_cast<float>(v);
      }
    }
  }
}

// d_wte[tokens[b,t] - vocab_start, :] += d_out[b,t,:] for owned tokens;
// d_wpe[t, :] += sum_b d_out[b,t,:].
void embedding_backward(const EmbeddingBackwardArgs& a) {
  const std::int64_t C = a.hidden;
  for (std::int64_t row = 0; row < a.batch * a.seq_len; ++row) {
    const std::int64_t local = local_row(a.tokens[row], a.vocab_start, a.vocab_local);
    if (local < 0) continue;
    for (std::int64_t c = 0; c < C; ++c) a.d_wte[local * C + c] += a.d_out[row * C + c];
  }
  if (!a.d_wpe) return;
  if (a.positions) {
    for (std::int64_t row = 0; row < a.batch * a.seq_len; ++row) {
      for (std::int64_t c = 0; c < C; ++c)
        a.d_wpe[a.positions[row] * C + c] += a.d_out[row * C + c];
    }
    return;
  }
  for (std::int64_t t = 0; t < a.seq_len; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (std::int64_t b = 0; b < a.batch; ++b) acc += a.d_out[(b * a.seq_len + t) * C + c];
      a.d_wpe[t * C + c] = static_cast<float>(a.d_wpe[t * C + c] + acc);
    }
  }
}

}  // namespace trident::kernels::ref
