// One training step of a GPT (forward + loss, zeroing gradients, backward, clipping norm, AdamW)
// timed in trident, with the same span and settings as bench/e2e/torch_gpt_step.py, so that
// bench/e2e/run_step_bench.py can put the two side by side. Prints one JSON line. --profile also
// prints, to stderr, the per-op table of the timed steps from trident's own timers
// (core/profile.h): time per step, share, achieved GFLOP/s (GEMM, attention) or GB/s (memory-bound
// ops, minimum traffic), by op and GEMM shape and by kind (docs/cpu-performance.md).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "trident/core/arena.h"
#include "trident/core/profile.h"
#include "trident/core/timer.h"
#include "trident/core/view.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/elementwise.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"
#include "trident/optim/adamw_optimizer.h"

using namespace trident;

namespace {

// Prints the per-op table of the profiled steps to stderr; returns it as JSON.
nlohmann::json profile_table(const std::vector<double>& ms, int steps) {
  namespace prof = core::profile;
  const std::vector<prof::Entry> entries = prof::entries();
  double total_ms = 0;
  for (double x : ms) total_ms += x;
  const double step_ms = total_ms / steps;
  std::fputs(prof::format_table(entries, steps, step_ms / 1e3).c_str(), stderr);
  nlohmann::json rows = nlohmann::json::array();
  for (const prof::Entry& e : entries) {
    rows.push_back({{"op", e.name},
                    {"kind", prof::kind_name(e.kind)},
                    {"calls", e.calls},
                    {"seconds", e.seconds},
                    {"flops", e.flops},
                    {"bytes", e.bytes}});
  }
  return {{"step_ms_mean", step_ms}, {"ops", rows}};
}

}  // namespace

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
  app.add_option("--hidden-dropout", mc.hidden_dropout, "as trident train (default here 0)")
      ->capture_default_str();
  app.add_option("--attention-dropout", mc.attention_dropout, "as trident train (default here 0)")
      ->capture_default_str();
  std::int64_t loss_chunk_rows = -1;
  app.add_option("--loss-chunk-rows", loss_chunk_rows,
                 "as trident train: -1 auto, 0 materialise every row's logits")
      ->capture_default_str();
  bool profile = false;
  app.add_flag("--profile", profile, "per-op time table of the timed steps (stderr, and JSON)");
  CLI11_PARSE(app, argc, argv);

  mc.loss_chunk_rows = loss_chunk_rows < 0 ? mc.auto_loss_chunk_rows() : loss_chunk_rows;
  const core::ExecContext ctx;
  const model::ParamTable table = model::build_gpt_param_table(mc);
  const std::int64_t n = table.total_numel;
  std::vector<float> p(static_cast<std::size_t>(n)), g(p.size()), m(p.size()), v(p.size());
  model::init_params(mc, table, 1234, p.data());
  // --bf16: BF16 weight copies refreshed after every step, BF16 matmul operands.
  std::vector<core::bf16> p16(bf16 ? p.size() : 0);
  const model::GptParams params =
      model::gpt_param_views(mc, table, p.data(), bf16 ? p16.data() : nullptr);
  const model::GptGrads grads = model::gpt_grad_views(mc, table, g.data());
  model::GptActivations acts;
  model::ModelRuntime rt;
  model::make_activations(mc, rt.shard, batch, mc.seq_length, bf16, acts);
  const std::int64_t BT = batch * mc.seq_length;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(BT)), labels(tokens.size());
  std::mt19937 rng(1);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng() % mc.vocab_size);
  for (auto& t : labels) t = static_cast<std::int32_t>(rng() % mc.vocab_size);
  const optim::OptimizerConfig adam{
      .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f, .clip_grad = 0.0f};

  std::vector<double> ms;
  double loss = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (profile && s == warmup) core::profile::set_enabled(true);
    core::Timer t;
    if (bf16)
      kernels::convert(ctx, {.out = core::view(p16.data(), {n}), .in = core::view(p.data(), {n})});
    // Gradients are zeroed before the forward: the chunked head accumulates the output layer's
    // gradient in gpt_loss.
    std::memset(g.data(), 0, g.size() * sizeof(float));
    // Fresh dropout masks every step, as in training.
    model::gpt_forward(ctx, mc, rt, params, {.tokens = tokens.data(), .iteration = s}, acts);
    const model::LossSum l =
        model::gpt_loss(ctx, mc, rt, params, grads, labels.data(), 1.0f / static_cast<float>(BT),
                        model::LossGrad::kCompute, acts);
    model::gpt_backward(ctx, mc, rt, params, grads, tokens.data(), acts);
    optim::adamw_step(
        ctx, table, adam, 1e-4, s + 1, 1.0f,
        {.range = {0, n}, .params = p.data(), .grads = g.data(), .m = m.data(), .v = v.data()});
    loss = l.sum / static_cast<double>(l.count);
    if (s >= warmup) ms.push_back(t.elapsed_ms());
  }
  core::profile::set_enabled(false);
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  nlohmann::json out = {{"system", "trident"},
                        {"dtype", bf16 ? "bf16" : "fp32"},
                        {"median_ms", median},
                        {"step_ms", ms},
                        {"tokens_per_s", static_cast<double>(BT) / (median / 1e3)},
                        {"loss", loss},
                        {"loss_chunk_rows", mc.loss_chunk_rows},
                        {"dropout", {mc.hidden_dropout, mc.attention_dropout}},
                        {"activation_bytes", acts.arena.capacity()},
                        {"params", table.num_parameters()}};
  if (profile) out["profile"] = profile_table(ms, steps);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
