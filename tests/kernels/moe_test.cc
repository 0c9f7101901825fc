// Mixture-of-experts routing (moe.h) on every backend of the loop against the reference, the
// reference's router backward against finite differences (double), and closed forms: hand-worked
// routings with capacity drops (both policies, padding), the token order within experts, and
// permute + unpermute giving back the tokens.
//
// Tolerances: scores, weights and lse are computed in double and rounded once: 1e-6 relative.
// The router's d_logits: double per token, rounded once (1e-6 relative, 1e-7 absolute). Permute is
// a copy (bitwise); unpermute sums k products in FP32 (1e-6); its d_weights are C-term dot
// products (double in the CPU body, FP32 partial sums allowed on the GPU: 1e-5).
// The integer outputs (experts, rows, counts, sources) must be equal on every backend.
#include "trident/kernels/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::fetch;
using testing::randn;
using testing::Tol;
using testing::view_of;

core::ExecContext ctx() { return testing::backend_ctx(); }

constexpr Tol kRouterTol{1e-7, 1e-6};

struct RouterCase {
  const char* name;
  MoeRouterConfig cfg;
  bool bias = false;
};

std::vector<RouterCase> router_cases() {
  return {
      {"softmax top1", {.topk = 1}},
      {"softmax top2", {.topk = 2}},
      {"softmax top3 scaled", {.topk = 3, .scaling = 2.5f}},
      {"pre-softmax top2", {.topk = 2, .pre_softmax = true}},
      {"sigmoid top1", {.topk = 1, .score = MoeScore::kSigmoid}},
      {"sigmoid top2 bias", {.topk = 2, .score = MoeScore::kSigmoid}, true},
      {"sigmoid top4 bias scaled", {.topk = 4, .score = MoeScore::kSigmoid, .scaling = 2.5f}, true},
      // Group-limited (8 experts): 4 groups of 2, one kept; 4 groups, two kept, top 4; 2 groups.
      {"softmax top2 groups 4/1", {.topk = 2, .num_groups = 4, .group_topk = 1}},
      {"softmax top4 groups 4/2", {.topk = 4, .num_groups = 4, .group_topk = 2}},
      {"pre-softmax top2 groups 2/1",
       {.topk = 2, .pre_softmax = true, .num_groups = 2, .group_topk = 1}},
      {"sigmoid top2 groups 4/2",
       {.topk = 2, .score = MoeScore::kSigmoid, .num_groups = 4, .group_topk = 2}},
      {"sigmoid top4 bias groups 4/2 scaled",
       {.topk = 4, .score = MoeScore::kSigmoid, .scaling = 2.5f, .num_groups = 4, .group_topk = 2},
       true},
  };
}

struct RouterOut {
  std::vector<float> scores, weights, lse;
  std::vector<std::int32_t> experts;
  RouterOut(std::int64_t N, std::int64_t E, std::int64_t k)
      : scores(N * E), weights(N * k), lse(N), experts(N * k) {}
};

TEST(Moe, RouterMatchesReference) {
  const std::int64_t N = 37, E = 8;
  std::uint64_t seed = 1;
  for (const RouterCase& c : router_cases()) {
    const std::int64_t k = c.cfg.topk;
    const auto logits = randn(N * E, seed++);
    const auto bias = randn(E, seed++, 0.3);
    RouterOut got(N, E, k), want(N, E, k);
    moe_router(ctx(), {.scores = view_of(got.scores, {N, E}),
                       .experts = view_of(got.experts, {N, k}),
                       .weights = view_of(got.weights, {N, k}),
                       .lse = view_of(got.lse, {N}),
                       .logits = view_of(logits, {N, E}),
                       .expert_bias = c.bias ? view_of(bias, {E}) : core::TensorView{},
                       .cfg = c.cfg});
    ref::moe_router_forward({.scores = want.scores.data(),
                             .experts = want.experts.data(),
                             .weights = want.weights.data(),
                             .lse = want.lse.data(),
                             .logits = logits.data(),
                             .expert_bias = c.bias ? bias.data() : nullptr,
                             .tokens = N,
                             .num_experts = E,
                             .cfg = c.cfg});
    EXPECT_EQ(fetch(got.experts), want.experts) << c.name;
    EXPECT_TRUE(
        all_close((std::string(c.name) + " scores").c_str(), got.scores, want.scores, kRouterTol));
    EXPECT_TRUE(all_close((std::string(c.name) + " weights").c_str(), got.weights, want.weights,
                          kRouterTol));
    EXPECT_TRUE(all_close((std::string(c.name) + " lse").c_str(), got.lse, want.lse, kRouterTol));
  }
}

