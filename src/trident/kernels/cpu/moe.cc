// CPU mixture-of-experts routing (moe.h). The router: OpenMP over tokens, each token's E scores,
// top-k and weights in double (E is small; the same keys and order as the reference, so every
// backend chooses alike). The dispatch map: one sequential pass in token order (integer work on
// N * k entries), then the rows. Permute / unpermute: OpenMP over rows or tokens, each row a
// contiguous copy or a k-term sum in j order (no atomics: the results do not depend on threads).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

// Group-limited routing (moe.h): the experts, in index order, of the group_topk groups whose
// top-(k / group_topk) values sum largest. `groups` is the caller's scratch.
std::vector<std::int32_t> allowed_experts(const std::vector<double>& value,
                                          const MoeRouterConfig& cfg,
                                          std::vector<std::int32_t>& groups) {
  const auto E = static_cast<std::int64_t>(value.size());
  const std::int64_t G = cfg.num_groups, per = E / G, m = cfg.topk / cfg.group_topk;
  const auto larger = [](const std::vector<double>& v) {
    return [&v](std::int32_t x, std::int32_t y) { return v[x] > v[y] || (v[x] == v[y] && x < y); };
  };
  std::vector<double> score(static_cast<std::size_t>(G), 0.0);
  std::vector<std::int32_t> in_group(static_cast<std::size_t>(per));
  for (std::int64_t g = 0; g < G; ++g) {
    std::iota(in_group.begin(), in_group.end(), static_cast<std::int32_t>(g * per));
    std::partial_sort(in_group.begin(), in_group.begin() + m, in_group.end(), larger(value));
    for (std::int64_t i = 0; i < m; ++i) score[g] += value[in_group[i]];
  }
  groups.resize(static_cast<std::size_t>(G));
  std::iota(groups.begin(), groups.end(), 0);
  std::partial_sort(groups.begin(), groups.begin() + cfg.group_topk, groups.end(), larger(score));
  std::sort(groups.begin(), groups.begin() + cfg.group_topk);
  std::vector<std::int32_t> experts;
  for (std::int64_t i = 0; i < cfg.group_topk; ++i) {
    for (std::int64_t e = groups[i] * per; e < (groups[i] + 1) * per; ++e) {
      experts.push_back(static_cast<std::int32_t>(e));
    }
  }
  return experts;
}

}  // namespace

void moe_router_forward(const ExecContext& ctx, const MoeRouterForwardArgs& a) {
  const std::int64_t E = a.num_experts, k = a.cfg.topk;
  const bool softmax = a.cfg.score == MoeScore::kSoftmax;
#pragma omp parallel num_threads(detail::num_threads(ctx))
  {
    std::vector<double> s(static_cast<std::size_t>(E)), key(s.size()), value(s.size());
    std::vector<std::int32_t> order(s.size()), group_order;
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < a.tokens; ++n) {
      const float* l = a.logits + n * E;
      double max = l[0];
      for (std::int64_t e = 1; e < E; ++e) max = std::max(max, static_cast<double>(l[e]));
      double sum = 0;
      for (std::int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - max);
      const double lse = max + std::log(sum);
      for (std::int64_t e = 0; e < E; ++e) {
        s[e] = softmax ? std::exp(l[e] - lse) : 1 / (1 + std::exp(-static_cast<double>(l[e])));
        key[e] = a.expert_bias != nullptr ? s[e] + static_cast<double>(a.expert_bias[e]) : l[e];
        a.scores[n * E + e] = static_cast<float>(s[e]);
      }
      if (a.lse != nullptr) a.lse[n] = static_cast<float>(lse);
      order.resize(static_cast<std::size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      if (a.cfg.num_groups > 1) {
        for (std::int64_t e = 0; e < E; ++e) {
          value[e] = softmax && !a.cfg.pre_softmax ? l[e]
                     : a.expert_bias != nullptr    ? key[e]
                                                   : s[e];
        }
        order = allowed_experts(value, a.cfg, group_order);
      }
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](std::int32_t x, std::int32_t y) {
                          return key[x] > key[y] || (key[x] == key[y] && x < y);
                        });
      std::int32_t* experts = a.experts + n * k;
      float* w = a.weights + n * k;
      double z = 0;  // the normaliser of the chosen q_j (1: none)
      for (std::int64_t j = 0; j < k; ++j) {
        experts[j] = order[j];
        if (softmax && !a.cfg.pre_softmax) {
          z += std::exp(l[order[j]] - static_cast<double>(l[order[0]]));
        } else {
          z += s[order[j]];
        }
      }
      if (softmax && a.cfg.pre_softmax) z = 1;
      if (!softmax) z = k > 1 ? z + 1e-20 : 1;
      for (std::int64_t j = 0; j < k; ++j) {
        const double q = softmax && !a.cfg.pre_softmax
                             ? std::exp(l[order[j]] - static_cast<double>(l[order[0]]))
                             : s[order[j]];
        w[j] = static_cast<float>(a.cfg.scaling * (q / z));
      }
    }
  }
}

