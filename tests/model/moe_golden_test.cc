// Golden test of the mixture-of-experts layer (model/layers/moe.h) against transformers' own
// sparse MoE blocks (tests/reference/moe_reference.py, float64): Mixtral's (softmax, top-2 and
// top-1, renormalised) and Qwen2-MoE's (the full softmax's top-k, not renormalised: Megatron's
// --moe-router-pre-softmax). Compared: the output, the router logits, the gradients of the input,
// the router and every expert's matrices under sum(out * d_out) + the load-balancing loss + the
// router z-loss (their coefficients non-zero), and the two auxiliary losses' values.
// `--dump PATH --variant V` writes the inputs; `--inputs IN --reference REF --variant V` runs
// trident's layer on the CPU (FP32) and compares.
//
// Tolerance: |x - ref| <= 2e-5 + 2e-5 |ref| (FP32 matmuls over C = 16 to 32 terms and softmaxes
// against float64; transformers rounds the routing weights to FP32 in its softmax).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "support/tensor_file.h"
#include "trident/model/layers/moe.h"

namespace trident::model::layers {
namespace {

using trident::testing::find_tensor;
using trident::testing::make_f32_tensor;
using trident::testing::NamedTensor;

std::string g_dump, g_inputs, g_reference, g_variant;

struct Variant {
  std::int64_t B = 2, T = 8, C = 16, E = 4, K = 2, F = 12;
  bool pre_softmax = false;
  std::int64_t S = 0;  // shared experts' size (with Qwen2-MoE's gate), 0: none
  double aux_coeff = 0.1, z_coeff = 0.01;
};

Variant variant_of(const std::string& name) {
  if (name == "mixtral") return {};
  if (name == "mixtral_top1") return {.C = 24, .E = 3, .K = 1, .F = 20};
  if (name == "qwen2") return {.E = 6, .K = 2, .F = 10, .pre_softmax = true, .S = 14};
  throw std::runtime_error("unknown variant " + name);
}

std::vector<float> randn(std::int64_t n, std::uint64_t seed, double stddev) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(dist(gen));
  return v;
}

int dump(const std::string& path) {
  const Variant v = variant_of(g_variant);
  const std::int64_t N = v.B * v.T;
  trident::testing::write_tensor_file(
      path,
      {make_f32_tensor("sizes", {6},
                       {static_cast<float>(v.B), static_cast<float>(v.T), static_cast<float>(v.C),
                        static_cast<float>(v.E), static_cast<float>(v.K), static_cast<float>(v.F)}),
       make_f32_tensor("coeffs", {2},
                       {static_cast<float>(v.aux_coeff), static_cast<float>(v.z_coeff)}),
       make_f32_tensor("x", {N, v.C}, randn(N * v.C, 1, 1.0)),
       make_f32_tensor("router", {v.E, v.C}, randn(v.E * v.C, 2, 0.5)),
       make_f32_tensor("fc", {v.E, 2, v.F, v.C}, randn(v.E * 2 * v.F * v.C, 3, 0.2)),
       make_f32_tensor("fc2", {v.E, v.C, v.F}, randn(v.E * v.C * v.F, 4, 0.2)),
       make_f32_tensor("d_out", {N, v.C}, randn(N * v.C, 5, 1.0)),
       make_f32_tensor("shared_sizes", {1}, {static_cast<float>(v.S)}),
       make_f32_tensor("shared_fc", {2, std::max<std::int64_t>(v.S, 1), v.C},
                       randn(2 * std::max<std::int64_t>(v.S, 1) * v.C, 6, 0.2)),
       make_f32_tensor("shared_fc2", {v.C, std::max<std::int64_t>(v.S, 1)},
                       randn(v.C * std::max<std::int64_t>(v.S, 1), 7, 0.2)),
       make_f32_tensor("shared_gate", {1, v.C}, randn(v.C, 8, 0.5))});
  return 0;
}

void expect_close(const char* name, const std::vector<float>& got, const NamedTensor& want) {
  const std::vector<double> w = want.to_f64();
  ASSERT_EQ(got.size(), w.size()) << name;
  std::int64_t bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double err = std::abs(got[i] - w[i]), tol = 2e-5 + 2e-5 * std::abs(w[i]);
    worst = std::max(worst, err / tol);
    if (!(err <= tol) && bad++ < 3) {
      ADD_FAILURE() << name << "[" << i << "]: trident " << got[i] << ", transformers " << w[i];
    }
  }
  std::printf("  %-10s worst error / tolerance %.3f\n", name, worst);
  EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << w.size() << " elements off";
}

