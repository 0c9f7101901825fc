#include "trident/model/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "trident/core/error.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/grouped_linear.h"
#include "trident/kernels/memory.h"
#include "trident/kernels/moe.h"
#include "trident/kernels/swiglu.h"

namespace trident::model::layers {

namespace k = trident::kernels;

std::int64_t MoeConfig::capacity(std::int64_t rows) const {
  if (capacity_factor <= 0.0) return 0;
  const double per_expert = static_cast<double>(rows) * static_cast<double>(router.topk) /
                            static_cast<double>(num_experts);
  return std::max<std::int64_t>(1,
                                static_cast<std::int64_t>(std::ceil(per_expert * capacity_factor)));
}

std::int64_t MoeConfig::max_rows(std::int64_t rows) const {
  const std::int64_t all = rows * router.topk, cap = capacity(rows);
  if (cap == 0) return all;
  return pad_to_capacity ? num_experts * cap : std::min(all, num_experts * cap);
}

std::int64_t MoeConfig::max_local_rows(std::int64_t rows) const {
  if (ep_size <= 1) return max_rows(rows);
  const std::int64_t El = local_experts(), cap = capacity(rows);
  if (cap > 0) {  // at most the capacity of each local expert from each rank (padded: exactly)
    const std::int64_t from_one =
        pad_to_capacity ? El * cap
                        : std::min(El * cap, rows * std::min<std::int64_t>(router.topk, El));
    return ep_size * from_one;
  }
  return ep_size * rows * std::min<std::int64_t>(router.topk, El);
}

void declare_moe(const MoeConfig& cfg, const WeightScope& s, MoeParams* p, MoeGrads* g) {
  const std::int64_t C = cfg.hidden, E = cfg.num_experts, F = cfg.ffn;
  const bool swiglu = cfg.activation == Activation::kSwiGlu;
  s({.name = "router.weight", .shape = {E, C}, .weight_decay = true},
    slot(field(p, &MoeParams::router), field(g, &MoeGrads::router)));
  if (cfg.expert_bias) {
    // Zero at the start, no gradient and no weight decay: the optimizer leaves it where the
    // trainer's update puts it (AdamW's and Lion's steps are 0 for a zero gradient).
    s({.name = "router.expert_bias", .shape = {E}, .init = InitRule::kZeros, .weight_decay = false},
      slot(field(p, &MoeParams::expert_bias), nullptr));
  }
  // Each expert tensor-parallel as the dense MLP: the up-projection column-parallel (F split;
  // SwiGLU's gate and up blocks each), the down-projection row-parallel. The router is replicated:
  // every tp rank routes the same (full) rows alike.
  s({.name = "experts.dense_h_to_4h.weight",
     .shape = swiglu ? std::vector<std::int64_t>{E, 2, F, C} : std::vector<std::int64_t>{E, F, C},
     .tp_split = swiglu ? 2 : 1,
     .expert = true},
    slot(field(p, &MoeParams::fc_w), field(g, &MoeGrads::fc_w)));
  s({.name = "experts.dense_4h_to_h.weight",
     .shape = {E, C, F},
     .tp_split = 2,
     .init = InitRule::kScaledNormal,
     .expert = true},
    slot(field(p, &MoeParams::fc2_w), field(g, &MoeGrads::fc2_w)));
  if (cfg.shared_ffn > 0) {
    declare_mlp(cfg.shared_mlp(), s.sub("shared_experts."), field(p, &MoeParams::shared),
                field(g, &MoeGrads::shared));
  }
  if (cfg.shared_gate) {
    // Replicated over tp; under sequence parallelism each rank sees only its rows, so (as a
    // norm's parameter) its gradient is summed over tp.
    s({.name = "shared_experts.gate_weight", .shape = {1, C}, .norm = true},
      slot(field(p, &MoeParams::shared_gate), field(g, &MoeGrads::shared_gate)));
  }
}

namespace {

// Every local expert's matmul in one grouped op (kernels/grouped_linear.h): expert j's rows
// groups[j] of `in` (rows x in_f) through its matrix of the stacked weight (experts, out_f, in_f).
// Under BF16 the inputs go to their BF16 copy first, as linear's.
void experts_linear(const LayerContext& lc, std::span<const k::RowGroup> groups, float* out,
                    const float* in, const Weight& w, std::int64_t in_f, std::int64_t out_f) {
  const std::int64_t rows = groups.empty() ? 0 : groups.back().first + groups.back().rows;
  const auto G = static_cast<std::int64_t>(groups.size());
  k::GroupedLinearViews v{.out = view_of(lc, out, {rows, out_f}), .groups = groups};
  if (w.bf16 == nullptr) {
    v.in = view_of(lc, in, {rows, in_f});
    v.weight = view_of(lc, w.f32, {G, out_f, in_f});
    return k::grouped_linear(lc.ctx, v);
  }
  v.in = view_of(lc, lc.ws.bf16_in, {rows, in_f});
  k::convert(lc.ctx, {.out = v.in, .in = view_of(lc, in, {rows, in_f})});
  v.weight = view_of(lc, w.bf16, {G, out_f, in_f});
  v.scratch = lc.ws.gemm_scratch;
  k::grouped_linear(lc.ctx, v);
}

// Its backward: d_in (=) for the groups' rows, d_w (+=) for every local expert.
void experts_linear_backward(const LayerContext& lc, std::span<const k::RowGroup> groups,
                             float* d_in, float* d_w, const float* d_out, const float* in,
                             const Weight& w, std::int64_t in_f, std::int64_t out_f) {
  const std::int64_t rows = groups.empty() ? 0 : groups.back().first + groups.back().rows;
  const auto G = static_cast<std::int64_t>(groups.size());
  k::GroupedLinearBackwardViews v{.d_in = view_of(lc, d_in, {rows, in_f}),
                                  .d_weight = view_of(lc, d_w, {G, out_f, in_f}),
                                  .groups = groups};
  if (w.bf16 == nullptr) {
    v.d_out = view_of(lc, d_out, {rows, out_f});
    v.in = view_of(lc, in, {rows, in_f});
    v.weight = view_of(lc, w.f32, {G, out_f, in_f});
    return k::grouped_linear_backward(lc.ctx, v);
  }
  v.d_out = view_of(lc, lc.ws.bf16_dout, {rows, out_f});
  v.in = view_of(lc, lc.ws.bf16_in, {rows, in_f});
  k::convert(lc.ctx, {.out = v.d_out, .in = view_of(lc, d_out, {rows, out_f})});
  k::convert(lc.ctx, {.out = v.in, .in = view_of(lc, in, {rows, in_f})});
  v.weight = view_of(lc, w.bf16, {G, out_f, in_f});
  v.scratch = lc.ws.gemm_scratch;
  k::grouped_linear_backward(lc.ctx, v);
}

template <class T>
std::vector<T> download(const LayerContext& lc, const T* src, std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  k::download(lc.ctx, v.data(), src, n * static_cast<std::int64_t>(sizeof(T)));
  return v;
}

void check_layout(const LayerContext& lc, const MoeConfig& cfg) {
  TRIDENT_CHECK(!cfg.aux_per_sequence || lc.seq_len > 0,
                "the per-sequence load-balancing loss needs the sequence length");
}

// Kept rows per expert of each group of consecutive tokens (the whole call, or each sequence).
std::vector<double> group_counts(const std::vector<std::int32_t>& experts,
                                 const std::vector<std::int32_t>& rows_of, std::int64_t topk,
                                 std::int64_t E, std::int64_t group_tokens) {
  const std::int64_t n_choices = static_cast<std::int64_t>(experts.size());
  std::vector<double> counts(static_cast<std::size_t>(n_choices / topk / group_tokens * E), 0.0);
  for (std::int64_t i = 0; i < n_choices; ++i) {
    if (rows_of[i] >= 0) counts[(i / topk / group_tokens) * E + experts[i]] += 1.0;
  }
  return counts;
}

// Expert parallelism's bookkeeping for one call: how many permuted rows each rank sends each
// expert (its kept rows, or the capacity when padded), and where they sit on both sides.
class EpExchange {
 public:
  // block[e]: this rank's rows for expert e (contiguous, expert-major, in x_perm). Gathers every
  // ep rank's over the host channel.
  EpExchange(const LayerContext& lc, const MoeConfig& cfg, const std::vector<std::int64_t>& block)
      : P_(lc.ep->size()), me_(lc.ep->rank()), El_(cfg.local_experts()), C_(cfg.hidden) {
    const std::int64_t E = cfg.num_experts;
    all_.resize(static_cast<std::size_t>(P_ * E));
    lc.ep_host->all_gather(block.data(), all_.data(), E, comm::Datatype::kI64);
    for (int q = 0; q < P_; ++q) {
      std::int64_t to_q = 0, from_q = 0;
      for (std::int64_t j = 0; j < El_; ++j) {
        to_q += block[static_cast<std::size_t>(q * El_ + j)];
        from_q += at(q, j);
      }
      send_.push_back(to_q * C_);
      recv_.push_back(from_q * C_);
    }
    // Local expert j's rows, grouped by source rank: expert-major after the regrouping.
    std::int64_t first = 0;
    for (std::int64_t j = 0; j < El_; ++j) {
      std::int64_t n = 0;
      for (int q = 0; q < P_; ++q) n += at(q, j);
      experts_.push_back({first, n});
      first += n;
    }
    rows_ = first;
  }

