// Backend dispatch of moe.h: the views' checks and the device switch (TRIDENT_DISPATCH); the CPU
// bodies are in kernels/cpu/moe.cc (one per instruction-set variant), the CUDA ones in
// kernels/cuda/moe.cu, the reference in kernels/ref/moe_ref.cc.
#include "trident/kernels/moe.h"

#include <limits>

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

namespace {

using core::DType;
using detail::check_optional_view;
using detail::check_rank;
using detail::check_view;
using detail::check_views;

void check_router_config(const char* op, const MoeRouterConfig& c, std::int64_t E) {
  TRIDENT_CHECK(c.topk >= 1 && c.topk <= E, op, ": top-k is ", c.topk, " with ", E,
                " experts; it must be in [1, num_experts]");
  TRIDENT_CHECK(c.score == MoeScore::kSoftmax || c.score == MoeScore::kSigmoid, op,
                ": unknown score function ", static_cast<int>(c.score));
  TRIDENT_CHECK(!(c.pre_softmax && c.score == MoeScore::kSigmoid), op,
                ": pre_softmax applies to the softmax score function only");
  TRIDENT_CHECK(c.scaling > 0.0f, op, ": the top-k scaling factor is ", c.scaling,
                "; it must be > 0");
  if (c.num_groups <= 1) return;
  const std::int64_t G = c.num_groups;
  TRIDENT_CHECK(G <= kMoeMaxGroups && E % G == 0, op, ": ", G, " expert groups for ", E,
                " experts; the groups must divide the experts and be at most ", kMoeMaxGroups);
  TRIDENT_CHECK(c.group_topk >= 1 && c.group_topk <= G && c.topk % c.group_topk == 0 &&
                    c.topk <= c.group_topk * (E / G),
                op, ": group top-k ", c.group_topk, " with ", G, " groups of ", E / G,
                " experts and top-k ", c.topk,
                ": it must be in [1, groups], divide top-k, and its groups must hold k experts");
}

// Every row index an op reads must be a valid int32 row; sizes fit int32 so the indices do.
void check_fits_int32(const char* op, const char* what, std::int64_t n) {
  TRIDENT_CHECK(n <= std::numeric_limits<std::int32_t>::max(), op, ": ", what, " = ", n,
                " does not fit the int32 indices");
}

}  // namespace

void moe_router(const core::ExecContext& ctx, const MoeRouterViews& v) {
  constexpr const char* op = "moe_router";
  check_rank(op, "logits", v.logits, 2);
  const std::int64_t N = v.logits.shape[0], E = v.logits.shape[1], k = v.cfg.topk;
  check_router_config(op, v.cfg, E);
  check_views(op, ctx, DType::kF32, {N, E}, {{"logits", v.logits}, {"scores", v.scores}});
  check_view(op, "weights", v.weights, DType::kF32, {N, k}, ctx);
  check_view(op, "experts", v.experts, DType::kI32, {N, k}, ctx);
  check_optional_view(op, "lse", v.lse, DType::kF32, {N}, ctx);
  check_optional_view(op, "expert_bias", v.expert_bias, DType::kF32, {E}, ctx);
  TRIDENT_CHECK(v.expert_bias.empty() || v.cfg.score == MoeScore::kSigmoid, op,
                ": an expert bias needs the sigmoid score function");
  const MoeRouterForwardArgs args{.scores = v.scores.as<float>(),
                                  .experts = v.experts.as<std::int32_t>(),
                                  .weights = v.weights.as<float>(),
                                  .lse = detail::data_or_null<float>(v.lse),
                                  .logits = v.logits.as<float>(),
                                  .expert_bias = detail::data_or_null<float>(v.expert_bias),
                                  .tokens = N,
                                  .num_experts = E,
                                  .cfg = v.cfg};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * 2 * N * E);
  TRIDENT_DISPATCH(moe_router_forward, ctx, args);
}

