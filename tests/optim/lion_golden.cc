// Golden test of the Lion update rule against lion-pytorch (tests/reference/lion_reference.py,
// float64, the package's own Lion optimizer with two parameter groups: decayed weights and
// undecayed biases and norms, as trident's table says).
// `--dump PATH` writes the inputs (a tiny GPT's parameter table and initial weights, four steps of
// gradients, learning rates and clipping coefficients, the hyper-parameters); `--inputs IN
// --reference REF` runs trident's rule through the distributed optimizer (one rank, ZeRO 0: the
// seam the trainer uses) and compares the weights and the momentum after each run.
//
// Tolerance: momentum |x - ref| <= 1e-7 + 1e-6 |ref| (one FP32 multiply-add per step);
// weights 1e-6 lr + 1e-6 |ref| (the decay and the +-lr step round in FP32). Where the reference's
// c = beta1 m + (1 - beta1) g was within FP32 rounding of zero in some step (the reference counts
// those steps per element), the signs may differ and the weight by 2 lr per such step; those
// elements get that bound (their count is printed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "optim_test_util.h"
#include "support/tensor_file.h"
#include "trident/comm/self_communicator.h"
#include "trident/model/gpt.h"
#include "trident/optim/distributed_optimizer.h"
#include "trident/optim/param_buffers.h"

