// CUDA embedding forward/backward (embedding.h, with per-row position ids too), document ids and
// positions (document_ids.h) and fused softmax cross-entropy (cross_entropy.h). Token ids and
// targets live on the device, so their checks run as kernels and are reported at the stream's next
// read-back with the CPU backend's error (cuda_util.cuh).
#include <cuda_runtime.h>

#include <cfloat>

#include "trident/kernels/cuda/cuda_ops.h"
#include "trident/kernels/cuda/cuda_util.cuh"

namespace trident::kernels::cuda {

namespace {

void check_sizes(const char* op, std::int64_t batch, std::int64_t seq_len, std::int64_t hidden,
                 std::int64_t vocab_start, std::int64_t vocab_local) {
  TRIDENT_CHECK(batch >= 0 && seq_len >= 0 && hidden > 0, op,
                ": need batch, seq_len >= 0 and hidden > 0, got batch=", batch,
                " seq_len=", seq_len, " hidden=", hidden);
  TRIDENT_CHECK(vocab_start >= 0 && vocab_local > 0, op,
                ": need vocab_start >= 0 and vocab_local > 0, got vocab_start=", vocab_start,
                " vocab_local=", vocab_local);
}

// The CPU's error (kernels/cpu/embedding.cc): the first negative id and its value, reported at the
// stream's next read-back (cuda_util.cuh); the kernels skip negative ids meanwhile.
void check_tokens(const char* op, cudaStream_t s, const std::int32_t* tokens, std::int64_t n) {
  defer_check(s, tokens, n, CheckRule::kNonNegative, 0, [op](std::int64_t i, std::int64_t v) {
    TRIDENT_CHECK(false, op, ": tokens[", i, "] = ", v,
                  " is negative; token ids must be >= 0 (check the dataset and tokenizer)");
  });
}

__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens, const float* wte,
                                         const float* wpe, const std::int32_t* positions,
                                         std::int64_t rows, std::int64_t T, std::int64_t C,
                                         std::int64_t vocab_start, std::int64_t vocab_local,
                                         std::int64_t pos0) {
  const std::int64_t n = rows * C;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / C, c = i - row * C;
    const std::int64_t local = tokens[row] - vocab_start;
    float v = 0.0f;
    const bool owned = local >= 0 && local < vocab_local;
    if (owned) v = wte[local * C + c];
    if (wpe) {
      const std::int64_t pos = positions ? positions[row] : pos0 + row % T;
      v = owned ? v + wpe[pos * C + c] : wpe[pos * C + c];
    }
    out[i] = v;
  }
}

// One thread per column walks every row in order (the CPU's order): deterministic, no atomics.
__global__ void embedding_backward_wte_kernel(float* d_wte, const float* d_out,
                                              const std::int32_t* tokens, std::int64_t rows,
                                              std::int64_t C, std::int64_t vocab_start,
                                              std::int64_t vocab_local) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t local = tokens[row] - vocab_start;
    if (local < 0 || local >= vocab_local) continue;
    d_wte[local * C + c] += d_out[row * C + c];
  }
}

__global__ void embedding_backward_wpe_kernel(float* d_wpe, const float* d_out, std::int64_t B,
                                              std::int64_t T, std::int64_t C) {
  const std::int64_t n = T * C;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / C, c = i - t * C;
    float w = d_wpe[i];
    for (std::int64_t b = 0; b < B; ++b) w += d_out[(b * T + t) * C + c];
    d_wpe[i] = w;
  }
}

// Per-row positions (--reset-position-ids): one thread per column walks the rows in order, each
// into its position's row (the CPU's order): deterministic, no atomics.
__global__ void embedding_backward_wpe_positions_kernel(float* d_wpe, const float* d_out,
                                                        const std::int32_t* positions,
                                                        std::int64_t rows, std::int64_t C) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (std::int64_t row = 0; row < rows; ++row) {
    d_wpe[static_cast<std::int64_t>(positions[row]) * C + c] += d_out[row * C + c];
  }
}

// document_ids.h: one thread per sample scans its tokens.
__global__ void document_ids_kernel(std::int32_t* positions, std::int32_t* docs,
                                    const std::int32_t* tokens, std::int64_t B, std::int64_t T,
                                    std::int32_t eod) {
  const std::int64_t b = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (b >= B) return;
  std::int32_t doc = 0, start = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    positions[b * T + t] = static_cast<std::int32_t>(t) - start;
    docs[b * T + t] = doc;
    if (tokens[b * T + t] == eod) {  // the next token starts a document
      ++doc;
      start = static_cast<std::int32_t>(t + 1);
    }
  }
}

constexpr int kCeThreads = 512;

__global__ void cross_entropy_kernel(float* losses, float* d_logits, const float* logits,
                                     const std::int32_t* targets, float d_scale, std::int64_t V,
                                     std::int64_t Vp) {
  const std::int64_t r = blockIdx.x;
  const float* x = logits + r * Vp;
  float* dx = d_logits ? d_logits + r * Vp : nullptr;  // may alias x
  const std::int32_t target = targets[r];
  if (target < 0 || target >= V) {  // ignored; or outside the vocabulary (reported by the check)
    if (threadIdx.x == 0) losses[r] = target < 0 ? 0.0f : __int_as_float(0x7fc00000);
    if (dx)
      for (std::int64_t c = threadIdx.x; c < Vp; c += blockDim.x) dx[c] = 0.0f;
    return;
  }
  float m = -FLT_MAX;
  for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, x[c]);
  const float row_max = block_max(m);
  double sum = 0.0;
  for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) sum += expf(x[c] - row_max);
  sum = block_sum(sum);
  const float x_target = x[target];
  __syncthreads();  // every thread has read x[target] before dx (maybe x) is written
  if (threadIdx.x == 0) {
    losses[r] = static_cast<float>(static_cast<double>(row_max) + log(sum) - x_target);
  }
  if (!dx) return;
  const float coef = static_cast<float>(d_scale / sum);
  for (std::int64_t c = threadIdx.x; c < Vp; c += blockDim.x) {
    dx[c] = c < V ? expf(x[c] - row_max) * coef : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x == 0) dx[target] -= d_scale;
}

}  // namespace