// Closed forms on the reference: the choice order, the tie rule, the weights' normalisation.
TEST(Moe, RouterClosedForms) {
  const std::int64_t E = 4;
  // Token 0: a clear order 2 > 0 > 3 > 1. Token 1: all equal (ties to the lower expert).
  const std::vector<float> logits = {1.0f, -1.0f, 3.0f, 0.5f, 0.25f, 0.25f, 0.25f, 0.25f};
  RouterOut out(2, E, 2);
  moe_router(ctx(), {.scores = view_of(out.scores, {2, E}),
                     .experts = view_of(out.experts, {2, 2}),
                     .weights = view_of(out.weights, {2, 2}),
                     .logits = view_of(logits, {2, E}),
                     .cfg = {.topk = 2}});
  fetch(out.experts);
  fetch(out.weights);
  EXPECT_EQ(out.experts, (std::vector<std::int32_t>{2, 0, 0, 1}));
  // softmax over the chosen logits {3, 1}: 1 / (1 + e^-2), e^-2 / (1 + e^-2)
  EXPECT_NEAR(out.weights[0], 1.0 / (1.0 + std::exp(-2.0)), 1e-7);
  EXPECT_NEAR(out.weights[1], std::exp(-2.0) / (1.0 + std::exp(-2.0)), 1e-7);
  EXPECT_NEAR(out.weights[2], 0.5, 1e-7);
  EXPECT_NEAR(out.weights[3], 0.5, 1e-7);
  // pre-softmax: the weights are the full softmax's probabilities (0.25 each for token 1)
  moe_router(ctx(), {.scores = view_of(out.scores, {2, E}),
                     .experts = view_of(out.experts, {2, 2}),
                     .weights = view_of(out.weights, {2, 2}),
                     .logits = view_of(logits, {2, E}),
                     .cfg = {.topk = 2, .pre_softmax = true}});
  fetch(out.weights);
  EXPECT_NEAR(out.weights[2], 0.25, 1e-7);
  EXPECT_NEAR(out.weights[3], 0.25, 1e-7);
  // sigmoid with a bias that reorders the choice but not the weights (they are the scores)
  const std::vector<float> bias = {0.0f, 0.0f, -10.0f, 0.0f};
  moe_router(ctx(), {.scores = view_of(out.scores, {2, E}),
                     .experts = view_of(out.experts, {2, 2}),
                     .weights = view_of(out.weights, {2, 2}),
                     .logits = view_of(logits, {2, E}),
                     .expert_bias = view_of(bias, {E}),
                     .cfg = {.topk = 2, .score = MoeScore::kSigmoid}});
  fetch(out.experts);
  fetch(out.weights);
  EXPECT_EQ(out.experts[0], 0);
  EXPECT_EQ(out.experts[1], 3);
  const double s0 = 1 / (1 + std::exp(-1.0)), s3 = 1 / (1 + std::exp(-0.5));
  EXPECT_NEAR(out.weights[0], s0 / (s0 + s3), 1e-7);
  EXPECT_NEAR(out.weights[1], s3 / (s0 + s3), 1e-7);
}