  const std::vector<k::RowGroup>& experts() const { return experts_; }
  std::int64_t rows() const { return rows_; }  // received rows

  // x (this rank's permuted rows, expert-major over every expert) -> each local expert's rows
  // from every rank, expert-major (by source within an expert). `recv` is scratch.
  void dispatch(const LayerContext& lc, const float* x, float* recv, float* out) const {
    lc.ep->all_to_all_v(x, send_, recv, recv_, comm::Datatype::kF32);
    regroup(lc, recv, out, true);
  }
  // The reverse: local expert rows (expert-major) -> this rank's permuted rows. `send` is scratch.
  void combine(const LayerContext& lc, const float* in, float* send, float* out) const {
    regroup(lc, in, send, false);
    lc.ep->all_to_all_v(send, recv_, out, send_, comm::Datatype::kF32);
  }

 private:
  // Rows rank q sends local expert j.
  std::int64_t at(int q, std::int64_t j) const {
    return all_[static_cast<std::size_t>(q * El_ * P_ + me_ * El_ + j)];
  }
  // Source-major (rank q, then expert j) <-> expert-major (j, then q), one copy per block.
  void regroup(const LayerContext& lc, const float* from, float* to, bool to_expert_major) const {
    std::int64_t src_major = 0;
    std::vector<std::int64_t> expert_at;
    for (const k::RowGroup& r : experts_) expert_at.push_back(r.first);
    for (int q = 0; q < P_; ++q) {
      for (std::int64_t j = 0; j < El_; ++j) {
        const std::int64_t n = at(q, j);
        std::int64_t& e_at = expert_at[static_cast<std::size_t>(j)];
        if (n > 0) {
          const float* src = from + (to_expert_major ? src_major : e_at) * C_;
          float* dst = to + (to_expert_major ? e_at : src_major) * C_;
          k::copy_on_device(lc.ctx, dst, src, n * C_ * 4);
        }
        src_major += n;
        e_at += n;
      }
    }
  }

