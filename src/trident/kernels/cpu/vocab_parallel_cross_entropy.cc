// Vocab-parallel cross-entropy parts, CPU: OpenMP over rows; every row's arithmetic is fixed, so
// the results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

void vocab_parallel_ce_max(const core::ExecContext& ctx, const VocabParallelCeMaxArgs& a) {
  const std::int64_t real = a.shard.real(), Vl = a.shard.vocab_local;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const float* l = a.logits + r * Vl;
    float m = -INFINITY;
    for (std::int64_t j = 0; j < real; ++j) m = std::max(m, l[j]);
    a.row_max[r] = m;
  }
}

void vocab_parallel_ce_sum_target(const core::ExecContext& ctx, const VocabParallelCeSumArgs& a) {
  const std::int64_t real = a.shard.real(), Vl = a.shard.vocab_local;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const float* l = a.logits + r * Vl;
    double s = 0;
    for (std::int64_t j = 0; j < real; ++j) s += std::exp(static_cast<double>(l[j] - a.row_max[r]));
    a.sum_exp[r] = static_cast<float>(s);
    const std::int64_t t = a.targets[r] - a.shard.vocab_start;
    a.target_logit[r] = (a.targets[r] >= 0 && t >= 0 && t < real) ? l[t] : 0.0f;
  }
}

void vocab_parallel_ce_loss(const core::ExecContext& ctx, const VocabParallelCeLossArgs& a) {
  const std::int64_t real = a.shard.real(), Vl = a.shard.vocab_local, start = a.shard.vocab_start;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    TRIDENT_ASSERT(a.targets[r] < a.shard.vocab, "target ", a.targets[r],
                   " is outside the vocabulary");
  }
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const bool ignored = a.targets[r] < 0;
    const float lse = std::log(a.sum_exp[r]) + a.row_max[r];
    a.losses[r] = ignored ? 0.0f : lse - a.target_logit[r];
    if (a.d_logits == nullptr) continue;
    const float* l = a.logits + r * Vl;
    float* d = a.d_logits + r * Vl;  // may alias l: l[j] is read before d[j] is written
    const float inv_sum = 1.0f / a.sum_exp[r];
    for (std::int64_t j = 0; j < Vl; ++j) {
      if (ignored || j >= real) {
        d[j] = 0.0f;
        continue;
      }
      const float p = std::exp(l[j] - a.row_max[r]) * inv_sum;
      d[j] = a.d_scale * (p - (start + j == a.targets[r] ? 1.0f : 0.0f));
    }
  }
}

TokenLossSum sum_token_losses(const core::ExecContext& /*ctx: serial, in row order*/,
                              const float* losses, const std::int32_t* targets, std::int64_t rows) {
  TokenLossSum out;  // in row order: the sum is part of the logged (and compared) loss
  for (std::int64_t i = 0; i < rows; ++i) {
    if (targets[i] < 0) continue;
    out.sum += losses[i];
    ++out.count;
  }
  return out;
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
