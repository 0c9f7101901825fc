// One training step of a GPT (forward + loss, zeroing gradients, backward, clipping norm, AdamW)
// timed in trident, with the same span and settings as bench/e2e/torch_gpt_step.py, so that
// bench/e2e/run_step_bench.sh can put the two side by side. Prints one JSON line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "trident/core/arena.h"
#include "trident/core/timer.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/elementwise.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"
#include "trident/optim/adamw_optimizer.h"

using namespace trident;

int main(int argc, char** argv) {
  model::ModelConfig mc;
  mc.max_position_embeddings = 1024;
  mc.vocab_size = 50257;
  std::int64_t batch = 4;
  int warmup = 2, steps = 5;
  bool bf16 = false;
  CLI::App app{"trident GPT training-step benchmark"};
  app.add_option("--num-layers", mc.num_layers)->capture_default_str();
  app.add_option("--hidden-size", mc.hidden_size)->capture_default_str();
  app.add_option("--num-attention-heads", mc.num_attention_heads)->capture_default_str();
  app.add_option("--vocab-size", mc.vocab_size)->capture_default_str();
  app.add_option("--seq-length", mc.seq_length)->capture_default_str();
  app.add_option("--max-position-embeddings", mc.max_position_embeddings)->capture_default_str();
  app.add_option("--micro-batch-size", batch)->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_flag("--bf16", bf16, "BF16 mixed precision (as trident train --bf16)");
  CLI11_PARSE(app, argc, argv);

  const core::ExecContext ctx;
  const model::ParamTable table = model::build_gpt_param_table(mc);
  const std::int64_t n = table.total_numel;
  std::vector<float> p(static_cast<std::size_t>(n)), g(p.size()), m(p.size()), v(p.size());
  model::init_params(mc, table, 1234, p.data());
  const model::GptParams params = model::gpt_param_views(mc, table, p.data());
  const model::GptGrads grads = model::gpt_grad_views(mc, table, g.data());
  model::GptActivations acts;
  model::ModelRuntime rt;
  // --bf16: BF16 weight copies refreshed after every step, BF16 matmul operands.
  std::vector<core::bf16> p16(bf16 ? p.size() : 0);
  const model::GptParamsBf16 params16 = model::gpt_param_views_bf16(mc, table, p16.data());
  if (bf16) rt.params_bf16 = &params16;
  model::make_activations(mc, rt.shard, batch, mc.seq_length, bf16, acts);
  const std::int64_t BT = batch * mc.seq_length;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(BT)), labels(tokens.size());
  std::mt19937 rng(1);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % mc.vocab_size);
  for (auto& t : labels) t = static_cast<std::int32_t>(rng() % mc.vocab_size);
  const optim::AdamWConfig adam{
      .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f, .clip_grad = 0.0f};

  std::vector<double> ms;
  double loss = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    core::Timer t;
    if (bf16) kernels::convert_f32_to_bf16(ctx, p16.data(), p.data(), n);
    model::gpt_forward(ctx, mc, rt, params, tokens.data(), acts);
    const model::LossSum l = model::gpt_loss(
        ctx, mc, rt, labels.data(), 1.0f / static_cast<float>(BT), model::LossGrad::kCompute, acts);
    std::memset(g.data(), 0, g.size() * sizeof(float));
    model::gpt_backward(ctx, mc, rt, params, grads, tokens.data(), acts);
    optim::adamw_step(
        ctx, table, adam, 1e-4, s + 1, 1.0f,
        {.range = {0, n}, .params = p.data(), .grads = g.data(), .m = m.data(), .v = v.data()});
    loss = l.sum / static_cast<double>(l.count);
    if (s >= warmup) ms.push_back(t.elapsed_ms());
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  nlohmann::json out = {{"system", "trident"},
                        {"dtype", bf16 ? "bf16" : "fp32"},
                        {"median_ms", median},
                        {"step_ms", ms},
                        {"tokens_per_s", static_cast<double>(BT) / (median / 1e3)},
                        {"loss", loss},
                        {"params", table.num_parameters()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