  int P_, me_;
  std::int64_t El_, C_;
  std::vector<std::int64_t> all_;          // (P, E) every rank's block rows
  std::vector<std::int64_t> send_, recv_;  // elements to / from each rank
  std::vector<k::RowGroup> experts_;
  std::int64_t rows_ = 0;
};

bool expert_parallel(const LayerContext& lc, const MoeConfig& cfg) {
  const int ep = lc.ep != nullptr ? lc.ep->size() : 1;
  TRIDENT_ASSERT(ep == cfg.ep_size, "an ep group of ", ep, " ranks for experts split ", cfg.ep_size,
                 " ways");
  return ep > 1;
}

// The rows each expert of this rank keeps: counts[e], or the capacity when padded.
std::vector<std::int64_t> block_rows(const MoeConfig& cfg, const std::vector<std::int32_t>& counts,
                                     std::int64_t N) {
  std::vector<std::int64_t> b;
  for (std::int32_t c : counts) b.push_back(cfg.pad_to_capacity ? cfg.capacity(N) : c);
  return b;
}

// Without expert parallelism: expert e's rows inside x_perm, its kept rows (padded: its whole
// block of capacity rows from e * capacity, the padding rows zero, as the expert-parallel
// exchange sends them).
std::vector<k::RowGroup> local_rows(const MoeConfig& cfg, const std::vector<std::int32_t>& counts,
                                    std::int64_t N) {
  std::vector<k::RowGroup> r;
  std::int64_t first = 0;
  for (std::int32_t c : counts) {
    const std::int64_t n = cfg.pad_to_capacity ? cfg.capacity(N) : c;
    r.push_back({first, n});
    first += n;
  }
  return r;
}

// The shared experts: out += their MLP's output (gated: times sigmoid(in . g) per token).
void shared_forward(const LayerContext& lc, const MoeConfig& cfg, const MoeParams& p,
                    const MoeForwardArgs& args) {
  const MoeSaved& s = args.saved;
  const std::int64_t rows = lc.local_rows(), C = cfg.hidden;
  mlp_forward(lc, cfg.shared_mlp(), p.shared,
              {.out = s.shared_out, .in = args.in, .saved = s.shared});
  const core::TensorView out = view_of(lc, args.out, {rows, C});
  if (!cfg.shared_gate) {
    k::add(lc.ctx, {.out = out, .a = out, .b = view_of(lc, s.shared_out, {rows, C})});
    return;
  }
  linear(lc, {.out = s.shared_logits,
              .in = args.in,
              .weight = {p.shared_gate, nullptr},
              .rows = rows,
              .in_features = C,
              .out_features = 1});
  k::moe_shared_gate(lc.ctx, {.out = out,
                              .shared = view_of(lc, s.shared_out, {rows, C}),
                              .logits = view_of(lc, s.shared_logits, {rows})});
}

// The shared experts' backward: their input gradient (local rows) into args.d_shared_in; grads +=.
void shared_backward(const LayerContext& lc, const MoeConfig& cfg, const MoeParams& p,
                     const MoeBackwardArgs& args) {
  const MoeSaved& s = args.saved;
  const std::int64_t rows = lc.local_rows(), C = cfg.hidden;
  const float* d_shared = args.d_out;
  if (cfg.shared_gate) {
    k::moe_shared_gate_backward(lc.ctx, {.d_shared = view_of(lc, args.d_shared_out, {rows, C}),
                                         .d_logits = view_of(lc, args.d_shared_logits, {rows}),
                                         .d_out = view_of(lc, args.d_out, {rows, C}),
                                         .shared = view_of(lc, s.shared_out, {rows, C}),
                                         .logits = view_of(lc, s.shared_logits, {rows})});
    d_shared = args.d_shared_out;
  }
  const float* d_in = mlp_backward(
      lc, cfg.shared_mlp(), p.shared,
      {.d_out = d_shared, .in = args.in, .saved = s.shared, .grads = args.grads.shared});
  k::copy_on_device(lc.ctx, args.d_shared_in, d_in, rows * C * 4);
  if (!cfg.shared_gate) return;
  // The gate's input gradient (d_logits (rows, 1) times g) into d_ln, added.
  linear_backward(lc, {.d_in = lc.ws.d_ln,
                       .d_weight = args.grads.shared_gate,
                       .d_out = args.d_shared_logits,
                       .in = args.in,
                       .weight = {p.shared_gate, nullptr},
                       .rows = rows,
                       .in_features = C,
                       .out_features = 1});
  const core::TensorView acc = view_of(lc, args.d_shared_in, {rows, C});
  k::add(lc.ctx, {.out = acc, .a = acc, .b = view_of(lc, lc.ws.d_ln, {rows, C})});
}

}  // namespace

void moe_forward(const LayerContext& lc, const MoeConfig& cfg, const MoeParams& p,
                 const MoeForwardArgs& args) {
  check_layout(lc, cfg);
  const MoeSaved& s = args.saved;
  const std::int64_t N = lc.rows(), C = cfg.hidden, E = cfg.num_experts, K = cfg.router.topk;
  const std::int64_t tp = lc.region.group().size(), F = cfg.ffn / tp;
  const std::int64_t FC = cfg.activation == Activation::kSwiGlu ? 2 * F : F;
  const std::int64_t R = cfg.max_rows(N);
  const float* x = lc.region.enter(args.in, lc.ws.gathered);  // every row (SP: all-gathered)
  linear(lc, {.out = s.logits,
              .in = x,
              .weight = p.router,
              .rows = N,
              .in_features = C,
              .out_features = E});
  k::moe_router(lc.ctx, {.scores = view_of(lc, s.scores, {N, E}),
                         .experts = view_of(lc, s.experts, {N, K}),
                         .weights = view_of(lc, s.weights, {N, K}),
                         .lse = view_of(lc, s.lse, {N}),
                         .logits = view_of(lc, s.logits, {N, E}),
                         .expert_bias = view_of(lc, p.expert_bias, {E}),
                         .cfg = cfg.router});
  k::moe_dispatch_map(lc.ctx, {.rows = view_of(lc, s.rows_of, {N, K}),
                               .counts = view_of(lc, s.counts, {E}),
                               .sources = view_of(lc, s.sources, {R}),
                               .experts = view_of(lc, s.experts, {N, K}),
                               .weights = view_of(lc, s.weights, {N, K}),
                               .num_experts = E,
                               .capacity = cfg.capacity(N),
                               .policy = cfg.drop_policy,
                               .pad_to_capacity = cfg.pad_to_capacity});
  const std::vector<std::int32_t> counts = download(lc, s.counts, E);
  std::int64_t rows = 0;
  for (std::int32_t c : counts) rows += c;
  const std::int64_t used = cfg.pad_to_capacity ? R : rows;  // the permuted rows in use
  k::moe_permute(lc.ctx, {.x_perm = view_of(lc, s.x_perm, {used, C}),
                          .x = view_of(lc, x, {N, C}),
                          .sources = view_of(lc, s.sources, {R}),
                          .topk = K});
  // The rows each local expert runs on: x_perm's own (expert parallelism 1), or the rows every
  // ep rank sent this rank's experts.
  const bool ep = expert_parallel(lc, cfg);
  std::optional<EpExchange> ex;
  const float* x_loc = s.x_perm;
  float* y_loc = s.y_perm;
  if (ep) {
    ex.emplace(lc, cfg, block_rows(cfg, counts, N));
    ex->dispatch(lc, s.x_perm, lc.ws.moe_ep_a, s.x_loc);
    x_loc = s.x_loc;
    y_loc = lc.ws.moe_ep_b;
  }
  // Every local expert's MLP over its rows: the rows are contiguous, expert after expert, so the
  // activation runs over all of them at once.
  const std::vector<k::RowGroup> experts = ep ? ex->experts() : local_rows(cfg, counts, N);
  const std::int64_t nl = experts.empty() ? 0 : experts.back().first + experts.back().rows;
  if (nl > 0) {
    experts_linear(lc, experts, s.fc, x_loc, p.fc_w, C, FC);
    if (cfg.activation == Activation::kSwiGlu) {
      k::swiglu(lc.ctx, {.out = view_of(lc, s.act, {nl, F}), .in = view_of(lc, s.fc, {nl, FC})});
    } else {
      k::gelu(lc.ctx, {.out = view_of(lc, s.act, {nl, F}), .in = view_of(lc, s.fc, {nl, F})});
    }
    // Padding rows (capacity): zero rows in, zero rows out (the experts have no biases).
    experts_linear(lc, experts, y_loc, s.act, p.fc2_w, F, C);
  }
  if (ep) ex->combine(lc, y_loc, lc.ws.moe_ep_a, s.y_perm);
  // Each tp rank's experts hold an F slice: the combine is its partial sum (x is consumed).
  float* partial = lc.region.partial_of(args.out, lc.ws.gathered);
  k::moe_unpermute(lc.ctx, {.out = view_of(lc, partial, {N, C}),
                            .y_perm = view_of(lc, s.y_perm, {used, C}),
                            .weights = view_of(lc, s.weights, {N, K}),
                            .rows = view_of(lc, s.rows_of, {N, K})});
  lc.region.leave(partial, args.out);  // the tp sum (SP: reduce-scatter)
  if (cfg.shared_ffn > 0) shared_forward(lc, cfg, p, args);
  if (args.stats == nullptr) return;
  MoeStats& st = *args.stats;
  st.tokens_per_expert = counts;
  st.dropped = N * K - rows;
  st.aux_loss = st.z_loss = 0.0;
  if (cfg.z_loss_coeff != 0.0) {
    double sum = 0;
    for (float v : download(lc, s.lse, N)) sum += static_cast<double>(v) * v;
    st.z_loss = cfg.z_loss_coeff * sum / static_cast<double>(N);
  }
  if (cfg.aux_loss_coeff != 0.0) {
    const std::int64_t group = cfg.aux_per_sequence ? lc.seq_len : N, groups = N / group;
    const std::vector<double> c =
        group_counts(download(lc, s.experts, N * K), download(lc, s.rows_of, N * K), K, E, group);
    const std::vector<float> scores = download(lc, s.scores, N * E);
    double loss = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t e = 0; e < E; ++e) loss += scores[n * E + e] * c[(n / group) * E + e];
    }
    // per group: E / (k T^2) sum_e S_e c_e, averaged over the groups
    st.aux_loss = cfg.aux_loss_coeff * loss * static_cast<double>(E) /
                  (static_cast<double>(K) * group * group * groups);
  }
}