void embedding_forward(const ExecContext& ctx, const EmbeddingForwardArgs& args) {
  check_sizes("embedding_forward", args.batch, args.seq_len, args.hidden, args.vocab_start,
              args.vocab_local);
  const std::int64_t rows = args.batch * args.seq_len, C = args.hidden;
  if (rows == 0) return;
  TRIDENT_CHECK(args.out && args.tokens && args.wte,
                "embedding_forward: out, tokens and wte must be non-null");
  TRIDENT_CHECK(args.position_offset >= 0, "embedding_forward: position_offset must be >= 0, got ",
                args.position_offset);
  cudaStream_t s = stream_of(ctx);
  check_tokens("embedding_forward", s, args.tokens, rows);
  embedding_forward_kernel<<<grid_for(rows * C, 256), 256, 0, s>>>(
      args.out, args.tokens, args.wte, args.wpe, args.positions, rows, args.seq_len, C,
      args.vocab_start, args.vocab_local, args.position_offset);
  TRIDENT_CUDA_LAUNCH_CHECK("embedding_forward");
}

void embedding_backward(const ExecContext& ctx, const EmbeddingBackwardArgs& args) {
  check_sizes("embedding_backward", args.batch, args.seq_len, args.hidden, args.vocab_start,
              args.vocab_local);
  const std::int64_t rows = args.batch * args.seq_len, C = args.hidden;
  if (rows == 0) return;
  TRIDENT_CHECK(args.d_wte && args.d_out && args.tokens,
                "embedding_backward: d_wte, d_out and tokens must be non-null");
  cudaStream_t s = stream_of(ctx);
  check_tokens("embedding_backward", s, args.tokens, rows);
  embedding_backward_wte_kernel<<<grid_for(C, 128), 128, 0, s>>>(
      args.d_wte, args.d_out, args.tokens, rows, C, args.vocab_start, args.vocab_local);
  TRIDENT_CUDA_LAUNCH_CHECK("embedding_backward");
  if (args.d_wpe && args.positions) {
    embedding_backward_wpe_positions_kernel<<<grid_for(C, 128), 128, 0, s>>>(
        args.d_wpe, args.d_out, args.positions, rows, C);
    TRIDENT_CUDA_LAUNCH_CHECK("embedding_backward");
  } else if (args.d_wpe) {
    embedding_backward_wpe_kernel<<<grid_for(args.seq_len * C, 256), 256, 0, s>>>(
        args.d_wpe, args.d_out, args.batch, args.seq_len, C);
    TRIDENT_CUDA_LAUNCH_CHECK("embedding_backward");
  }
}

void document_ids(const ExecContext& ctx, const DocumentIdsArgs& a) {
  TRIDENT_CHECK(a.batch >= 0 && a.seq_len >= 0, "document_ids: need batch, seq_len >= 0, got ",
                a.batch, " and ", a.seq_len);
  if (a.batch == 0 || a.seq_len == 0) return;
  TRIDENT_CHECK(a.positions && a.docs && a.tokens,
                "document_ids: positions, docs and tokens must be non-null");
  document_ids_kernel<<<grid_for(a.batch, 64), 64, 0, stream_of(ctx)>>>(
      a.positions, a.docs, a.tokens, a.batch, a.seq_len, a.eod_token);
  TRIDENT_CUDA_LAUNCH_CHECK("document_ids");
}

void cross_entropy_forward_backward(const ExecContext& ctx, const CrossEntropyArgs& args) {
  const std::int64_t rows = args.rows, V = args.vocab, Vp = args.vocab_padded;
  TRIDENT_CHECK(rows >= 0 && V > 0 && Vp >= V,
                "cross_entropy_forward_backward: need rows >= 0 and 0 < vocab <= vocab_padded, "
                "got rows=",
                rows, " vocab=", V, " vocab_padded=", Vp);
  if (rows == 0) return;
  TRIDENT_CHECK(args.losses && args.logits && args.targets,
                "cross_entropy_forward_backward: losses, logits and targets must be non-null");
  TRIDENT_CHECK(rows <= 0x7fffffff, "cross_entropy_forward_backward: too many rows");
  cudaStream_t s = stream_of(ctx);
  defer_check(
      s, args.targets, rows, CheckRule::kBelowBound, V, [V](std::int64_t i, std::int64_t v) {
        TRIDENT_ASSERT(false, "cross_entropy_forward_backward: targets[", i, "] = ", v,
                       " is outside the real vocabulary [0, ", V, ") (a padding column or beyond)");
      });
  cross_entropy_kernel<<<static_cast<unsigned>(rows), kCeThreads, 0, s>>>(
      args.losses, args.d_logits, args.logits, args.targets, args.d_scale, V, Vp);
  TRIDENT_CUDA_LAUNCH_CHECK("cross_entropy_forward_backward");
}

}  // namespace trident::kernels::cuda