namespace trident::optim {
namespace {

using trident::testing::NamedTensor;

std::string g_dump, g_inputs, g_reference;

constexpr int kSteps = 4;
constexpr double kLr[kSteps] = {3e-3, 2e-3, 1e-3, 5e-4};     // a decaying schedule
constexpr float kScale[kSteps] = {1.0f, 0.5f, 1.0f, 0.25f};  // clipping coefficients

model::ModelConfig golden_config() {
  model::ModelConfig c = testing::tiny_config(2);
  c.vocab_size = 250;  // padded rows too: their gradient is zero, only the decay moves them
  return c;
}

OptimizerConfig golden_optimizer() {
  return {
      .kind = OptimizerKind::kLion, .lion_beta1 = 0.95, .lion_beta2 = 0.98, .weight_decay = 0.1};
}

const NamedTensor& get(const std::map<std::string, NamedTensor>& m, const std::string& name) {
  const auto it = m.find(name);
  if (it == m.end()) throw std::runtime_error("tensor file lacks " + name);
  return it->second;
}

int dump(const std::string& path) {
  const model::ModelConfig cfg = golden_config();
  testing::OneChunk m(cfg);
  const std::int64_t n = m.table.total_numel;
  std::vector<float> params(static_cast<std::size_t>(n));
  model::init_params(cfg, m.table, 77, params.data());
  std::mt19937_64 rng(99);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> grads(static_cast<std::size_t>(kSteps * n));
  for (float& g : grads) g = normal(rng);
  // Padded vocabulary rows get no gradient, as in training.
  for (const model::ParamSpec& p : m.table.params) {
    if (p.name.find("word_embeddings") == std::string::npos) continue;
    const std::int64_t real = cfg.vocab_size * cfg.hidden_size;
    for (int s = 0; s < kSteps; ++s)
      for (std::int64_t i = p.offset + real; i < p.offset + p.numel; ++i) grads[s * n + i] = 0.0f;
  }
  std::vector<std::int64_t> offsets, numels, decay;
  for (const model::ParamSpec& p : m.table.params) {
    offsets.push_back(p.offset);
    numels.push_back(p.numel);
    decay.push_back(p.weight_decay ? 1 : 0);
  }
  const OptimizerConfig o = golden_optimizer();
  // The kernel takes its hyper-parameters as float: the reference gets those floats.
  const auto f = [](double x) { return static_cast<double>(static_cast<float>(x)); };
  const auto P = static_cast<std::int64_t>(offsets.size());
  std::vector<double> lrs, scales;
  for (int s = 0; s < kSteps; ++s) {
    lrs.push_back(f(kLr[s]));
    scales.push_back(kScale[s]);
  }
  trident::testing::write_tensor_file(
      path, {trident::testing::make_i64_tensor("offsets", {P}, offsets),
             trident::testing::make_i64_tensor("numels", {P}, numels),
             trident::testing::make_i64_tensor("decay", {P}, decay),
             trident::testing::make_f32_tensor("params", {n}, params),
             trident::testing::make_f32_tensor("grads", {kSteps, n}, grads),
             trident::testing::make_f64_tensor("lrs", {kSteps}, lrs),
             trident::testing::make_f64_tensor("scales", {kSteps}, scales),
             trident::testing::make_f64_tensor(
                 "hyper", {3}, {f(o.lion_beta1), f(o.lion_beta2), f(o.weight_decay)})});
  return 0;
}

TEST(LionGolden, MatchesLionPytorch) {
  ASSERT_FALSE(g_inputs.empty()) << "run with --inputs IN --reference REF";
  const auto in = trident::testing::read_tensor_file(g_inputs);
  const auto ref = trident::testing::read_tensor_file(g_reference);
  const model::ModelConfig cfg = golden_config();
  testing::OneChunk m(cfg);
  const std::int64_t n = m.table.total_numel;
  const std::vector<float> p0 = get(in, "params").f32(), grads = get(in, "grads").f32();
  ASSERT_EQ(static_cast<std::int64_t>(p0.size()), n);

  comm::SelfCommunicator self;
  ParamGradBuffers buf(m.layout, parallel::build_shard_plan(m.layout.numel(), 1, kShardAlign),
                       zero_policy(0), 0, false);
  std::copy(p0.begin(), p0.end(), buf.full_params());
  CommCounters counters;
  DistributedOptimizer opt(buf, self, counters, golden_optimizer());
  ASSERT_EQ(opt.state().size(), 1u);
  EXPECT_STREQ(opt.state()[0].name, "exp_avg");
  std::vector<float> g(static_cast<std::size_t>(m.layout.numel()), 0.0f);
  for (int s = 0; s < kSteps; ++s) {
    std::copy(grads.begin() + s * n, grads.begin() + (s + 1) * n, g.begin());
    opt.step({}, kLr[s], s + 1, kScale[s], g.data());
  }
  const std::vector<double> want_p = get(ref, "params").f64(), want_m = get(ref, "exp_avg").f64();
  const std::vector<std::int64_t> ambiguous = get(ref, "ambiguous").i64();
  ASSERT_EQ(static_cast<std::int64_t>(want_p.size()), n);
  const float* got_m = opt.state()[0].span.data;
  double worst_p = 0, worst_m = 0;
  std::int64_t bounded = 0, moved = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double dm = std::abs(got_m[i] - want_m[i]);
    ASSERT_LE(dm, 1e-7 + 1e-6 * std::abs(want_m[i])) << "exp_avg element " << i;
    worst_m = std::max(worst_m, dm);
    const double dp = std::abs(buf.full_params()[i] - want_p[i]);
    const double tol = 1e-6 * kLr[0] + 1e-6 * std::abs(want_p[i]);
    if (ambiguous[i] > 0) {
      ++bounded;
      ASSERT_LE(dp, 2 * kLr[0] * ambiguous[i] + tol) << "params element " << i;
    } else {
      ASSERT_LE(dp, tol) << "params element " << i << ": trident " << buf.full_params()[i]
                         << ", lion-pytorch " << want_p[i];
      worst_p = std::max(worst_p, dp);
    }
    if (std::abs(want_p[i] - p0[i]) > 0.5 * kLr[kSteps - 1]) ++moved;
  }
  // The rule did something: nearly every weight moved by about the sum of the steps.
  EXPECT_GT(moved, n * 9 / 10);
  std::printf(
      "lion golden: %lld elements, max |d params| %.3g, max |d exp_avg| %.3g, %lld with "
      "c near 0\n",
      static_cast<long long>(n), worst_p, worst_m, static_cast<long long>(bounded));
}

}  // namespace
}  // namespace trident::optim

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dump")
      trident::optim::g_dump = argv[++i];
    else if (a == "--inputs")
      trident::optim::g_inputs = argv[++i];
    else if (a == "--reference")
      trident::optim::g_reference = argv[++i];
  }
  if (!trident::optim::g_dump.empty()) return trident::optim::dump(trident::optim::g_dump);
  return RUN_ALL_TESTS();
}