void moe_router_backward(const ExecContext& ctx, const MoeRouterBackwardArgs& a) {
  const std::int64_t E = a.num_experts, k = a.cfg.topk;
  const double scale = a.cfg.scaling;
  const bool softmax = a.cfg.score == MoeScore::kSoftmax;
#pragma omp parallel num_threads(detail::num_threads(ctx))
  {
    std::vector<double> d_l(static_cast<std::size_t>(E)), d_s(d_l.size());
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < a.tokens; ++n) {
      const float* s = a.scores + n * E;
      const float* w = a.weights + n * k;
      const float* g = a.d_weights + n * k;
      const std::int32_t* chosen = a.experts + n * k;
      std::fill(d_l.begin(), d_l.end(), 0.0);
      std::fill(d_s.begin(), d_s.end(), 0.0);
      if (softmax && !a.cfg.pre_softmax) {
        double pg = 0;
        for (std::int64_t j = 0; j < k; ++j) pg += w[j] / scale * g[j];
        for (std::int64_t j = 0; j < k; ++j) d_l[chosen[j]] += w[j] * (g[j] - pg);
      } else if (softmax || k == 1) {
        for (std::int64_t j = 0; j < k; ++j) d_s[chosen[j]] += scale * g[j];
      } else {
        double Q = 1e-20, gq = 0;
        for (std::int64_t j = 0; j < k; ++j) {
          Q += s[chosen[j]];
          gq += g[j] * static_cast<double>(s[chosen[j]]);
        }
        for (std::int64_t j = 0; j < k; ++j) d_s[chosen[j]] += scale * (g[j] / Q - gq / (Q * Q));
      }
      if (a.d_aux != nullptr) {
        const float* aux = a.d_aux + (n / a.group_tokens) * E;
        for (std::int64_t e = 0; e < E; ++e) d_s[e] += aux[e];
      }
      if (softmax) {
        double sd = 0;
        for (std::int64_t e = 0; e < E; ++e) sd += s[e] * d_s[e];
        for (std::int64_t e = 0; e < E; ++e) d_l[e] += s[e] * (d_s[e] - sd);
      } else {
        for (std::int64_t e = 0; e < E; ++e) d_l[e] += d_s[e] * s[e] * (1.0 - s[e]);
      }
      if (a.z_scale != 0.0f) {
        const double lse = a.lse[n];
        for (std::int64_t e = 0; e < E; ++e) {
          d_l[e] += static_cast<double>(a.z_scale) * 2 * lse * std::exp(a.logits[n * E + e] - lse);
        }
      }
      for (std::int64_t e = 0; e < E; ++e) a.d_logits[n * E + e] = static_cast<float>(d_l[e]);
    }
  }
}

void moe_dispatch_map(const ExecContext&, const MoeDispatchMapArgs& a) {
  const std::int64_t N = a.tokens, k = a.topk, E = a.num_experts, A = N * k;
  std::vector<std::int64_t> chosen(static_cast<std::size_t>(E), 0);
  for (std::int64_t i = 0; i < A; ++i) ++chosen[a.experts[i]];
  // kept[i]: whether assignment i = n * k + j keeps its expert.
  std::vector<char> kept(static_cast<std::size_t>(A), 1);
  if (a.capacity > 0 && a.policy == MoeDropPolicy::kPosition) {
    std::vector<std::int64_t> seen(static_cast<std::size_t>(E), 0);
    for (std::int64_t i = 0; i < A; ++i) kept[i] = seen[a.experts[i]]++ < a.capacity ? 1 : 0;
  } else if (a.capacity > 0) {
    // An over-full expert keeps its `capacity` largest weights, ties to the earlier token.
    std::vector<std::vector<std::int64_t>> by(static_cast<std::size_t>(E));
    for (std::int64_t i = 0; i < A; ++i) {
      if (chosen[a.experts[i]] > a.capacity) by[a.experts[i]].push_back(i);
    }
    for (std::vector<std::int64_t>& c : by) {
      if (c.empty()) continue;
      std::stable_sort(c.begin(), c.end(),
                       [&](std::int64_t x, std::int64_t y) { return a.weights[x] > a.weights[y]; });
      for (std::size_t r = static_cast<std::size_t>(a.capacity); r < c.size(); ++r) kept[c[r]] = 0;
    }
  }
  std::vector<std::int64_t> next(static_cast<std::size_t>(E), 0);  // each expert's next row
  std::int64_t row = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t count = a.capacity > 0 ? std::min(chosen[e], a.capacity) : chosen[e];
    next[e] = a.pad_to_capacity ? e * a.capacity : row;
    row = next[e] + count;
    a.counts[e] = static_cast<std::int32_t>(count);
  }
  std::fill(a.sources, a.sources + a.max_rows, -1);
  for (std::int64_t i = 0; i < A; ++i) {
    if (kept[i] == 0) {
      a.rows[i] = -1;
      continue;
    }
    const std::int64_t r = next[a.experts[i]]++;
    a.rows[i] = static_cast<std::int32_t>(r);
    a.sources[r] = static_cast<std::int32_t>(i);
  }
}

