#include "trident/train/trainer.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <memory>
#include <regex>
#include <vector>

#include "trident/ckpt/checkpoint.h"
#include "trident/core/arena.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/timer.h"
#include "trident/data/indexed_dataset.h"
#include "trident/data/sequential_dataset.h"
#include "trident/data/tokenizer.h"
#include "trident/kernels/elementwise.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"
#include "trident/optim/adamw_optimizer.h"
#include "trident/train/metrics.h"

namespace trident::train {

namespace {

using core::str;

// Megatron's split string ("969, 30, 1"): every number is a weight, padded to 3, normalized;
// split k covers sequences [round(lo * N), round(hi * N)) with round half to even.
std::array<std::int64_t, 4> split_bounds(const std::string& split, std::int64_t n) {
  std::vector<double> w;
  const std::regex number("[.0-9]+");
  for (auto it = std::sregex_iterator(split.begin(), split.end(), number);
       it != std::sregex_iterator(); ++it) {
    w.push_back(std::stod(it->str()));
  }
  TRIDENT_CHECK(!w.empty() && w.size() <= 3, "--split '", split,
                "' must hold 1 to 3 weights, e.g. 969,30,1");
  w.resize(3, 0.0);
  const double total = w[0] + w[1] + w[2];
  TRIDENT_CHECK(total > 0, "--split '", split, "' weights sum to zero");
  std::array<std::int64_t, 4> b{};
  double acc = 0;
  for (int k = 0; k < 3; ++k) {
    acc += w[static_cast<std::size_t>(k)] / total;
    b[static_cast<std::size_t>(k + 1)] =
        static_cast<std::int64_t>(std::nearbyint(acc * static_cast<double>(n)));
  }
  b[3] = n;
  return b;
}

struct Buffers {
  core::Arena params, grads, exp_avg, exp_avg_sq;
  float* p = nullptr;
  float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
};

// One micro-batch of (B, T) inputs and labels from samples [first, first + B) (wrapping).
void fill_batch(const data::SampleDataset& ds, std::int64_t first, std::int64_t B,
                std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& labels,
                std::vector<std::int32_t>& scratch) {
  const std::int64_t T = ds.seq_length();
  scratch.resize(static_cast<std::size_t>(T + 1));
  for (std::int64_t b = 0; b < B; ++b) {
    ds.sample((first + b) % ds.num_samples(), scratch);
    for (std::int64_t t = 0; t < T; ++t) {
      tokens[static_cast<std::size_t>(b * T + t)] = scratch[static_cast<std::size_t>(t)];
      labels[static_cast<std::size_t>(b * T + t)] = scratch[static_cast<std::size_t>(t + 1)];
    }
  }
}

std::string fmt_e(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6E", x);
  return buf;
}

}  // namespace

int run_training(TrainConfig cfg) {
  const int world_size = 1;
  cfg.finalize(world_size);
  const core::ExecContext ctx;

  // Tokenizer: sets the vocabulary size.
  auto tokenizer = data::make_tokenizer({.type = cfg.tokenizer_type,
                                         .vocab_file = cfg.vocab_file,
                                         .merge_file = cfg.merge_file,
                                         .model_file = cfg.tokenizer_model,
                                         .vocab_size = cfg.null_tokenizer_vocab_size});
  cfg.model.vocab_size = tokenizer->vocab_size();
  model::ModelConfig& mc = cfg.model;
  mc.validate();

  // Data.
  TRIDENT_CHECK(cfg.data_path.size() == 1, "--data-path: blending several datasets needs the "
                "GPTDataset loader; give one prefix");
  auto indexed = std::make_shared<const data::IndexedDataset>(cfg.data_path[0]);
  for (std::int64_t s = 0; s < std::min<std::int64_t>(indexed->num_sequences(), 4096); ++s) {
    // Cheap sanity check of the first sequences: every token must fit the vocabulary.
    std::vector<std::int32_t> toks = indexed->sequence(s);
    for (std::int32_t t : toks) {
      TRIDENT_CHECK(t >= 0 && t < mc.vocab_size, cfg.data_path[0], ": token id ", t,
                    " in sequence ", s, " is outside the tokenizer's vocabulary of ",
                    mc.vocab_size, " (was the data made with another tokenizer?)");
    }
  }
  const auto bounds = split_bounds(cfg.split, indexed->num_sequences());
  const data::SequentialDataset train_ds(indexed, bounds[0], bounds[1], mc.seq_length);
  std::unique_ptr<data::SequentialDataset> valid_ds;
  if (bounds[2] > bounds[1]) {
    try {
      valid_ds = std::make_unique<data::SequentialDataset>(indexed, bounds[1], bounds[2],
                                                           mc.seq_length);
    } catch (const core::DataError& e) {
      log::warn("data: no validation set (", e.what(), ")");
    }
  }
  log::info("data: train ", train_ds.describe());
  if (valid_ds) log::info("data: valid ", valid_ds->describe());

  // Parameters, gradients and optimizer state: flat buffers laid out by the ParamTable.
  const model::ParamTable table = model::build_gpt_param_table(mc);
  const std::int64_t n = table.total_numel;
  const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(float));
  Buffers buf{core::Arena(bytes), core::Arena(bytes), core::Arena(bytes), core::Arena(bytes)};
  buf.p = buf.params.alloc(core::DType::kF32, {n}).as<float>();
  buf.g = buf.grads.alloc(core::DType::kF32, {n}).as<float>();
  buf.m = buf.exp_avg.alloc(core::DType::kF32, {n}).as<float>();
  buf.v = buf.exp_avg_sq.alloc(core::DType::kF32, {n}).as<float>();