// Group-limited routing's closed forms (DeepSeek-V3, Megatron-Core's group_limited_topk): 8
// experts in 4 groups of 2 with logits (5, -5 | 2, 2 | 4, -1 | 0, 0). Without groups the top 2
// are experts 0 and 4. Keeping one group, its score the sum of its top 2 (0 | 4 | 3 | 0): group 1,
// experts 2 and 3 (a tie: the lower first). Keeping two groups scored by their top 1
// (5 | 2 | 4 | 0): groups 0 and 2, experts 0 and 4.
TEST(Moe, GroupLimitedRoutingClosedForms) {
  const std::int64_t E = 8;
  const std::vector<float> logits = {5.0f, -5.0f, 2.0f, 2.0f, 4.0f, -1.0f, 0.0f, 0.0f};
  auto route = [&](MoeRouterConfig cfg) {
    RouterOut out(1, E, cfg.topk);
    moe_router(ctx(), {.scores = view_of(out.scores, {1, E}),
                       .experts = view_of(out.experts, {1, cfg.topk}),
                       .weights = view_of(out.weights, {1, cfg.topk}),
                       .logits = view_of(logits, {1, E}),
                       .cfg = cfg});
    fetch(out.weights);
    return std::pair(fetch(out.experts), out.weights);
  };
  EXPECT_EQ(route({.topk = 2}).first, (std::vector<std::int32_t>{0, 4}));
  const auto [one_group, w] = route({.topk = 2, .num_groups = 4, .group_topk = 1});
  EXPECT_EQ(one_group, (std::vector<std::int32_t>{2, 3}));
  EXPECT_NEAR(w[0], 0.5, 1e-7);  // softmax over the two chosen (equal) logits
  EXPECT_EQ(route({.topk = 2, .num_groups = 4, .group_topk = 2}).first,
            (std::vector<std::int32_t>{0, 4}));
  // Two groups kept, top 4 (scored by their top 2): groups 1 and 2, experts 4, 2, 3, 5.
  EXPECT_EQ(route({.topk = 4, .num_groups = 4, .group_topk = 2}).first,
            (std::vector<std::int32_t>{4, 2, 3, 5}));
  // A group count that does not divide the experts, or a group top-k that cannot hold k experts.
  RouterOut out(1, E, 2);
  for (const MoeRouterConfig& bad :
       {MoeRouterConfig{.topk = 2, .num_groups = 3, .group_topk = 1},
        MoeRouterConfig{.topk = 3, .num_groups = 4, .group_topk = 1}}) {
    const std::string e = testing::invalid_argument_of([&] {
      moe_router(ctx(), {.scores = view_of(out.scores, {1, E}),
                         .experts = testing::view_claiming(out.experts, {1, bad.topk}),
                         .weights = testing::view_claiming(out.weights, {1, bad.topk}),
                         .logits = view_of(logits, {1, E}),
                         .cfg = bad});
    });
    EXPECT_NE(e.find("group"), std::string::npos) << e;
  }
}

struct BackwardCase {
  RouterCase router;
  std::int64_t groups;  // of the load-balancing gradient (0: none)
  float z_scale;
};

std::vector<BackwardCase> backward_cases() {
  std::vector<BackwardCase> cases;
  for (const RouterCase& r : router_cases()) {
    const bool softmax = r.cfg.score == MoeScore::kSoftmax;
    cases.push_back({r, 0, 0.0f});
    cases.push_back({r, softmax ? 1 : 0, 1e-3f});
    if (softmax) cases.push_back({r, 3, 0.0f});  // per-sequence load balancing: 3 sequences
  }
  return cases;
}

TEST(Moe, RouterBackwardMatchesReference) {
  const std::int64_t N = 36, E = 8;
  std::uint64_t seed = 100;
  for (const BackwardCase& c : backward_cases()) {
    const MoeRouterConfig& cfg = c.router.cfg;
    const std::int64_t k = cfg.topk, G = c.groups;
    ASSERT_TRUE(G == 0 || N % G == 0);
    const auto logits = randn(N * E, seed++);
    const auto bias = randn(E, seed++, 0.3);
    RouterOut f(N, E, k);
    ref::moe_router_forward({.scores = f.scores.data(),
                             .experts = f.experts.data(),
                             .weights = f.weights.data(),
                             .lse = f.lse.data(),
                             .logits = logits.data(),
                             .expert_bias = c.router.bias ? bias.data() : nullptr,
                             .tokens = N,
                             .num_experts = E,
                             .cfg = cfg});
    const auto d_weights = randn(N * k, seed++);
    const auto d_aux = randn(std::max<std::int64_t>(G, 1) * E, seed++, 0.1);
    std::vector<float> got(N * E, 123.0f), want(N * E);
    moe_router_backward(ctx(), {.d_logits = view_of(got, {N, E}),
                                .d_weights = view_of(d_weights, {N, k}),
                                .weights = view_of(f.weights, {N, k}),
                                .d_aux = G > 0 ? view_of(d_aux, {G, E}) : core::TensorView{},
                                .logits = view_of(logits, {N, E}),
                                .scores = view_of(f.scores, {N, E}),
                                .experts = view_of(f.experts, {N, k}),
                                .lse = view_of(f.lse, {N}),
                                .group_tokens = G > 0 ? N / G : 0,
                                .z_scale = c.z_scale,
                                .cfg = cfg});
    ref::moe_router_backward({.d_logits = want.data(),
                              .d_weights = d_weights.data(),
                              .weights = f.weights.data(),
                              .d_aux = G > 0 ? d_aux.data() : nullptr,
                              .logits = logits.data(),
                              .scores = f.scores.data(),
                              .experts = f.experts.data(),
                              .lse = f.lse.data(),
                              .tokens = N,
                              .num_experts = E,
                              .group_tokens = G > 0 ? N / G : N,
                              .z_scale = c.z_scale,
                              .cfg = cfg});
    const std::string name = std::string(c.router.name) + " groups " + std::to_string(G) + " z " +
                             std::to_string(c.z_scale) + " d_logits";
    EXPECT_TRUE(all_close(name.c_str(), got, want, kRouterTol));
  }
}