void moe_router_backward(const core::ExecContext& ctx, const MoeRouterBackwardViews& v) {
  constexpr const char* op = "moe_router_backward";
  check_rank(op, "logits", v.logits, 2);
  const std::int64_t N = v.logits.shape[0], E = v.logits.shape[1], k = v.cfg.topk;
  check_router_config(op, v.cfg, E);
  check_views(op, ctx, DType::kF32, {N, E},
              {{"logits", v.logits}, {"scores", v.scores}, {"d_logits", v.d_logits}});
  check_views(op, ctx, DType::kF32, {N, k}, {{"d_weights", v.d_weights}, {"weights", v.weights}});
  check_view(op, "experts", v.experts, DType::kI32, {N, k}, ctx);
  const std::int64_t group = v.group_tokens == 0 ? N : v.group_tokens;
  TRIDENT_CHECK(group > 0 && N % group == 0, op, ": group_tokens ", v.group_tokens,
                " must divide the ", N, " tokens");
  check_optional_view(op, "d_aux", v.d_aux, DType::kF32, {N / group, E}, ctx);
  TRIDENT_CHECK(v.d_aux.empty() || v.cfg.score == MoeScore::kSoftmax, op,
                ": the load-balancing gradient d_aux needs the softmax score function");
  if (v.z_scale != 0.0f) {
    check_view(op, "lse", v.lse, DType::kF32, {N}, ctx, " (the z-loss needs the forward's lse)");
  }
  const MoeRouterBackwardArgs args{.d_logits = v.d_logits.as<float>(),
                                   .d_weights = v.d_weights.as<float>(),
                                   .weights = v.weights.as<float>(),
                                   .d_aux = detail::data_or_null<float>(v.d_aux),
                                   .logits = v.logits.as<float>(),
                                   .scores = v.scores.as<float>(),
                                   .experts = v.experts.as<std::int32_t>(),
                                   .lse = detail::data_or_null<float>(v.lse),
                                   .tokens = N,
                                   .num_experts = E,
                                   .group_tokens = group,
                                   .z_scale = v.z_scale,
                                   .cfg = v.cfg};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * 3 * N * E);
  TRIDENT_DISPATCH(moe_router_backward, ctx, args);
}

void moe_dispatch_map(const core::ExecContext& ctx, const MoeDispatchMapViews& v) {
  constexpr const char* op = "moe_dispatch_map";
  check_rank(op, "experts", v.experts, 2);
  check_rank(op, "sources", v.sources, 1);
  const std::int64_t N = v.experts.shape[0], k = v.experts.shape[1], E = v.num_experts;
  const std::int64_t max_rows = v.sources.shape[0];
  TRIDENT_CHECK(E >= 1 && k <= E, op, ": ", E, " experts with top-k ", k);
  TRIDENT_CHECK(v.capacity >= 0, op, ": capacity ", v.capacity, " must be >= 0 (0: dropless)");
  TRIDENT_CHECK(!v.pad_to_capacity || v.capacity > 0, op,
                ": padding to capacity needs a capacity (> 0)");
  TRIDENT_CHECK(v.policy == MoeDropPolicy::kProbs || v.policy == MoeDropPolicy::kPosition, op,
                ": unknown drop policy ", static_cast<int>(v.policy));
  const std::int64_t need = v.pad_to_capacity ? E * v.capacity : N * k;
  TRIDENT_CHECK(max_rows >= need, op, ": sources holds ", max_rows, " rows; this routing needs ",
                need, v.pad_to_capacity ? " (experts x capacity)" : " (tokens x top-k)");
  check_fits_int32(op, "the permuted rows", max_rows);
  check_fits_int32(op, "tokens x top-k", N * k);
  check_views(op, ctx, DType::kI32, {N, k}, {{"experts", v.experts}, {"rows", v.rows}});
  check_view(op, "counts", v.counts, DType::kI32, {E}, ctx);
  check_view(op, "sources", v.sources, DType::kI32, {max_rows}, ctx);
  const bool by_probs = v.capacity > 0 && v.policy == MoeDropPolicy::kProbs;
  if (by_probs) {
    check_view(op, "weights", v.weights, DType::kF32, {N, k}, ctx,
               " (dropping by probability reads the weights)");
  } else {
    check_optional_view(op, "weights", v.weights, DType::kF32, {N, k}, ctx);
  }
  const MoeDispatchMapArgs args{.rows = v.rows.as<std::int32_t>(),
                                .counts = v.counts.as<std::int32_t>(),
                                .sources = v.sources.as<std::int32_t>(),
                                .experts = v.experts.as<std::int32_t>(),
                                .weights = detail::data_or_null<float>(v.weights),
                                .tokens = N,
                                .num_experts = E,
                                .topk = k,
                                .capacity = v.capacity,
                                .policy = v.policy,
                                .pad_to_capacity = v.pad_to_capacity,
                                .max_rows = max_rows};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0,
                                  4.0 * (3 * N * k + max_rows));
  TRIDENT_DISPATCH(moe_dispatch_map, ctx, args);
}