TEST(MoeGolden, LayerMatchesTransformers) {
  ASSERT_FALSE(g_inputs.empty()) << "run with --inputs IN --reference REF --variant V";
  const auto in = trident::testing::read_tensor_file(g_inputs);
  const auto ref = trident::testing::read_tensor_file(g_reference);
  const Variant v = variant_of(g_variant);
  const std::int64_t N = v.B * v.T, C = v.C, E = v.E, K = v.K, F = v.F;
  const MoeConfig cfg{.hidden = C,
                      .num_experts = E,
                      .ffn = F,
                      .activation = Activation::kSwiGlu,
                      .router = {.topk = K, .pre_softmax = v.pre_softmax},
                      .aux_loss_coeff = v.aux_coeff,
                      .z_loss_coeff = v.z_coeff,
                      .shared_ffn = v.S,
                      .shared_gate = v.S > 0};
  const std::int64_t S = v.S;
  const std::vector<float> x = find_tensor(in, "x").f32(), d_out = find_tensor(in, "d_out").f32();
  const std::vector<float> router = find_tensor(in, "router").f32();
  const std::vector<float> fc = find_tensor(in, "fc").f32(), fc2 = find_tensor(in, "fc2").f32();
  const std::vector<float> sfc = find_tensor(in, "shared_fc").f32(),
                           sfc2 = find_tensor(in, "shared_fc2").f32(),
                           sgate = find_tensor(in, "shared_gate").f32();
  const MoeParams p{.router = {router.data()},
                    .fc_w = {fc.data()},
                    .fc2_w = {fc2.data()},
                    .shared = {.fc_w = {sfc.data()}, .fc2_w = {sfc2.data()}},
                    .shared_gate = sgate.data()};
  std::vector<float> g_router(router.size()), g_fc(fc.size()), g_fc2(fc2.size());
  std::vector<float> g_sfc(sfc.size()), g_sfc2(sfc2.size()), g_sgate(sgate.size());
  std::vector<float> s_fc(N * 2 * std::max<std::int64_t>(S, 1)),
      s_act(N * std::max<std::int64_t>(S, 1)), s_out(N * C), s_logits(N);

  const std::int64_t R = cfg.max_rows(N);
  std::vector<float> logits(N * E), scores(N * E), weights(N * K), lse(N), x_perm(R * C),
      fc_out(R * 2 * F), act(R * F), y_perm(R * C), out(N * C);
  std::vector<std::int32_t> experts(N * K), rows_of(N * K), sources(R), counts(E);
  const MoeSaved saved{.logits = logits.data(),
                       .scores = scores.data(),
                       .experts = experts.data(),
                       .weights = weights.data(),
                       .lse = lse.data(),
                       .rows_of = rows_of.data(),
                       .sources = sources.data(),
                       .counts = counts.data(),
                       .x_perm = x_perm.data(),
                       .fc = fc_out.data(),
                       .act = act.data(),
                       .y_perm = y_perm.data(),
                       .shared = {.fc = s_fc.data(), .gelu = s_act.data()},
                       .shared_out = s_out.data(),
                       .shared_logits = s_logits.data()};
  std::vector<float> d_ln(N * C), ws_fc(N * 2 * std::max<std::int64_t>(S, 1)),
      ws_act(N * std::max<std::int64_t>(S, 1));
  Workspace ws;
  ws.d_ln = d_ln.data();
  ws.d_fc = ws_fc.data();
  ws.d_act = ws_act.data();
  const core::ExecContext ctx;
  const parallel::TpGroup group;
  const parallel::TpRegion region(group, false, N, C);
  const LayerContext lc{
      .ctx = ctx, .region = region, .ws = ws, .batch = v.B, .seq_len = v.T, .dropout = {}};
  MoeStats stats;
  moe_forward(lc, cfg, p, {.out = out.data(), .in = x.data(), .saved = saved, .stats = &stats});
  std::vector<float> d_weights(N * K), d_logits(N * E), d_perm(R * C), d_fc(R * 2 * F),
      d_act(R * F), d_aux(E), d_shared_in(N * C), d_shared_out(N * C), d_shared_logits(N);
  const float* d_x =
      moe_backward(lc, cfg, p,
                   {.d_out = d_out.data(),
                    .in = x.data(),
                    .saved = saved,
                    .grads = {.router = g_router.data(),
                              .fc_w = g_fc.data(),
                              .fc2_w = g_fc2.data(),
                              .shared = {.fc_w = g_sfc.data(), .fc2_w = g_sfc2.data()},
                              .shared_gate = g_sgate.data()},
                    .d_weights = d_weights.data(),
                    .d_logits = d_logits.data(),
                    .d_perm = d_perm.data(),
                    .d_fc = d_fc.data(),
                    .d_act = d_act.data(),
                    .d_aux = d_aux.data(),
                    .d_shared_in = d_shared_in.data(),
                    .d_shared_out = d_shared_out.data(),
                    .d_shared_logits = d_shared_logits.data()});
  expect_close("out", out, find_tensor(ref, "out"));
  expect_close("logits", logits, find_tensor(ref, "logits"));
  expect_close("d_x", std::vector<float>(d_x, d_x + N * C), find_tensor(ref, "d_x"));
  expect_close("d_router", g_router, find_tensor(ref, "d_router"));
  expect_close("d_fc", g_fc, find_tensor(ref, "d_fc"));
  expect_close("d_fc2", g_fc2, find_tensor(ref, "d_fc2"));
  expect_close("aux_loss", {static_cast<float>(stats.aux_loss)}, find_tensor(ref, "aux"));
  expect_close("z_loss", {static_cast<float>(stats.z_loss)}, find_tensor(ref, "z"));
  if (S > 0) {  // the shared experts and their gate (Qwen2-MoE)
    expect_close("d_shared_fc", g_sfc, find_tensor(ref, "d_shared_fc"));
    expect_close("d_shared_fc2", g_sfc2, find_tensor(ref, "d_shared_fc2"));
    expect_close("d_gate", g_sgate, find_tensor(ref, "d_shared_gate"));
  }
  EXPECT_EQ(stats.dropped, 0);  // dropless
  std::int64_t kept = 0;
  for (std::int32_t c : stats.tokens_per_expert) kept += c;
  EXPECT_EQ(kept, N * K);
}

}  // namespace
}  // namespace trident::model::layers

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dump")
      trident::model::layers::g_dump = argv[++i];
    else if (a == "--inputs")
      trident::model::layers::g_inputs = argv[++i];
    else if (a == "--reference")
      trident::model::layers::g_reference = argv[++i];
    else if (a == "--variant")
      trident::model::layers::g_variant = argv[++i];
  }
  if (!trident::model::layers::g_dump.empty()) {
    return trident::model::layers::dump(trident::model::layers::g_dump);
  }
  return RUN_ALL_TESTS();
}
