// Reference mixture-of-experts routing (moe.h): the definitions read literally, double
// arithmetic, one thread. The router over the element type T (double: the finite-difference
// checks of its backward).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "trident/kernels/moe.h"

namespace trident::kernels::ref {

namespace {

// The k allowed experts of largest key, in descending order, ties to the lower expert.
std::vector<std::int32_t> top_k(const std::vector<double>& key, std::int64_t k,
                                const std::vector<bool>& allowed) {
  std::vector<std::int32_t> order;
  for (std::size_t e = 0; e < key.size(); ++e) {
    if (allowed[e]) order.push_back(static_cast<std::int32_t>(e));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int32_t a, std::int32_t b) { return key[a] > key[b]; });
  order.resize(static_cast<std::size_t>(k));
  return order;
}

// Group-limited routing: the experts of the group_topk groups whose top-(k / group_topk) values
// sum largest (all experts without groups).
std::vector<bool> allowed_experts(const std::vector<double>& value, const MoeRouterConfig& cfg) {
  const auto E = static_cast<std::int64_t>(value.size());
  if (cfg.num_groups <= 1) return std::vector<bool>(value.size(), true);
  const std::int64_t G = cfg.num_groups, per = E / G, m = cfg.topk / cfg.group_topk;
  std::vector<double> group_score(static_cast<std::size_t>(G));
  for (std::int64_t g = 0; g < G; ++g) {
    const std::vector<double> in(value.begin() + g * per, value.begin() + (g + 1) * per);
    for (std::int32_t e : top_k(in, m, std::vector<bool>(in.size(), true))) {
      group_score[g] += in[e];
    }
  }
  std::vector<bool> allowed(value.size(), false);
  for (std::int32_t g : top_k(group_score, cfg.group_topk, std::vector<bool>(G, true))) {
    for (std::int64_t e = g * per; e < (g + 1) * per; ++e) allowed[e] = true;
  }
  return allowed;
}

}  // namespace

template <class T>
void moe_router_forward(const BasicMoeRouterForwardArgs<T>& a) {
  const std::int64_t E = a.num_experts, k = a.cfg.topk;
  std::vector<double> l(static_cast<std::size_t>(E)), s(l.size()), key(l.size());
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    for (std::int64_t e = 0; e < E; ++e) l[e] = a.logits[n * E + e];
    const double max = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (std::int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - max);
    const double lse = max + std::log(sum);
    for (std::int64_t e = 0; e < E; ++e) {
      s[e] = a.cfg.score == MoeScore::kSoftmax ? std::exp(l[e] - lse) : 1 / (1 + std::exp(-l[e]));
      key[e] = a.expert_bias != nullptr ? s[e] + static_cast<double>(a.expert_bias[e]) : l[e];
      a.scores[n * E + e] = static_cast<T>(s[e]);
    }
    if (a.lse != nullptr) a.lse[n] = static_cast<T>(lse);
    std::vector<double> value(l.size());  // what the group scores sum (moe.h)
    for (std::int64_t e = 0; e < E; ++e) {
      const bool logits = a.cfg.score == MoeScore::kSoftmax && !a.cfg.pre_softmax;
      value[e] = logits ? l[e] : a.expert_bias != nullptr ? key[e] : s[e];
    }
    const std::vector<std::int32_t> chosen = top_k(key, k, allowed_experts(value, a.cfg));
    std::vector<double> q(static_cast<std::size_t>(k));
    for (std::int64_t j = 0; j < k; ++j) q[j] = s[chosen[j]];
    if (a.cfg.score == MoeScore::kSoftmax && !a.cfg.pre_softmax) {
      // softmax over the chosen logits: exp(l_j - l_0) / sum_i exp(l_i - l_0), l_0 the largest
      double z = 0;
      for (std::int64_t j = 0; j < k; ++j) z += std::exp(l[chosen[j]] - l[chosen[0]]);
      for (std::int64_t j = 0; j < k; ++j) q[j] = std::exp(l[chosen[j]] - l[chosen[0]]) / z;
    } else if (a.cfg.score == MoeScore::kSigmoid && k > 1) {
      const double total = std::accumulate(q.begin(), q.end(), 0.0) + 1e-20;
      for (double& x : q) x /= total;
    }
    for (std::int64_t j = 0; j < k; ++j) {
      a.experts[n * k + j] = chosen[j];
      a.weights[n * k + j] = static_cast<T>(a.cfg.scaling * q[j]);
    }
  }
}