void moe_permute(const ExecContext& ctx, const MoePermuteArgs& a) {
  const std::int64_t C = a.hidden;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t r = 0; r < a.rows_out; ++r) {
    const std::int32_t src = a.sources[r];
    float* out = a.x_perm + r * C;
    if (src < 0) {
      std::fill(out, out + C, 0.0f);
    } else {
      std::copy(a.x + src / a.topk * C, a.x + (src / a.topk + 1) * C, out);
    }
  }
}

void moe_permute_backward(const ExecContext& ctx, const MoePermuteBackwardArgs& a) {
  const std::int64_t C = a.hidden, k = a.topk;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    float* d_x = a.d_x + n * C;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t r = a.rows[n * k + j];
      if (r < 0) continue;
      const float* d = a.d_x_perm + r * C;
      for (std::int64_t c = 0; c < C; ++c) d_x[c] += d[c];
    }
  }
}

void moe_unpermute(const ExecContext& ctx, const MoeUnpermuteArgs& a) {
  const std::int64_t C = a.hidden, k = a.topk;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    float* out = a.out + n * C;
    std::fill(out, out + C, 0.0f);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t r = a.rows[n * k + j];
      if (r < 0) continue;
      const float w = a.weights[n * k + j];
      const float* y = a.y_perm + r * C;
      for (std::int64_t c = 0; c < C; ++c) out[c] += w * y[c];
    }
  }
}

void moe_unpermute_backward(const ExecContext& ctx, const MoeUnpermuteBackwardArgs& a) {
  const std::int64_t C = a.hidden, k = a.topk;
#pragma omp parallel num_threads(detail::num_threads(ctx))
  {
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < a.rows_out; ++r) {
      const std::int32_t src = a.sources[r];
      float* d_y = a.d_y_perm + r * C;
      if (src < 0) {
        std::fill(d_y, d_y + C, 0.0f);
        continue;
      }
      const float w = a.weights[src];
      const float* d_out = a.d_out + src / k * C;
      for (std::int64_t c = 0; c < C; ++c) d_y[c] = w * d_out[c];
    }
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < a.tokens * k; ++i) {
      const std::int32_t r = a.rows[i];
      double dot = 0;
      if (r >= 0) {
        const float* d_out = a.d_out + i / k * C;
        const float* y = a.y_perm + r * C;
        for (std::int64_t c = 0; c < C; ++c) dot += static_cast<double>(d_out[c]) * y[c];
      }
      a.d_weights[i] = static_cast<float>(dot);
    }
  }
}

void moe_shared_gate_forward(const ExecContext& ctx, const MoeSharedGateArgs& a) {
  const std::int64_t C = a.hidden;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    const float g = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(a.logits[n]))));
    float* out = a.out + n * C;
    const float* shared = a.shared + n * C;
    for (std::int64_t c = 0; c < C; ++c) out[c] += g * shared[c];
  }
}

void moe_shared_gate_backward(const ExecContext& ctx, const MoeSharedGateBackwardArgs& a) {
  const std::int64_t C = a.hidden;
#pragma omp parallel for num_threads(detail::num_threads(ctx)) schedule(static)
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    const double g = 1.0 / (1.0 + std::exp(-static_cast<double>(a.logits[n])));
    const float gf = static_cast<float>(g);
    const float* d_out = a.d_out + n * C;
    const float* shared = a.shared + n * C;
    float* d_shared = a.d_shared + n * C;
    double dot = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      d_shared[c] = gf * d_out[c];
      dot += static_cast<double>(d_out[c]) * shared[c];
    }
    a.d_logits[n] = static_cast<float>(g * (1.0 - g) * dot);
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