  const std::int64_t B = cfg.micro_batch_size, T = mc.seq_length;
  model::GptActivations acts;
  const model::ModelRuntime rt;  // one process: the whole model, no tensor parallelism
  model::make_activations(mc, rt.shard, B, T, acts);
  log::info("model: GPT ", mc.num_layers, " layers, hidden ", mc.hidden_size, ", heads ",
            mc.num_attention_heads, ", ffn ", mc.ffn(), ", vocab ", mc.vocab_size, " (padded ",
            mc.padded_vocab_size(), "), ", table.num_parameters(), " parameters");
  log::info("memory per rank: parameters ", bytes, " B, gradients ", bytes,
            " B, optimizer state ", 2 * bytes, " B, activations ", acts.arena.capacity(), " B");

  ckpt::CheckpointState state;
  state.config = cfg.to_json();
  state.table = &table;
  state.params = buf.p;
  state.exp_avg = buf.m;
  state.exp_avg_sq = buf.v;
  std::int64_t iteration = 0, consumed = 0;
  if (!cfg.load.empty() && ckpt::latest_iteration(cfg.load) >= 0) {
    ckpt::load_checkpoint(cfg.load, -1, state);
    iteration = state.iteration;
    consumed = state.consumed_train_samples;
  } else {
    if (!cfg.load.empty()) log::warn("ckpt: nothing to load in ", cfg.load, "; starting from scratch");
    model::init_params(mc, table, cfg.seed, buf.p);
  }
  const model::GptParams params = model::gpt_param_views(mc, table, buf.p);
  const model::GptGrads grads = model::gpt_grad_views(mc, table, buf.g);

  const int dp = cfg.data_parallel_size(world_size), dp_rank = 0;
  const std::int64_t micro_batches = cfg.num_micro_batches(world_size);
  const std::int64_t tokens_per_iter = cfg.global_batch_size * T;
  const double flops_per_iter = mc.flops_per_iteration(tokens_per_iter);
  const double peak = cfg.peak_tflops > 0 ? cfg.peak_tflops : measure_peak_tflops();
  log::info("train: global batch ", cfg.global_batch_size, " = micro ", B, " x ", micro_batches,
            " accumulation x ", dp, " data-parallel; ", omp_get_max_threads(),
            " threads; MFU against ", peak, " TFLOP/s (",
            cfg.peak_tflops > 0 ? "--peak-tflops" : "measured FP32 GEMM", ")");