// Per token, with g_j = d_weights[n, j] and d_s the gradient on scores[n, :]: the combine's term,
// the load-balancing term d_aux and the z-loss term, as moe.h states.
template <class T>
void moe_router_backward(const BasicMoeRouterBackwardArgs<T>& a) {
  const std::int64_t E = a.num_experts, k = a.cfg.topk;
  const double scale = a.cfg.scaling;
  const bool softmax = a.cfg.score == MoeScore::kSoftmax;
  std::vector<double> d_l(static_cast<std::size_t>(E)), d_s(d_l.size());
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    const T* s = a.scores + n * E;
    const T* w = a.weights + n * k;
    const T* g = a.d_weights + n * k;
    const std::int32_t* chosen = a.experts + n * k;
    std::fill(d_l.begin(), d_l.end(), 0.0);
    std::fill(d_s.begin(), d_s.end(), 0.0);
    if (softmax && !a.cfg.pre_softmax) {
      // w_j = scale p_j, p the softmax of the chosen logits: d l_j = scale p_j (g_j - sum p_i g_i)
      double pg = 0;
      for (std::int64_t j = 0; j < k; ++j) pg += w[j] / scale * g[j];
      for (std::int64_t j = 0; j < k; ++j) d_l[chosen[j]] += w[j] * (g[j] - pg);
    } else if (softmax) {
      for (std::int64_t j = 0; j < k; ++j) d_s[chosen[j]] += scale * g[j];  // w_j = scale s_e_j
    } else if (k == 1) {
      d_s[chosen[0]] += scale * g[0];
    } else {
      // w_j = scale q_j / Q, Q = sum_i q_i + 1e-20: d q_j = scale (g_j / Q - sum_i g_i q_i / Q^2)
      double Q = 1e-20, gq = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        Q += s[chosen[j]];
        gq += g[j] * static_cast<double>(s[chosen[j]]);
      }
      for (std::int64_t j = 0; j < k; ++j) d_s[chosen[j]] += scale * (g[j] / Q - gq / (Q * Q));
    }
    if (a.d_aux != nullptr) {
      const T* aux = a.d_aux + (n / a.group_tokens) * E;
      for (std::int64_t e = 0; e < E; ++e) d_s[e] += aux[e];
    }
    if (softmax) {  // through s = softmax(l): d l_e += s_e (d_s_e - sum_f s_f d_s_f)
      double sd = 0;
      for (std::int64_t e = 0; e < E; ++e) sd += s[e] * d_s[e];
      for (std::int64_t e = 0; e < E; ++e) d_l[e] += s[e] * (d_s[e] - sd);
    } else {  // through s = sigmoid(l): d l_e += d_s_e s_e (1 - s_e)
      for (std::int64_t e = 0; e < E; ++e) d_l[e] += d_s[e] * s[e] * (1.0 - s[e]);
    }
    if (a.z_scale != 0) {  // z = z_scale sum_n lse_n^2: d l_e += z_scale 2 lse softmax(l)_e
      const double lse = a.lse[n];
      for (std::int64_t e = 0; e < E; ++e) {
        d_l[e] += a.z_scale * 2 * lse * std::exp(a.logits[n * E + e] - lse);
      }
    }
    for (std::int64_t e = 0; e < E; ++e) a.d_logits[n * E + e] = static_cast<T>(d_l[e]);
  }
}

template void moe_router_forward<float>(const BasicMoeRouterForwardArgs<float>&);
template void moe_router_forward<double>(const BasicMoeRouterForwardArgs<double>&);
template void moe_router_backward<float>(const BasicMoeRouterBackwardArgs<float>&);
template void moe_router_backward<double>(const BasicMoeRouterBackwardArgs<double>&);

// Which (n, j) each expert keeps, then the rows in expert-major, token order.
void moe_dispatch_map(const MoeDispatchMapArgs& a) {
  const std::int64_t N = a.tokens, k = a.topk, E = a.num_experts;
  std::vector<std::vector<std::int64_t>> chosen_by(static_cast<std::size_t>(E));  // n * k + j
  for (std::int64_t i = 0; i < N * k; ++i) chosen_by[a.experts[i]].push_back(i);  // token order
  std::vector<char> kept(static_cast<std::size_t>(N * k), 0);
  for (std::int64_t e = 0; e < E; ++e) {
    std::vector<std::int64_t> c = chosen_by[e];
    if (a.capacity > 0 && static_cast<std::int64_t>(c.size()) > a.capacity) {
      if (a.policy == MoeDropPolicy::kProbs) {  // the larger weights, ties to the earlier token
        std::stable_sort(c.begin(), c.end(), [&](std::int64_t x, std::int64_t y) {
          return a.weights[x] > a.weights[y];
        });
      }
      c.resize(static_cast<std::size_t>(a.capacity));
    }
    for (std::int64_t i : c) kept[i] = 1;
  }
  for (std::int64_t r = 0; r < a.max_rows; ++r) a.sources[r] = -1;
  std::int64_t next = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    std::int64_t row = a.pad_to_capacity ? e * a.capacity : next;
    std::int32_t count = 0;
    for (std::int64_t i : chosen_by[e]) {  // token order
      if (kept[i] == 0) continue;
      a.rows[i] = static_cast<std::int32_t>(row);
      a.sources[row] = static_cast<std::int32_t>(i);
      ++row;
      ++count;
    }
    a.counts[e] = count;
    next = row;
  }
  for (std::int64_t i = 0; i < N * k; ++i) {
    if (kept[i] == 0) a.rows[i] = -1;
  }
}