void moe_permute(const core::ExecContext& ctx, const MoePermuteViews& v) {
  constexpr const char* op = "moe_permute";
  check_rank(op, "x", v.x, 2);
  check_rank(op, "x_perm", v.x_perm, 2);
  check_rank(op, "sources", v.sources, 1);
  const std::int64_t N = v.x.shape[0], C = v.x.shape[1], R = v.x_perm.shape[0];
  TRIDENT_CHECK(v.topk >= 1, op, ": top-k ", v.topk, " must be >= 1");
  TRIDENT_CHECK(v.sources.shape[0] >= R, op, ": sources holds ", v.sources.shape[0],
                " rows, x_perm ", R);
  check_view(op, "x", v.x, DType::kF32, {N, C}, ctx);
  check_view(op, "x_perm", v.x_perm, DType::kF32, {R, C}, ctx);
  check_view(op, "sources", v.sources, DType::kI32, {v.sources.shape[0]}, ctx);
  const MoePermuteArgs args{.x_perm = v.x_perm.as<float>(),
                            .x = v.x.as<float>(),
                            .sources = v.sources.as<std::int32_t>(),
                            .tokens = N,
                            .hidden = C,
                            .topk = v.topk,
                            .rows_out = R};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * 2 * R * C);
  TRIDENT_DISPATCH(moe_permute, ctx, args);
}

void moe_permute_backward(const core::ExecContext& ctx, const MoePermuteBackwardViews& v) {
  constexpr const char* op = "moe_permute_backward";
  check_rank(op, "d_x", v.d_x, 2);
  check_rank(op, "d_x_perm", v.d_x_perm, 2);
  check_rank(op, "rows", v.rows, 2);
  const std::int64_t N = v.d_x.shape[0], C = v.d_x.shape[1], R = v.d_x_perm.shape[0];
  const std::int64_t k = v.rows.shape[1];
  check_view(op, "d_x", v.d_x, DType::kF32, {N, C}, ctx);
  check_view(op, "d_x_perm", v.d_x_perm, DType::kF32, {R, C}, ctx);
  check_view(op, "rows", v.rows, DType::kI32, {N, k}, ctx);
  const MoePermuteBackwardArgs args{.d_x = v.d_x.as<float>(),
                                    .d_x_perm = v.d_x_perm.as<float>(),
                                    .rows = v.rows.as<std::int32_t>(),
                                    .tokens = N,
                                    .hidden = C,
                                    .topk = k,
                                    .rows_out = R};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * (2 * N + R) * C);
  TRIDENT_DISPATCH(moe_permute_backward, ctx, args);
}

void moe_unpermute(const core::ExecContext& ctx, const MoeUnpermuteViews& v) {
  constexpr const char* op = "moe_unpermute";
  check_rank(op, "out", v.out, 2);
  check_rank(op, "y_perm", v.y_perm, 2);
  check_rank(op, "rows", v.rows, 2);
  const std::int64_t N = v.out.shape[0], C = v.out.shape[1], R = v.y_perm.shape[0];
  const std::int64_t k = v.rows.shape[1];
  check_view(op, "out", v.out, DType::kF32, {N, C}, ctx);
  check_view(op, "y_perm", v.y_perm, DType::kF32, {R, C}, ctx);
  check_view(op, "weights", v.weights, DType::kF32, {N, k}, ctx);
  check_view(op, "rows", v.rows, DType::kI32, {N, k}, ctx);
  const MoeUnpermuteArgs args{.out = v.out.as<float>(),
                              .y_perm = v.y_perm.as<float>(),
                              .weights = v.weights.as<float>(),
                              .rows = v.rows.as<std::int32_t>(),
                              .tokens = N,
                              .hidden = C,
                              .topk = k,
                              .rows_out = R};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * (N + R) * C);
  TRIDENT_DISPATCH(moe_unpermute, ctx, args);
}