  MetricsWriter metrics(cfg.metrics_jsonl);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T)), labels(tokens.size()), scratch;

  auto evaluate = [&](std::int64_t it) {
    if (!valid_ds || cfg.eval_iters == 0) return;
    model::LossSum total;
    for (std::int64_t e = 0; e < cfg.eval_iters; ++e) {
      for (std::int64_t mb = 0; mb < micro_batches; ++mb) {
        const std::int64_t first = e * cfg.global_batch_size + mb * B * dp + dp_rank * B;
        fill_batch(*valid_ds, first, B, tokens, labels, scratch);
        model::gpt_forward(ctx, mc, rt, params, tokens.data(), acts);
        const model::LossSum l = model::gpt_loss(ctx, mc, rt, labels.data(), 0.0f,
                                                 model::LossGrad::kNone, acts);
        total.sum += l.sum;
        total.count += l.count;
      }
    }
    const double loss = total.sum / static_cast<double>(std::max<std::int64_t>(total.count, 1));
    const double ppl = std::exp(std::min(loss, 20.0));
    log::info("validation loss at iteration ", it, " | lm loss value: ", fmt_e(loss),
              " | lm loss PPL: ", fmt_e(ppl));
    metrics.write({{"iteration", it}, {"split", "valid"}, {"lm_loss", loss}, {"ppl", ppl}});
  };
  auto save = [&](std::int64_t it) {
    if (cfg.save.empty()) return;
    core::Timer t;
    state.iteration = it;
    state.consumed_train_samples = consumed;
    ckpt::save_checkpoint(cfg.save, state);
    log::info("ckpt: saved iteration ", it, " to ", cfg.save, " (", t.elapsed_s(), " s)");
  };

  double interval_loss = 0, interval_ms = 0;
  std::int64_t interval_iters = 0, skipped_iters = 0, nan_iters = 0;
  while (iteration < cfg.train_iters) {
    core::Timer timer;
    std::memset(buf.g, 0, static_cast<std::size_t>(n) * sizeof(float));
    model::LossSum loss;
    // Every token of the global batch weighs 1 / (tokens in the global batch).
    const float d_scale = 1.0f / static_cast<float>(tokens_per_iter);
    for (std::int64_t mb = 0; mb < micro_batches; ++mb) {
      const std::int64_t first = consumed + mb * B * dp + dp_rank * B;
      fill_batch(train_ds, first, B, tokens, labels, scratch);
      model::gpt_forward(ctx, mc, rt, params, tokens.data(), acts);
      const model::LossSum l = model::gpt_loss(ctx, mc, rt, labels.data(), d_scale,
                                               model::LossGrad::kCompute, acts);
      loss.sum += l.sum;
      loss.count += l.count;
      model::gpt_backward(ctx, mc, rt, params, grads, tokens.data(), acts);
    }
    const double lm_loss = loss.sum / static_cast<double>(std::max<std::int64_t>(loss.count, 1));
    const double grad_norm = std::sqrt(kernels::sum_squares(ctx, buf.g, n));
    const double lr = cfg.lr.at(iteration);
    ++iteration;
    consumed += cfg.global_batch_size;
    if (!std::isfinite(grad_norm) || !std::isfinite(lm_loss)) {
      ++nan_iters;
      ++skipped_iters;
      log::warn("train: iteration ", iteration, ": loss ", lm_loss, ", grad norm ", grad_norm,
                " is not finite; update skipped");
    } else {
      const float coeff = optim::clip_coefficient(grad_norm, cfg.adamw.clip_grad);
      optim::adamw_step(ctx, table, cfg.adamw, lr, iteration, coeff,
                        {.range = {0, n}, .params = buf.p, .grads = buf.g, .m = buf.m, .v = buf.v});
    }
    const double iter_ms = timer.elapsed_ms();
    interval_loss += lm_loss;
    interval_ms += iter_ms;
    ++interval_iters;

    if (iteration % cfg.log_interval == 0 || iteration == cfg.train_iters) {
      const double avg_loss = interval_loss / static_cast<double>(interval_iters);
      const double avg_ms = interval_ms / static_cast<double>(interval_iters);
      const double tokens_per_s = static_cast<double>(tokens_per_iter) / (avg_ms / 1e3);
      const double tflops = flops_per_iter / (avg_ms / 1e3) / 1e12 / world_size;
      char line[512];
      std::snprintf(line, sizeof(line),
                    " iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per "
                    "iteration (ms): %.1f | throughput per GPU (TFLOP/s/GPU): %.3f | learning "
                    "rate: %s | global batch size: %5lld | lm loss: %s | grad norm: %.3f | number "
                    "of skipped iterations: %3lld | number of nan iterations: %3lld |",
                    static_cast<long long>(iteration), static_cast<long long>(cfg.train_iters),
                    static_cast<long long>(consumed), avg_ms, tflops, fmt_e(lr).c_str(),
                    static_cast<long long>(cfg.global_batch_size), fmt_e(avg_loss).c_str(),
                    grad_norm, static_cast<long long>(skipped_iters),
                    static_cast<long long>(nan_iters));
      log::info(line);
      metrics.write({{"iteration", iteration}, {"consumed_samples", consumed},
                     {"lm_loss", avg_loss}, {"lr", lr}, {"grad_norm", grad_norm},
                     {"iter_ms", avg_ms}, {"tokens_per_s", tokens_per_s}, {"tflops", tflops},
                     {"mfu", tflops / peak}, {"skipped_iterations", skipped_iters},
                     {"nan_iterations", nan_iters}, {"global_batch_size", cfg.global_batch_size}});
      interval_loss = interval_ms = 0;
      interval_iters = 0;
    }
    if (iteration % cfg.eval_interval == 0) evaluate(iteration);
    const bool exiting = cfg.exit_interval > 0 && iteration % cfg.exit_interval == 0;
    if ((cfg.save_interval > 0 && iteration % cfg.save_interval == 0) ||
        (exiting && iteration != cfg.train_iters)) {
      save(iteration);
    }
    if (exiting && iteration != cfg.train_iters) {
      log::info("train: exiting at iteration ", iteration, " (--exit-interval)");
      return 0;
    }
  }
  if (cfg.train_iters % cfg.eval_interval != 0) evaluate(iteration);
  if (cfg.save_interval == 0 || cfg.train_iters % cfg.save_interval != 0) save(iteration);
  return 0;
}

}  // namespace trident::train