// The reference backward in double against central differences of
//   L = sum d_weights . weights + sum d_aux . scores + z_scale sum lse^2
// with the choice held (logits spread so that no step of 1e-6 changes it).
TEST(Moe, RouterReferenceBackwardMatchesFiniteDifferences) {
  const std::int64_t N = 6, E = 5;
  std::uint64_t seed = 300;
  for (const BackwardCase& c : backward_cases()) {
    const MoeRouterConfig& cfg = c.router.cfg;
    const std::int64_t k = cfg.topk, G = c.groups;
    ASSERT_TRUE(G == 0 || N % G == 0);
    // distinct logits: a shuffled ladder 0.7 apart plus noise, so the top-k is stable
    std::vector<double> logits(N * E);
    const auto noise = randn<double>(N * E, seed++, 0.05);
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t e = 0; e < E; ++e) {
        logits[n * E + e] = 0.7 * static_cast<double>((e * 3 + n) % E) - 1.4 + noise[n * E + e];
      }
    }
    const auto bias = randn<double>(E, seed++, 0.01);
    const auto d_weights = randn<double>(N * k, seed++);
    const auto d_aux = randn<double>(std::max<std::int64_t>(G, 1) * E, seed++, 0.3);
    const double z_scale = c.z_scale == 0.0f ? 0.0 : 0.05;
    std::vector<double> scores(N * E), weights(N * k), lse(N);
    std::vector<std::int32_t> experts(N * k), held;
    auto forward = [&] {
      ref::moe_router_forward<double>({.scores = scores.data(),
                                       .experts = experts.data(),
                                       .weights = weights.data(),
                                       .lse = lse.data(),
                                       .logits = logits.data(),
                                       .expert_bias = c.router.bias ? bias.data() : nullptr,
                                       .tokens = N,
                                       .num_experts = E,
                                       .cfg = cfg});
    };
    forward();
    held = experts;
    auto loss = [&] {
      forward();
      EXPECT_EQ(experts, held) << "a finite-difference step changed the choice";
      double L = testing::dot(d_weights, weights);
      for (std::int64_t n = 0; G > 0 && n < N; ++n) {
        for (std::int64_t e = 0; e < E; ++e) L += d_aux[(n / (N / G)) * E + e] * scores[n * E + e];
      }
      for (double x : lse) L += z_scale * x * x;
      return L;
    };
    const auto numeric = testing::numeric_grad(logits, loss);
    forward();
    std::vector<double> d_logits(N * E);
    ref::moe_router_backward<double>({.d_logits = d_logits.data(),
                                      .d_weights = d_weights.data(),
                                      .weights = weights.data(),
                                      .d_aux = G > 0 ? d_aux.data() : nullptr,
                                      .logits = logits.data(),
                                      .scores = scores.data(),
                                      .experts = experts.data(),
                                      .lse = lse.data(),
                                      .tokens = N,
                                      .num_experts = E,
                                      .group_tokens = G > 0 ? N / G : N,
                                      .z_scale = z_scale,
                                      .cfg = cfg});
    const std::string name = std::string(c.router.name) + " groups " + std::to_string(G) + " z " +
                             std::to_string(z_scale) + " d_logits vs finite differences";
    EXPECT_TRUE(all_close(name.c_str(), d_logits, numeric, testing::kFiniteDiffTol));
  }
}

struct Map {
  std::vector<std::int32_t> rows, counts, sources;
};