void moe_permute(const MoePermuteArgs& a) {
  for (std::int64_t r = 0; r < a.rows_out; ++r) {
    const std::int32_t src = a.sources[r];
    for (std::int64_t c = 0; c < a.hidden; ++c) {
      a.x_perm[r * a.hidden + c] = src < 0 ? 0.0f : a.x[src / a.topk * a.hidden + c];
    }
  }
}

void moe_permute_backward(const MoePermuteBackwardArgs& a) {
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    for (std::int64_t c = 0; c < a.hidden; ++c) {
      double sum = a.d_x[n * a.hidden + c];
      for (std::int64_t j = 0; j < a.topk; ++j) {
        const std::int32_t r = a.rows[n * a.topk + j];
        if (r >= 0) sum += a.d_x_perm[r * a.hidden + c];
      }
      a.d_x[n * a.hidden + c] = static_cast<float>(sum);
    }
  }
}

void moe_unpermute(const MoeUnpermuteArgs& a) {
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    for (std::int64_t c = 0; c < a.hidden; ++c) {
      double sum = 0;
      for (std::int64_t j = 0; j < a.topk; ++j) {
        const std::int32_t r = a.rows[n * a.topk + j];
        if (r >= 0)
          sum += static_cast<double>(a.weights[n * a.topk + j]) * a.y_perm[r * a.hidden + c];
      }
      a.out[n * a.hidden + c] = static_cast<float>(sum);
    }
  }
}

void moe_unpermute_backward(const MoeUnpermuteBackwardArgs& a) {
  for (std::int64_t r = 0; r < a.rows_out; ++r) {
    const std::int32_t src = a.sources[r];
    for (std::int64_t c = 0; c < a.hidden; ++c) {
      a.d_y_perm[r * a.hidden + c] = src < 0
                                         ? 0.0f
                                         : static_cast<float>(static_cast<double>(a.weights[src]) *
                                                              a.d_out[src / a.topk * a.hidden + c]);
    }
  }
  for (std::int64_t i = 0; i < a.tokens * a.topk; ++i) {
    const std::int32_t r = a.rows[i];
    double dot = 0;
    for (std::int64_t c = 0; r >= 0 && c < a.hidden; ++c) {
      dot += static_cast<double>(a.d_out[i / a.topk * a.hidden + c]) * a.y_perm[r * a.hidden + c];
    }
    a.d_weights[i] = static_cast<float>(dot);
  }
}

template <class T>
void moe_shared_gate_forward(const BasicMoeSharedGateArgs<T>& a) {
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    const double g = 1.0 / (1.0 + std::exp(-static_cast<double>(a.logits[n])));
    for (std::int64_t c = 0; c < a.hidden; ++c) {
      const std::int64_t i = n * a.hidden + c;
      a.out[i] = static_cast<T>(static_cast<double>(a.out[i]) + g * a.shared[i]);
    }
  }
}

template <class T>
void moe_shared_gate_backward(const BasicMoeSharedGateBackwardArgs<T>& a) {
  for (std::int64_t n = 0; n < a.tokens; ++n) {
    const double g = 1.0 / (1.0 + std::exp(-static_cast<double>(a.logits[n])));
    double dot = 0;
    for (std::int64_t c = 0; c < a.hidden; ++c) {
      const std::int64_t i = n * a.hidden + c;
      a.d_shared[i] = static_cast<T>(g * a.d_out[i]);
      dot += static_cast<double>(a.d_out[i]) * a.shared[i];
    }
    a.d_logits[n] = static_cast<T>(g * (1.0 - g) * dot);
  }
}

template void moe_shared_gate_forward<float>(const BasicMoeSharedGateArgs<float>&);
template void moe_shared_gate_forward<double>(const BasicMoeSharedGateArgs<double>&);
template void moe_shared_gate_backward<float>(const BasicMoeSharedGateBackwardArgs<float>&);
template void moe_shared_gate_backward<double>(const BasicMoeSharedGateBackwardArgs<double>&);

}  // namespace trident::kernels::ref