void moe_unpermute_backward(const core::ExecContext& ctx, const MoeUnpermuteBackwardViews& v) {
  constexpr const char* op = "moe_unpermute_backward";
  check_rank(op, "d_out", v.d_out, 2);
  check_rank(op, "y_perm", v.y_perm, 2);
  check_rank(op, "rows", v.rows, 2);
  check_rank(op, "sources", v.sources, 1);
  const std::int64_t N = v.d_out.shape[0], C = v.d_out.shape[1], R = v.y_perm.shape[0];
  const std::int64_t k = v.rows.shape[1];
  TRIDENT_CHECK(v.sources.shape[0] >= R, op, ": sources holds ", v.sources.shape[0],
                " rows, y_perm ", R);
  check_view(op, "d_out", v.d_out, DType::kF32, {N, C}, ctx);
  check_views(op, ctx, DType::kF32, {R, C}, {{"y_perm", v.y_perm}, {"d_y_perm", v.d_y_perm}});
  check_views(op, ctx, DType::kF32, {N, k}, {{"weights", v.weights}, {"d_weights", v.d_weights}});
  check_view(op, "rows", v.rows, DType::kI32, {N, k}, ctx);
  check_view(op, "sources", v.sources, DType::kI32, {v.sources.shape[0]}, ctx);
  const MoeUnpermuteBackwardArgs args{.d_y_perm = v.d_y_perm.as<float>(),
                                      .d_weights = v.d_weights.as<float>(),
                                      .d_out = v.d_out.as<float>(),
                                      .y_perm = v.y_perm.as<float>(),
                                      .weights = v.weights.as<float>(),
                                      .rows = v.rows.as<std::int32_t>(),
                                      .sources = v.sources.as<std::int32_t>(),
                                      .tokens = N,
                                      .hidden = C,
                                      .topk = k,
                                      .rows_out = R};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * (N + 2 * R) * C);
  TRIDENT_DISPATCH(moe_unpermute_backward, ctx, args);
}

void moe_shared_gate_forward(const core::ExecContext& ctx, const MoeSharedGateArgs& args) {
  TRIDENT_DISPATCH(moe_shared_gate_forward, ctx, args);
}

void moe_shared_gate(const core::ExecContext& ctx, const MoeSharedGateViews& v) {
  constexpr const char* op = "moe_shared_gate";
  check_rank(op, "out", v.out, 2);
  const std::int64_t N = v.out.shape[0], C = v.out.shape[1];
  check_views(op, ctx, DType::kF32, {N, C}, {{"out", v.out}, {"shared", v.shared}});
  check_view(op, "logits", v.logits, DType::kF32, {N}, ctx);
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * 3 * N * C);
  moe_shared_gate_forward(ctx, {.out = v.out.as<float>(),
                                .shared = v.shared.as<float>(),
                                .logits = v.logits.as<float>(),
                                .tokens = N,
                                .hidden = C});
}

void moe_shared_gate_backward(const core::ExecContext& ctx, const MoeSharedGateBackwardViews& v) {
  constexpr const char* op = "moe_shared_gate_backward";
  check_rank(op, "d_out", v.d_out, 2);
  const std::int64_t N = v.d_out.shape[0], C = v.d_out.shape[1];
  check_views(op, ctx, DType::kF32, {N, C},
              {{"d_out", v.d_out}, {"shared", v.shared}, {"d_shared", v.d_shared}});
  check_views(op, ctx, DType::kF32, {N}, {{"logits", v.logits}, {"d_logits", v.d_logits}});
  const MoeSharedGateBackwardArgs args{.d_shared = v.d_shared.as<float>(),
                                       .d_logits = v.d_logits.as<float>(),
                                       .d_out = v.d_out.as<float>(),
                                       .shared = v.shared.as<float>(),
                                       .logits = v.logits.as<float>(),
                                       .tokens = N,
                                       .hidden = C};
  const core::profile::Scope prof(core::profile::Kind::kMemory, op, 0, 4.0 * 3 * N * C);
  TRIDENT_DISPATCH(moe_shared_gate_backward, ctx, args);
}

}  // namespace trident::kernels