Map dispatch(const std::vector<std::int32_t>& experts, const std::vector<float>& weights,
             std::int64_t N, std::int64_t k, std::int64_t E, std::int64_t capacity,
             MoeDropPolicy policy, bool pad, std::int64_t max_rows) {
  Map m{std::vector<std::int32_t>(N * k, 7), std::vector<std::int32_t>(E, 7),
        std::vector<std::int32_t>(max_rows, 7)};
  moe_dispatch_map(ctx(), {.rows = view_of(m.rows, {N, k}),
                           .counts = view_of(m.counts, {E}),
                           .sources = view_of(m.sources, {max_rows}),
                           .experts = view_of(experts, {N, k}),
                           .weights = view_of(weights, {N, k}),
                           .num_experts = E,
                           .capacity = capacity,
                           .policy = policy,
                           .pad_to_capacity = pad});
  fetch(m.rows);
  fetch(m.counts);
  fetch(m.sources);
  return m;
}

TEST(Moe, DispatchMapClosedForms) {
  // 5 tokens, top-1 of 2 experts: expert 1 chosen by tokens 0, 2, 3, 4, expert 0 by token 1.
  const std::vector<std::int32_t> experts = {1, 0, 1, 1, 1};
  const std::vector<float> weights = {0.9f, 0.6f, 0.1f, 0.8f, 0.8f};
  using P = MoeDropPolicy;
  Map m = dispatch(experts, weights, 5, 1, 2, 0, P::kProbs, false, 6);  // dropless
  EXPECT_EQ(m.counts, (std::vector<std::int32_t>{1, 4}));
  EXPECT_EQ(m.rows, (std::vector<std::int32_t>{1, 0, 2, 3, 4}));
  EXPECT_EQ(m.sources, (std::vector<std::int32_t>{1, 0, 2, 3, 4, -1}));
  // capacity 2, by position: expert 1 keeps tokens 0 and 2
  m = dispatch(experts, weights, 5, 1, 2, 2, P::kPosition, false, 5);
  EXPECT_EQ(m.counts, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(m.rows, (std::vector<std::int32_t>{1, 0, 2, -1, -1}));
  EXPECT_EQ(m.sources, (std::vector<std::int32_t>{1, 0, 2, -1, -1}));
  // capacity 2, by probability: 0.9 (token 0), then 0.8 twice: the earlier token 3 wins; rows in
  // token order
  m = dispatch(experts, weights, 5, 1, 2, 2, P::kProbs, false, 5);
  EXPECT_EQ(m.rows, (std::vector<std::int32_t>{1, 0, -1, 2, -1}));
  EXPECT_EQ(m.sources, (std::vector<std::int32_t>{1, 0, 3, -1, -1}));
  // padded to capacity 2: expert 0's rows 0-1 (one padding), expert 1's rows 2-3
  m = dispatch(experts, weights, 5, 1, 2, 2, P::kProbs, true, 4);
  EXPECT_EQ(m.counts, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(m.rows, (std::vector<std::int32_t>{2, 0, -1, 3, -1}));
  EXPECT_EQ(m.sources, (std::vector<std::int32_t>{1, -1, 0, 3}));
  // top-2: token n's choices (n, j) = 2n + j
  const std::vector<std::int32_t> two = {0, 1, 1, 0, 0, 2};
  const std::vector<float> w2(6, 0.5f);
  m = dispatch(two, w2, 3, 2, 3, 0, P::kProbs, false, 6);
  EXPECT_EQ(m.counts, (std::vector<std::int32_t>{3, 2, 1}));
  EXPECT_EQ(m.rows, (std::vector<std::int32_t>{0, 3, 4, 1, 2, 5}));
  EXPECT_EQ(m.sources, (std::vector<std::int32_t>{0, 3, 4, 1, 2, 5}));
}

struct MapCase {
  std::int64_t capacity;
  MoeDropPolicy policy;
  bool pad;
};

TEST(Moe, DispatchPermuteUnpermuteMatchReference) {
  const std::int64_t N = 53, E = 6, k = 2, C = 19;
  const MapCase cases[] = {{0, MoeDropPolicy::kProbs, false},
                           {12, MoeDropPolicy::kProbs, false},
                           {12, MoeDropPolicy::kPosition, false},
                           {14, MoeDropPolicy::kProbs, true},
                           {30, MoeDropPolicy::kPosition, true}};
  std::uint64_t seed = 500;
  for (const MapCase& c : cases) {
    const std::string name = "capacity " + std::to_string(c.capacity) +
                             (c.policy == MoeDropPolicy::kProbs ? " probs" : " position") +
                             (c.pad ? " padded" : "");
    // a skewed router so that some experts overflow
    auto logits = randn(N * E, seed++);
    for (std::int64_t n = 0; n < N; ++n) logits[n * E] += 1.0f;
    RouterOut r(N, E, k);
    ref::moe_router_forward({.scores = r.scores.data(),
                             .experts = r.experts.data(),
                             .weights = r.weights.data(),
                             .logits = logits.data(),
                             .tokens = N,
                             .num_experts = E,
                             .cfg = {.topk = k}});
    const std::int64_t max_rows = (c.pad ? E * c.capacity : N * k) + 3;
    const Map got = dispatch(r.experts, r.weights, N, k, E, c.capacity, c.policy, c.pad, max_rows);
    Map want{std::vector<std::int32_t>(N * k), std::vector<std::int32_t>(E),
             std::vector<std::int32_t>(max_rows)};
    ref::moe_dispatch_map({.rows = want.rows.data(),
                           .counts = want.counts.data(),
                           .sources = want.sources.data(),
                           .experts = r.experts.data(),
                           .weights = r.weights.data(),
                           .tokens = N,
                           .num_experts = E,
                           .topk = k,
                           .capacity = c.capacity,
                           .policy = c.policy,
                           .pad_to_capacity = c.pad,
                           .max_rows = max_rows});
    EXPECT_EQ(got.rows, want.rows) << name;
    EXPECT_EQ(got.counts, want.counts) << name;
    EXPECT_EQ(got.sources, want.sources) << name;
    std::int64_t kept = 0, dropped = 0;
    for (std::int32_t row : want.rows) (row < 0 ? dropped : kept) += 1;
    if (c.capacity == 12) {
      EXPECT_GT(dropped, 0) << name << ": the case should drop tokens";
    }
    std::int64_t R = 0;
    for (std::int32_t x : want.counts) R += x;
    EXPECT_EQ(R, kept) << name;
    if (c.pad) R = E * c.capacity;

    const auto x = randn(N * C, seed++);
    std::vector<float> x_perm(R * C, 5.0f), x_perm_ref(R * C);
    moe_permute(ctx(), {.x_perm = view_of(x_perm, {R, C}),
                        .x = view_of(x, {N, C}),
                        .sources = view_of(got.sources, {max_rows}),
                        .topk = k});
    ref::moe_permute({.x_perm = x_perm_ref.data(),
                      .x = x.data(),
                      .sources = want.sources.data(),
                      .tokens = N,
                      .hidden = C,
                      .topk = k,
                      .rows_out = R});
    EXPECT_TRUE(testing::all_equal((name + " x_perm").c_str(), x_perm, x_perm_ref));

    auto d_x = randn(N * C, seed++);
    auto d_x_ref = d_x;
    const auto d_x_perm = randn(R * C, seed++);
    moe_permute_backward(ctx(), {.d_x = view_of(d_x, {N, C}),
                                 .d_x_perm = view_of(d_x_perm, {R, C}),
                                 .rows = view_of(got.rows, {N, k})});
    ref::moe_permute_backward({.d_x = d_x_ref.data(),
                               .d_x_perm = d_x_perm.data(),
                               .rows = want.rows.data(),
                               .tokens = N,
                               .hidden = C,
                               .topk = k,
                               .rows_out = R});
    EXPECT_TRUE(all_close((name + " d_x").c_str(), d_x, d_x_ref, {1e-6, 1e-6}));

    const auto y_perm = randn(R * C, seed++);
    std::vector<float> out(N * C, 5.0f), out_ref(N * C);
    moe_unpermute(ctx(), {.out = view_of(out, {N, C}),
                          .y_perm = view_of(y_perm, {R, C}),
                          .weights = view_of(r.weights, {N, k}),
                          .rows = view_of(got.rows, {N, k})});
    ref::moe_unpermute({.out = out_ref.data(),
                        .y_perm = y_perm.data(),
                        .weights = r.weights.data(),
                        .rows = want.rows.data(),
                        .tokens = N,
                        .hidden = C,
                        .topk = k,
                        .rows_out = R});
    EXPECT_TRUE(all_close((name + " out").c_str(), out, out_ref, {1e-6, 1e-6}));

    const auto d_out = randn(N * C, seed++);
    std::vector<float> d_y(R * C, 5.0f), d_y_ref(R * C), d_w(N * k, 5.0f), d_w_ref(N * k);
    moe_unpermute_backward(ctx(), {.d_y_perm = view_of(d_y, {R, C}),
                                   .d_weights = view_of(d_w, {N, k}),
                                   .d_out = view_of(d_out, {N, C}),
                                   .y_perm = view_of(y_perm, {R, C}),
                                   .weights = view_of(r.weights, {N, k}),
                                   .rows = view_of(got.rows, {N, k}),
                                   .sources = view_of(got.sources, {max_rows})});
    ref::moe_unpermute_backward({.d_y_perm = d_y_ref.data(),
                                 .d_weights = d_w_ref.data(),
                                 .d_out = d_out.data(),
                                 .y_perm = y_perm.data(),
                                 .weights = r.weights.data(),
                                 .rows = want.rows.data(),
                                 .sources = want.sources.data(),
                                 .tokens = N,
                                 .hidden = C,
                                 .topk = k,
                                 .rows_out = R});
    EXPECT_TRUE(all_close((name + " d_y_perm").c_str(), d_y, d_y_ref, {1e-6, 1e-6}));
    EXPECT_TRUE(all_close((name + " d_weights").c_str(), d_w, d_w_ref, {1e-5, 1e-5}));
  }
}

// Dropless, identity experts: unpermute(permute(x)) = x * sum_j weights[n, j] = x for the
// normalised top-k softmax.
TEST(Moe, PermuteThenUnpermuteGivesTheTokensBack) {
  const std::int64_t N = 29, E = 5, k = 3, C = 8;
  const auto logits = randn(N * E, 900);
  RouterOut r(N, E, k);
  moe_router(ctx(), {.scores = view_of(r.scores, {N, E}),
                     .experts = view_of(r.experts, {N, k}),
                     .weights = view_of(r.weights, {N, k}),
                     .logits = view_of(logits, {N, E}),
                     .cfg = {.topk = k}});
  const Map m =
      dispatch(fetch(r.experts), fetch(r.weights), N, k, E, 0, MoeDropPolicy::kProbs, false, N * k);
  const auto x = randn(N * C, 901);
  std::vector<float> x_perm(N * k * C), out(N * C);
  moe_permute(ctx(), {.x_perm = view_of(x_perm, {N * k, C}),
                      .x = view_of(x, {N, C}),
                      .sources = view_of(m.sources, {N * k}),
                      .topk = k});
  moe_unpermute(ctx(), {.out = view_of(out, {N, C}),
                        .y_perm = view_of(x_perm, {N * k, C}),
                        .weights = view_of(r.weights, {N, k}),
                        .rows = view_of(m.rows, {N, k})});
  EXPECT_TRUE(all_close("unpermute(permute(x))", out, x, {1e-6, 1e-6}));
  // each expert's rows hold its tokens in token order
  for (std::int64_t row = 1; row < N * k; ++row) {
    const std::int32_t a = m.sources[row - 1], b = m.sources[row];
    if (r.experts[a] == r.experts[b]) {
      EXPECT_LT(a / k, b / k) << "row " << row;
    }
    EXPECT_LE(r.experts[a], r.experts[b]) << "row " << row;
  }
}

// Qwen2-MoE's shared-expert gate against the reference on every backend, and the reference's
// backward against central finite differences in double: L = sum(out * w) with random w.
TEST(Moe, SharedGateMatchesReferenceAndFiniteDifferences) {
  const std::int64_t N = 37, C = 45;
  const auto shared = randn(N * C, 950), base = randn(N * C, 951), d_out = randn(N * C, 952);
  auto logits = randn(N, 953);
  logits[0] = 30.0f;  // saturated: the gate passes everything
  logits[1] = -30.0f;
  std::vector<float> out = base, out_ref = base;
  moe_shared_gate(ctx(), {.out = view_of(out, {N, C}),
                          .shared = view_of(shared, {N, C}),
                          .logits = view_of(logits, {N})});
  ref::moe_shared_gate_forward<float>({.out = out_ref.data(),
                                       .shared = shared.data(),
                                       .logits = logits.data(),
                                       .tokens = N,
                                       .hidden = C});
  EXPECT_TRUE(all_close("shared gate out", fetch(out), out_ref, {1e-6, 1e-6}));
  std::vector<float> d_shared(N * C), d_logits(N), d_shared_ref(N * C), d_logits_ref(N);
  moe_shared_gate_backward(ctx(), {.d_shared = view_of(d_shared, {N, C}),
                                   .d_logits = view_of(d_logits, {N}),
                                   .d_out = view_of(d_out, {N, C}),
                                   .shared = view_of(shared, {N, C}),
                                   .logits = view_of(logits, {N})});
  ref::moe_shared_gate_backward<float>({.d_shared = d_shared_ref.data(),
                                        .d_logits = d_logits_ref.data(),
                                        .d_out = d_out.data(),
                                        .shared = shared.data(),
                                        .logits = logits.data(),
                                        .tokens = N,
                                        .hidden = C});
  EXPECT_TRUE(all_close("d_shared", fetch(d_shared), d_shared_ref, {1e-6, 1e-6}));
  EXPECT_TRUE(all_close("d_logits", fetch(d_logits), d_logits_ref, {1e-5, 1e-6}));
  // Finite differences of the double reference.
  std::vector<double> s64(shared.begin(), shared.end()), l64(logits.begin(), logits.end()),
      w64(d_out.begin(), d_out.end());
  auto loss = [&](const std::vector<double>& s, const std::vector<double>& l) {
    std::vector<double> o(static_cast<std::size_t>(N * C), 0.0);
    ref::moe_shared_gate_forward<double>(
        {.out = o.data(), .shared = s.data(), .logits = l.data(), .tokens = N, .hidden = C});
    double sum = 0;
    for (std::size_t i = 0; i < o.size(); ++i) sum += o[i] * w64[i];
    return sum;
  };
  std::vector<double> ds(static_cast<std::size_t>(N * C)), dl(static_cast<std::size_t>(N));
  ref::moe_shared_gate_backward<double>({.d_shared = ds.data(),
                                         .d_logits = dl.data(),
                                         .d_out = w64.data(),
                                         .shared = s64.data(),
                                         .logits = l64.data(),
                                         .tokens = N,
                                         .hidden = C});
  const double h = 1e-6;
  for (std::int64_t n : {2, 7, 36}) {
    auto lp = l64, lm = l64;
    lp[static_cast<std::size_t>(n)] += h;
    lm[static_cast<std::size_t>(n)] -= h;
    const double fd = (loss(s64, lp) - loss(s64, lm)) / (2 * h);
    EXPECT_NEAR(dl[static_cast<std::size_t>(n)], fd, 1e-7 + 1e-6 * std::abs(fd)) << "logit " << n;
    auto sp = s64, sm = s64;
    const auto i = static_cast<std::size_t>(n * C + 3);
    sp[i] += h;
    sm[i] -= h;
    const double fds = (loss(sp, l64) - loss(sm, l64)) / (2 * h);
    EXPECT_NEAR(ds[i], fds, 1e-7 + 1e-6 * std::abs(fds)) << "shared " << i;
  }
}

TEST(Moe, WrongViewsAreClearErrors) {
  const std::int64_t N = 4, E = 3;
  const std::vector<float> logits(N * E), scores(N * E), weights(N * 2);
  const std::vector<std::int32_t> experts(N * 2);
  const std::vector<float> bad_experts(N * 2);
  auto router = [&](MoeRouterConfig cfg, const core::TensorView& e) {
    return testing::invalid_argument_of([&] {
      moe_router(ctx(), {.scores = view_of(scores, {N, E}),
                         .experts = e,
                         .weights = view_of(weights, {N, 2}),
                         .logits = view_of(logits, {N, E}),
                         .cfg = cfg});
    });
  };
  EXPECT_EQ(router({.topk = 2}, view_of(experts, {N, 2})), "no error");
  EXPECT_NE(router({.topk = 2}, view_of(bad_experts, {N, 2})).find("experts"), std::string::npos);
  EXPECT_NE(router({.topk = 4}, view_of(experts, {N, 2})).find("top-k is 4 with 3 experts"),
            std::string::npos);
  EXPECT_NE(router({.topk = 2, .score = MoeScore::kSigmoid, .pre_softmax = true},
                   view_of(experts, {N, 2}))
                .find("pre_softmax"),
            std::string::npos);
  std::vector<std::int32_t> rows(N * 2), counts(E), sources(5);
  const std::string short_sources = testing::invalid_argument_of([&] {
    moe_dispatch_map(ctx(), {.rows = view_of(rows, {N, 2}),
                             .counts = view_of(counts, {E}),
                             .sources = view_of(sources, {5}),
                             .experts = view_of(experts, {N, 2}),
                             .num_experts = E});
  });
  EXPECT_NE(short_sources.find("sources holds 5 rows; this routing needs 8"), std::string::npos)
      << short_sources;
}

}  // namespace
}  // namespace trident::kernels