const float* moe_backward(const LayerContext& lc, const MoeConfig& cfg, const MoeParams& p,
                          const MoeBackwardArgs& args) {
  check_layout(lc, cfg);
  // The shared experts first: their backward uses the workspace the routed part returns in.
  if (cfg.shared_ffn > 0) shared_backward(lc, cfg, p, args);
  const MoeSaved& s = args.saved;
  const MoeGrads& g = args.grads;
  const std::int64_t N = lc.rows(), C = cfg.hidden, E = cfg.num_experts, K = cfg.router.topk;
  const std::int64_t tp = lc.region.group().size(), F = cfg.ffn / tp;
  const std::int64_t FC = cfg.activation == Activation::kSwiGlu ? 2 * F : F;
  const std::int64_t R = cfg.max_rows(N);
  const float* d_out = lc.region.leave_backward(args.d_out, lc.ws.d_full);  // every row
  const std::vector<std::int32_t> counts = download(lc, s.counts, E);
  std::int64_t rows = 0;
  for (std::int32_t c : counts) rows += c;
  const std::int64_t used = cfg.pad_to_capacity ? R : rows;
  k::moe_unpermute_backward(lc.ctx, {.d_y_perm = view_of(lc, args.d_perm, {used, C}),
                                     .d_weights = view_of(lc, args.d_weights, {N, K}),
                                     .d_out = view_of(lc, d_out, {N, C}),
                                     .y_perm = view_of(lc, s.y_perm, {used, C}),
                                     .weights = view_of(lc, s.weights, {N, K}),
                                     .rows = view_of(lc, s.rows_of, {N, K}),
                                     .sources = view_of(lc, s.sources, {R})});
  // The weights' gradient sums the experts' outputs over their F slices: summed over tp, it is
  // the same on every rank, and so is the router's backward from here.
  lc.region.group().all_reduce_sum(args.d_weights, N * K);
  // The experts' output gradients where their rows are (received from every ep rank).
  const bool ep = expert_parallel(lc, cfg);
  std::optional<EpExchange> ex;
  const float* x_loc = s.x_perm;
  float* d_loc = args.d_perm;
  if (ep) {
    ex.emplace(lc, cfg, block_rows(cfg, counts, N));
    ex->dispatch(lc, args.d_perm, lc.ws.moe_ep_a, lc.ws.moe_ep_b);
    x_loc = s.x_loc;
    d_loc = lc.ws.moe_ep_b;
  }
  const std::vector<k::RowGroup> experts = ep ? ex->experts() : local_rows(cfg, counts, N);
  const std::int64_t nl = experts.empty() ? 0 : experts.back().first + experts.back().rows;
  if (nl > 0) {
    // d_loc's rows are the experts' output gradients, then (=) their inputs'.
    experts_linear_backward(lc, experts, args.d_act, g.fc2_w, d_loc, s.act, p.fc2_w, F, C);
    if (cfg.activation == Activation::kSwiGlu) {
      k::swiglu_backward(lc.ctx, {.d_in = view_of(lc, args.d_fc, {nl, FC}),
                                  .d_out = view_of(lc, args.d_act, {nl, F}),
                                  .in = view_of(lc, s.fc, {nl, FC})});
    } else {
      k::gelu_backward(lc.ctx, {.d_in = view_of(lc, args.d_fc, {nl, F}),
                                .d_out = view_of(lc, args.d_act, {nl, F}),
                                .in = view_of(lc, s.fc, {nl, F})});
    }
    experts_linear_backward(lc, experts, d_loc, g.fc_w, args.d_fc, x_loc, p.fc_w, C, FC);
  }
  if (ep) ex->combine(lc, d_loc, lc.ws.moe_ep_a, args.d_perm);  // back to this rank's rows
  // The router: the combine's gradient, the load-balancing loss's and the z-loss's.
  const std::int64_t group = cfg.aux_per_sequence ? lc.seq_len : N, groups = N / group;
  const bool aux = cfg.aux_loss_coeff != 0.0;
  if (aux) {
    std::vector<double> c =
        group_counts(download(lc, s.experts, N * K), download(lc, s.rows_of, N * K), K, E, group);
    std::vector<float> d_aux(c.size());
    const double scale = args.aux_grad_scale * cfg.aux_loss_coeff * static_cast<double>(E) /
                         (static_cast<double>(K) * group * group * groups);
    for (std::size_t i = 0; i < c.size(); ++i) d_aux[i] = static_cast<float>(scale * c[i]);
    k::copy_to_device(lc.ctx, args.d_aux, d_aux.data(),
                      static_cast<std::int64_t>(d_aux.size() * sizeof(float)));
  }
  const float z_scale =
      static_cast<float>(args.aux_grad_scale * cfg.z_loss_coeff / static_cast<double>(N));
  k::moe_router_backward(lc.ctx,
                         {.d_logits = view_of(lc, args.d_logits, {N, E}),
                          .d_weights = view_of(lc, args.d_weights, {N, K}),
                          .weights = view_of(lc, s.weights, {N, K}),
                          .d_aux = aux ? view_of(lc, args.d_aux, {groups, E}) : core::TensorView{},
                          .logits = view_of(lc, s.logits, {N, E}),
                          .scores = view_of(lc, s.scores, {N, E}),
                          .experts = view_of(lc, s.experts, {N, K}),
                          .lse = view_of(lc, s.lse, {N}),
                          .group_tokens = group,
                          .z_scale = z_scale,
                          .cfg = cfg.router});
  // The router's input gradient is the same on every tp rank: rank 0's joins the experts' partial
  // input gradients before their tp sum.
  const float* x = lc.region.enter(args.in, lc.ws.gathered);
  linear_backward(lc, {.d_in = lc.tp_rank() == 0 ? lc.ws.d_ln : nullptr,
                       .d_weight = g.router,
                       .d_out = args.d_logits,
                       .in = x,
                       .weight = p.router,
                       .rows = N,
                       .in_features = C,
                       .out_features = E});
  if (lc.tp_rank() != 0) k::zero_on_device(lc.ctx, lc.ws.d_ln, N * C * 4);  // no router part
  k::moe_permute_backward(lc.ctx, {.d_x = view_of(lc, lc.ws.d_ln, {N, C}),
                                   .d_x_perm = view_of(lc, args.d_perm, {used, C}),
                                   .rows = view_of(lc, s.rows_of, {N, K})});
  const float* d_in = lc.region.enter_backward(lc.ws.d_ln);  // the tp sum (SP: reduce-scatter)
  if (cfg.shared_ffn == 0) return d_in;
  // The routed and the shared experts' input gradients (the returned buffer is workspace).
  float* sum = const_cast<float*>(d_in);
  const core::TensorView v = view_of(lc, sum, {lc.local_rows(), C});
  k::add(lc.ctx, {.out = v, .a = v, .b = view_of(lc, args.d_shared_in, {lc.local_rows(), C})});
  return sum;
}

}  // namespace trident::model::layers
