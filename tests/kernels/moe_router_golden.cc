// Golden test of the mixture-of-experts router (kernels/moe.h, moe_router on the CPU) against
// megatron-core's topk_routing_with_score_function (tests/reference/moe_router_mcore.py: the pip
// package's own code, float64 logits), for every routing option trident takes from Megatron:
// softmax top-k (renormalised over the chosen), --moe-router-pre-softmax, the top-k scaling
// factor, sigmoid scores with and without the expert bias, and group-limited routing
// (--moe-router-num-groups / --moe-router-group-topk, DeepSeek-V3's 8 groups, 4 kept, top 8).
// `--dump PATH` writes the cases (random logits and biases); `--inputs IN --reference REF` runs
// trident's router and compares, for every token, the chosen experts (as a set: Megatron's
// group-limited top-k does not sort) and their weights.
//
// Tolerance: the chosen experts must be the same; weights |x - ref| <= 1e-7 + 1e-6 |ref|
// (trident computes in double and rounds once; Megatron's softmax and sigmoid run in float32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/tensor_file.h"
#include "trident/core/view.h"
#include "trident/kernels/moe.h"

namespace trident::kernels {
namespace {

using trident::testing::NamedTensor;

std::string g_dump, g_inputs, g_reference;

struct Case {
  const char* name;
  std::int64_t experts;
  MoeRouterConfig cfg;
  bool bias = false;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"softmax top2", 8, {.topk = 2}},
      {"softmax top1", 8, {.topk = 1}},
      {"pre-softmax top2", 8, {.topk = 2, .pre_softmax = true}},
      {"softmax top3 scaled", 8, {.topk = 3, .scaling = 2.5f}},
      {"sigmoid top2", 8, {.topk = 2, .score = MoeScore::kSigmoid}},
      {"sigmoid top4 bias", 16, {.topk = 4, .score = MoeScore::kSigmoid}, true},
      {"softmax top2 groups 4/1", 8, {.topk = 2, .num_groups = 4, .group_topk = 1}},
      {"softmax top4 groups 4/2", 8, {.topk = 4, .num_groups = 4, .group_topk = 2}},
      {"pre-softmax top2 groups 2/1",
       8,
       {.topk = 2, .pre_softmax = true, .num_groups = 2, .group_topk = 1}},
      {"sigmoid top2 groups 4/2",
       8,
       {.topk = 2, .score = MoeScore::kSigmoid, .num_groups = 4, .group_topk = 2}},
      // DeepSeek-V3's shape: sigmoid, expert bias, 8 groups, 4 kept, top 8, scaled 2.5.
      {"deepseek-v3 sigmoid top8 bias groups 8/4 scaled",
       32,
       {.topk = 8, .score = MoeScore::kSigmoid, .scaling = 2.5f, .num_groups = 8, .group_topk = 4},
       true},
  };
  return c;
}

constexpr std::int64_t kTokens = 64;

const NamedTensor& get(const std::map<std::string, NamedTensor>& m, const std::string& name) {
  const auto it = m.find(name);
  if (it == m.end()) throw std::runtime_error("tensor file lacks " + name);
  return it->second;
}

int dump(const std::string& path) {
  std::mt19937_64 rng(33);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<NamedTensor> out = {
      trident::testing::make_i64_tensor("cases", {}, {static_cast<std::int64_t>(cases().size())})};
  for (std::size_t i = 0; i < cases().size(); ++i) {
    const Case& c = cases()[i];
    const std::int64_t E = c.experts;
    std::vector<float> logits(static_cast<std::size_t>(kTokens * E)),
        bias(static_cast<std::size_t>(E));
    for (float& x : logits) x = normal(rng);
    for (float& x : bias) x = 0.1f * normal(rng);
    const std::string n = std::to_string(i);
    out.push_back(trident::testing::make_f32_tensor("logits_" + n, {kTokens, E}, logits));
    out.push_back(trident::testing::make_f32_tensor("bias_" + n, {E}, bias));
    out.push_back(trident::testing::make_f64_tensor(
        "cfg_" + n, {7},
        {static_cast<double>(c.cfg.topk), c.cfg.score == MoeScore::kSigmoid ? 1.0 : 0.0,
         c.cfg.pre_softmax ? 1.0 : 0.0, static_cast<double>(c.cfg.scaling),
         static_cast<double>(c.cfg.num_groups), static_cast<double>(c.cfg.group_topk),
         c.bias ? 1.0 : 0.0}));
  }
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  trident::testing::write_tensor_file(path, out);
  return 0;
}

TEST(MoeRouterGolden, MatchesMegatronCore) {
  ASSERT_FALSE(g_inputs.empty()) << "run with --inputs IN --reference REF";
  const auto in = trident::testing::read_tensor_file(g_inputs);
  const auto ref = trident::testing::read_tensor_file(g_reference);
  const core::ExecContext cpu;
  for (std::size_t i = 0; i < cases().size(); ++i) {
    const Case& c = cases()[i];
    const std::string n = std::to_string(i);
    const std::int64_t E = c.experts, k = c.cfg.topk, N = kTokens;
    const std::vector<float> logits = get(in, "logits_" + n).f32(),
                             bias = get(in, "bias_" + n).f32();
    std::vector<float> scores(N * E), weights(N * k), lse(N);
    std::vector<std::int32_t> experts(N * k);
    moe_router(cpu, {.scores = core::view(scores.data(), {N, E}),
                     .experts = core::view(experts.data(), {N, k}),
                     .weights = core::view(weights.data(), {N, k}),
                     .lse = core::view(lse.data(), {N}),
                     .logits = core::view(logits.data(), {N, E}),
                     .expert_bias = c.bias ? core::view(bias.data(), {E}) : core::TensorView{},
                     .cfg = c.cfg});
    const std::vector<double> probs = get(ref, "probs_" + n).f64();
    const std::vector<std::int64_t> map = get(ref, "map_" + n).i64();
    ASSERT_EQ(static_cast<std::int64_t>(probs.size()), N * E) << c.name;
    int wrong_sets = 0;
    double worst = 0;
    for (std::int64_t t = 0; t < N; ++t) {
      std::set<std::int64_t> mine, theirs;
      for (std::int64_t j = 0; j < k; ++j) mine.insert(experts[t * k + j]);
      for (std::int64_t e = 0; e < E; ++e) {
        if (map[t * E + e] != 0) theirs.insert(e);
      }
      if (mine != theirs) {
        ++wrong_sets;
        continue;
      }
      for (std::int64_t j = 0; j < k; ++j) {
        const double want = probs[t * E + experts[t * k + j]], got = weights[t * k + j];
        EXPECT_LE(std::abs(got - want), 1e-7 + 1e-6 * std::abs(want))
            << c.name << " token " << t << " expert " << experts[t * k + j];
        worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want), 1e-30));
      }
    }
    EXPECT_EQ(wrong_sets, 0) << c.name << ": tokens routed to other experts than megatron-core's";
    std::printf("moe router golden: %-48s %lld tokens, same experts, weights max rel diff %.2e\n",
                c.name, static_cast<long long>(N), worst);
  }
}

}  // namespace
}  // namespace trident::kernels

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dump")
      trident::kernels::g_dump = argv[++i];
    else if (a == "--inputs")
      trident::kernels::g_inputs = argv[++i];
    else if (a == "--reference")
      trident::kernels::g_reference = argv[++i];
  }
  if (!trident::kernels::g_dump.empty()) return trident::kernels::dump(trident::kernels::g_dump);
  return RUN_ALL_TESTS();
}
