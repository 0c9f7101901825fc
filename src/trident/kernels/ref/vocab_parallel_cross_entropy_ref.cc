// Reference vocab-parallel cross-entropy parts: double, one thread.
#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"

namespace trident::kernels::ref {

void vocab_parallel_ce_max(const VocabParallelCeMaxArgs& a) {
  const std::int64_t real = a.shard.real(), Vl = a.shard.vocab_local;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    double m = -INFINITY;
    for (std::int64_t j = 0; j < real; ++j)
      m = std::max(m, static_cast<double>(a.logits[r * Vl + j]));
    a.row_max[r] = static_cast<float>(m);
  }
}

void vocab_parallel_ce_sum_target(const VocabParallelCeSumArgs& a) {
  const std::int64_t real = a.shard.real(), Vl = a.shard.vocab_local;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const float* l = a.logits + r * Vl;
    double s = 0;
    for (std::int64_t j = 0; j < real; ++j) s += std::exp(static_cast<double>(l[j]) - a.row_max[r]);
    a.sum_exp[r] = static_cast<float>(s);
    const std::int64_t t = a.targets[r] - a.shard.vocab_start;
    a.target_logit[r] = (a.targets[r] >= 0 && t >= 0 && t < real) ? l[t] : 0.0f;
  }
}

void vocab_parallel_ce_loss(const VocabParallelCeLossArgs& a) {
  const std::int64_t real = a.shard.real(), Vl = a.shard.vocab_local;
  for (std::int64_t r = 0; r < a.rows; ++r) {
    TRIDENT_ASSERT(a.targets[r] < a.shard.vocab, "target ", a.targets[r],
                   " is outside the vocabulary");
    const bool ignored = a.targets[r] < 0;
    const double lse = std::log(static_cast<double>(a.sum_exp[r])) + a.row_max[r];
    a.losses[r] = ignored ? 0.0f : static_cast<float>(lse - a.target_logit[r]);
    if (a.d_logits == nullptr) continue;
    for (std::int64_t j = 0; j < Vl; ++j) {
      const std::int64_t i = r * Vl + j;
      if (ignored || j >= real) {
        a.d_logits[i] = 0.0f;
        continue;
      }
      const double p = std::exp(static_cast<double>(a.logits[i]) - lse);
      const double onehot = a.shard.vocab_start + j == a.targets[r] ? 1.0 : 0.0;
      a.d_logits[i] = static_cast<float>(a.d_scale * (p - onehot));
    }
  }
}

TokenLossSum sum_token_losses(const float* losses, const std::int32_t* targets, std::int64_t rows) {
  TokenLossSum out;
  for (std::int64_t i = 0; i < rows; ++i) {
    if (targets[i] < 0) continue;
    out.sum += losses[i];
    ++out.count;
  }
  return out;
}

}  // namespace trident::kernels::ref
