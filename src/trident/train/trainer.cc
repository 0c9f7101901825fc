#include "trident/train/trainer.h"

#include <omp.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/save_lock.h"
#include "trident/comm/launch.h"
#include "trident/core/arena.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/timer.h"
#include "trident/data/data_loader.h"
#include "trident/data/dataset_builder.h"
#include "trident/data/indexed_dataset.h"
#include "trident/data/tokenizer.h"
#include "trident/kernels/elementwise.h"
#include "trident/model/gpt.h"
#include "trident/optim/loss_scaler.h"
#include "trident/parallel/layout.h"
#include "trident/parallel/parallel_context.h"
#include "trident/train/async_saver.h"
#include "trident/train/offload_report.h"
#include "trident/train/exit_codes.h"
#include "trident/train/launch_env.h"
#include "trident/train/metrics.h"
#include "trident/train/pipeline.h"
#include "trident/train/rank_model.h"
#include "trident/train/stop_conditions.h"
#include "trident/train/tensorboard_writer.h"
#include "trident/train/zero_optimizer.h"

namespace trident::train {

namespace {

using core::str;

// Megatron's tokenizer.unique_identifiers, part of the dataset cache keys.
nlohmann::ordered_json tokenizer_identity(const TrainConfig& cfg) {
  nlohmann::ordered_json j;
  if (cfg.tokenizer_type == "GPT2BPETokenizer") {
    j["class"] = "_GPT2BPETokenizer";
    j["tokenizer_path"] = {cfg.vocab_file, cfg.merge_file};
  } else {
    j["class"] = cfg.tokenizer_type;
    j["tokenizer_path"] = {cfg.tokenizer_model.empty() ? cfg.vocab_file : cfg.tokenizer_model};
    if (cfg.tokenizer_type == "NullTokenizer") j["vocab_size"] = cfg.null_tokenizer_vocab_size;
  }
  return j;
}

std::string fmt_e(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6E", x);
  return buf;
}

// Megatron's micro-batch order: micro-batch j of the global batch starting at `first` goes to data
// rank r as samples first + j * micro * dp + r * micro + [0, micro).
void fill_micro_batch(const data::SampleDataset& ds, std::int64_t first, std::int64_t micro, int dp,
                      int dp_rank, int j, std::int32_t* tokens, std::int32_t* labels,
                      std::vector<std::int32_t>& scratch, std::int64_t vocab,
                      std::int32_t mask_eod = -1) {
  const std::int64_t T = ds.seq_length();
  scratch.resize(static_cast<std::size_t>(T + 1));
  const std::int64_t start = data::micro_batch_first_sample(first, j, dp_rank, micro, dp);
  for (std::int64_t b = 0; b < micro; ++b) {
    const std::int64_t id = start + b;
    if (id >= ds.num_samples()) {
      throw core::DataError(core::str(ds.describe(), ": ran out of samples at sample ", id,
                                      " (the dataset was built for fewer; check --train-iters, "
                                      "--eval-iters and the batch sizes)"));
    }
    ds.sample(id, scratch);
    for (std::int32_t t : scratch) {
      TRIDENT_CHECK(t < vocab, ds.describe(), ": token id ", t, " in sample ", id,
                    " is outside the tokenizer's vocabulary of ", vocab,
                    " (was the data made with another tokenizer?)");
    }
    // A short final sample is padded with a negative id: its labels are ignored by the loss and
    // its inputs read token 0, as Megatron does.
    for (std::int64_t t = 0; t < T; ++t) {
      tokens[b * T + t] = std::max(scratch[static_cast<std::size_t>(t)], 0);
      labels[b * T + t] = scratch[static_cast<std::size_t>(t + 1)];
      // --eod-mask-loss: no loss where the input is end-of-document (Megatron's loss_mask).
      if (mask_eod >= 0 && scratch[static_cast<std::size_t>(t)] == mask_eod) labels[b * T + t] = -1;
    }
  }
}

// CPU time (user + system, every thread) this process has used, in milliseconds.
double process_cpu_ms() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return (static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
          static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3);
}

// Each rank's peak resident memory (getrusage), logged by rank 0 for comparison with the memory
// report above and `trident plan`.
void log_peak_rss(comm::Communicator& world) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double mine = static_cast<double>(usage.ru_maxrss) * 1024.0;
  std::vector<double> all(static_cast<std::size_t>(world.size()));
  world.all_gather(&mine, all.data(), 1, comm::Datatype::kF64);
  std::string text;
  for (double b : all) text += core::str(text.empty() ? "" : " ", static_cast<std::int64_t>(b));
  log::info("memory: peak RSS per rank [", text, "] B");
}

// Fault injection for the tests of non-finite steps: TRIDENT_TEST_NAN_GRAD_ITER=k makes rank
// TRIDENT_TEST_NAN_GRAD_RANK (default 0) seed iteration k's backward with NaN, so that every
// gradient it computes is NaN, as a real numerical blow-up would make them.
float test_gradient_poison(std::int64_t iteration, int rank) {
  const char* at = std::getenv("TRIDENT_TEST_NAN_GRAD_ITER");
  if (at == nullptr || std::atoll(at) != iteration) return 1.0f;
  const char* on_rank = std::getenv("TRIDENT_TEST_NAN_GRAD_RANK");
  return rank == (on_rank ? std::atoi(on_rank) : 0) ? NAN : 1.0f;
}

}  // namespace

int run_training(TrainConfig cfg, comm::Communicator& world) {
  cfg.finalize(world.size());
  const core::ExecContext ctx;
  const auto layout = parallel::ParallelLayout::from_world_size(
      world.size(), cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size);
  world.set_timeout(cfg.comm_timeout);
  parallel::ParallelContext par(world, layout, cfg.hierarchical_dp);
  par.set_timeout(cfg.comm_timeout);
  log::Settings log_settings = log::settings();
  log_settings.rank = world.rank();
  log_settings.coords = par.coords_string();
  log::configure(log_settings);
  if (world.rank() == 0) {
    for (const std::string& w : cfg.warnings) log::warn(w);
    log::info("\n", cfg.arguments_table());
  }
  StopConditions stops(cfg);
  // The save directory belongs to this job until it ends (a second job on it is refused).
  std::unique_ptr<ckpt::SaveLock> save_lock;
  if (!cfg.save.empty()) save_lock = ckpt::lock_save_dir(cfg.save, world);
  // Where this rank runs and its OpenMP threads (docs/clusters.md): an error if they oversubscribe.
  const comm::HostPlacement placement = comm::host_placement(world);
  const comm::ThreadPlan thread_plan = comm::plan_threads(placement, comm::requested_threads());
  omp_set_num_threads(thread_plan.threads);
  log::info("launch: ", world.size(), " rank", world.size() == 1 ? "" : "s", "; ",
            thread_plan.text);
  if (thread_plan.oversubscribed && placement.local_rank == 0) {
    log::warn("launch: more ranks than cores on this host, they share cores: ", thread_plan.text);
  }

  // Tokenizer: sets the vocabulary size.
  auto tokenizer = data::make_tokenizer({.type = cfg.tokenizer_type,
                                         .vocab_file = cfg.vocab_file,
                                         .merge_file = cfg.merge_file,
                                         .model_file = cfg.tokenizer_model,
                                         .vocab_size = cfg.null_tokenizer_vocab_size});
  cfg.model.vocab_size = tokenizer->vocab_size();
  if (cfg.pad_vocab_size_to > 0) {
    // Megatron-DeepSpeed's --pad-vocab-size-to: padded = N exactly, via the padding multiple.
    TRIDENT_CHECK(cfg.pad_vocab_size_to >= cfg.model.vocab_size, "--pad-vocab-size-to ",
                  cfg.pad_vocab_size_to, " is smaller than the tokenizer's vocabulary (",
                  cfg.model.vocab_size, ")");
    TRIDENT_CHECK(cfg.pad_vocab_size_to % cfg.tensor_model_parallel_size == 0,
                  "--pad-vocab-size-to ", cfg.pad_vocab_size_to,
                  " must be divisible by --tensor-model-parallel-size ",
                  cfg.tensor_model_parallel_size);
    cfg.model.make_vocab_size_divisible_by = cfg.pad_vocab_size_to / cfg.tensor_model_parallel_size;
  }
  model::ModelConfig& mc = cfg.model;
  mc.validate();

  // Data: Megatron's GPTDataset / BlendedDataset indices, built (or loaded from the cache) on
  // rank 0 first, then loaded by the other ranks.
  const int dp = layout.dp_size, dp_rank = par.coord().dp;
  data::DatasetBuildConfig dcfg;
  dcfg.data_path = cfg.data_path;
  dcfg.train_data_path = cfg.train_data_path;
  dcfg.valid_data_path = cfg.valid_data_path;
  dcfg.test_data_path = cfg.test_data_path;
  dcfg.split = cfg.split;
  dcfg.seq_length = mc.seq_length;
  dcfg.seed = static_cast<std::int64_t>(cfg.seed);
  dcfg.num_samples = {
      cfg.train_samples > 0 ? cfg.train_samples : cfg.train_iters * cfg.global_batch_size,
      (cfg.train_iters / cfg.eval_interval + 1) * cfg.eval_iters * cfg.global_batch_size,
      cfg.eval_iters * cfg.global_batch_size};
  dcfg.data_cache_path = cfg.data_cache_path;
  dcfg.mid_level_dataset_surplus = cfg.mid_level_dataset_surplus;
  dcfg.tokenizer = tokenizer_identity(cfg);
  dcfg.eod_id = tokenizer->eod();
  data::TrainValidTestDatasets datasets;
  if (world.rank() == 0) datasets = data::build_train_valid_test_datasets(dcfg);
  world.barrier();
  if (world.rank() != 0) {
    dcfg.cache_mode = data::CacheMode::kLoadOnly;
    datasets = data::build_train_valid_test_datasets(dcfg);
  }
  TRIDENT_CHECK(datasets.train != nullptr, "no training data: the split '", cfg.split,
                "' gives the training set no documents");
  log::info("data: train ", datasets.train->describe());
  if (datasets.valid) log::info("data: valid ", datasets.valid->describe());
  if (datasets.test) log::info("data: test ", datasets.test->describe());
  std::optional<data::RampupBatchSize> rampup;
  if (!cfg.rampup_batch_size.empty()) {
    rampup = data::RampupBatchSize{cfg.rampup_batch_size[0], cfg.rampup_batch_size[1],
                                   cfg.rampup_batch_size[2]};
  }
  const data::BatchSchedule batches(
      {.global_batch_size = cfg.global_batch_size,
       .micro_batch_size = cfg.micro_batch_size,
       .data_parallel_size = dp,
       .rampup = rampup,
       .decrease_batch_size_if_needed = cfg.decrease_batch_size_if_needed});

  // This rank's part of the model: its pipeline chunks, each a tensor-parallel slice.
  const PipelineSplit split{.pp_size = layout.pp_size,
                            .num_chunks = cfg.virtual_pipeline_chunks(),
                            .first_stage_layers = cfg.decoder_first_pipeline_num_layers,
                            .last_stage_layers = cfg.decoder_last_pipeline_num_layers};
  const RankModel rank_model(mc, split, layout.tp_size, par.coord().tp, par.coord().pp,
                             cfg.sequence_parallel);
  const std::int64_t n = rank_model.total_numel();
  // Parameters, gradients and Adam moments, sharded over data-parallel ranks by ZeRO stage.
  ZeroOptimizer optimizer(
      rank_model, par, cfg.adamw,
      {.stage = cfg.zero_stage,
       .bucket_size = cfg.ddp_bucket_size,
       .bf16 = cfg.bf16,
       .offload = cfg.offload});
  OffloadReporter offload_report(optimizer, cfg);

  const std::int64_t B = cfg.micro_batch_size, T = mc.seq_length;
  std::int64_t micro_batches = cfg.num_micro_batches(world.size());
  model::TpTraffic tp_traffic;
  std::vector<model::ModelRuntime> runtimes;
  for (const ModelChunk& ch : rank_model.chunks()) {
    model::ModelRuntime rt;
    rt.shard = ch.shard;
    rt.tp = &par.tp();
    rt.dropout_seed = cfg.seed ^ 0x5eed0d0bull;
    rt.tp_traffic = &tp_traffic;
    runtimes.push_back(rt);
  }
  optimizer.install_hooks(runtimes);
  const auto schedule_kind = parallel::parse_pipeline_schedule(cfg.pipeline_schedule);
  PipelineExecutor executor(rank_model, par, schedule_kind, static_cast<int>(micro_batches), B,
                            runtimes);
  executor.set_backward_listener(
      [&optimizer](int chunk, bool last) { optimizer.begin_backward(chunk, last); });

  log::info("model: GPT ", mc.num_layers, " layers, hidden ", mc.hidden_size, ", heads ",
            mc.num_attention_heads, ", ffn ", mc.ffn(), ", vocab ", mc.vocab_size, " (padded ",
            mc.padded_vocab_size(layout.tp_size), "), ", mc.num_parameters(), " parameters");
  log::info("layout: tp ", layout.tp_size, " x pp ", layout.pp_size, " x dp ", dp, " on ",
            world.size(), " ranks; ", rank_model.chunks().size(), " chunk(s) per stage, ",
            pipeline_schedule_name(schedule_kind), " schedule; this rank holds ",
            rank_model.num_parameters(), " parameters");
  const MemoryReport mem = optimizer.memory();
  log::info("memory per rank (ZeRO stage ", cfg.zero_stage, ", dp ", dp, "): parameters ",
            mem.param_bytes, " B, gradients ", mem.grad_bytes, " B, optimizer state ",
            mem.optimizer_bytes, " B; staging ", mem.staging_bytes, " B; activations ",
            executor.slots_per_chunk(), " slot(s) x ", executor.activation_bytes_per_slot(0), " B");
  log::info("memory per rank predicted by the ZeRO paper's formulas (psi = ", n,
            " parameters on this rank): parameters ", mem.predicted_param_bytes, " B, gradients ",
            mem.predicted_grad_bytes, " B, optimizer state ", mem.predicted_optimizer_bytes,
            " B (differences: shard padding)");

  ckpt::CheckpointState state;
  state.config = cfg.to_json();
  state.layout = {{"tp", layout.tp_size},
                  {"pp", layout.pp_size},
                  {"dp", dp},
                  {"virtual_chunks", cfg.virtual_pipeline_chunks()},
                  {"first_stage_layers", cfg.decoder_first_pipeline_num_layers},
                  {"last_stage_layers", cfg.decoder_last_pipeline_num_layers},
                  {"zero_stage", cfg.zero_stage}};
  state.coords = {{"tp", par.coord().tp}, {"pp", par.coord().pp}, {"dp", dp_rank}};
  state.tp_rank = par.coord().tp;
  for (const ModelChunk& ch : rank_model.chunks()) state.tables.push_back({&ch.table, ch.base});
  state.numel = n;
  auto slice = [](ZeroOptimizer::TensorSlice t) {
    return ckpt::CheckpointState::Slice{t.data, t.range.begin, t.range.end};
  };
  state.params = slice(optimizer.params_slice());
  state.exp_avg = slice(optimizer.exp_avg_slice());
  state.exp_avg_sq = slice(optimizer.exp_avg_sq_slice());
  state.exp_avg.mapped = state.exp_avg_sq.mapped = optimizer.offload() != nullptr;
  // `trident convert` writes other layouts' shards from the same rule (zero_optimizer.h).
  TRIDENT_ASSERT(ZeroOptimizer::stored_range(cfg.zero_stage, false, n, dp, dp_rank) ==
                         optimizer.params_slice().range &&
                     ZeroOptimizer::stored_range(cfg.zero_stage, true, n, dp, dp_rank) ==
                         optimizer.exp_avg_slice().range,
                 "checkpoint slices disagree with ZeroOptimizer::stored_range");
  std::int64_t iteration = 0, consumed = 0, consumed_valid = 0;
  std::int64_t skipped_iters = 0, nan_iters = 0;
  if (!cfg.load.empty()) {
    // A Megatron or DeepSpeed checkpoint is not "nothing to load".
    const std::string foreign = describe_foreign_checkpoint(cfg.load);
    TRIDENT_CHECK(foreign.empty(), "--load ", cfg.load, ": ", foreign);
  }
  const bool have_checkpoint = !cfg.load.empty() && ckpt::has_checkpoint(cfg.load);
  TRIDENT_CHECK(have_checkpoint || !cfg.exit_on_missing_checkpoint, "--load ", cfg.load,
                ": no trident checkpoint there (--exit-on-missing-checkpoint)");
  if (have_checkpoint) {
    if (cfg.finetune) {  // weights only: the moments stay zero (null data skips a tensor)
      const ckpt::CheckpointState::Slice m = state.exp_avg, v = state.exp_avg_sq;
      state.exp_avg.data = state.exp_avg_sq.data = nullptr;
      ckpt::load_checkpoint(cfg.load, -1, state, world);
      state.exp_avg = m;
      state.exp_avg_sq = v;
      state.trainer_state = nlohmann::json::object();
      log::info("train: --finetune: weights of ", cfg.load, " iteration ", state.iteration,
                "; starting at iteration 0 with a fresh optimizer");
    } else {
      ckpt::load_checkpoint(cfg.load, -1, state, world);
      iteration = state.iteration;
      consumed = state.consumed_train_samples;
      consumed_valid = state.consumed_valid_samples;
    }
    optimizer.checkpoint_io_done(/*written=*/true);
    skipped_iters = state.trainer_state.value("skipped_iterations", std::int64_t{0});
    nan_iters = state.trainer_state.value("nan_iterations", std::int64_t{0});
  } else {
    if (!cfg.load.empty())
      log::warn("ckpt: nothing to load in ", cfg.load, "; starting from scratch");
    optimizer.init_params(cfg.seed);
  }
  optimizer.refresh_bf16(ctx);

  double peak = cfg.peak_tflops;
  if (peak <= 0) {
    peak = measure_peak_tflops();
    world.all_reduce(&peak, 1, comm::Datatype::kF64, comm::ReduceOp::kMin);
  }
  log::info("train: global batch ", cfg.global_batch_size, " = micro ", B, " x ", micro_batches,
            " micro-batches x ", dp, " data-parallel; ", omp_get_max_threads(),
            " threads per rank; MFU against ", peak, " TFLOP/s per rank (",
            cfg.peak_tflops > 0 ? "--peak-tflops" : "measured FP32 GEMM", ")");

  MetricsWriter metrics(world.rank() == 0 ? cfg.metrics_jsonl : std::string());
  // Megatron's TensorBoard scalars (training.py: training_log, evaluate_and_print_results).
  TensorBoardWriter tb(world.rank() == 0 ? cfg.tensorboard_dir : std::string());
  if (tb.enabled()) log::info("tensorboard: writing ", tb.path());
  optim::LossScaler scaler({.dynamic = cfg.fp16 && cfg.loss_scale <= 0,
                            .static_scale = cfg.fp16 && cfg.loss_scale > 0 ? cfg.loss_scale : 1.0,
                            .initial_scale = cfg.initial_loss_scale,
                            .min_scale = cfg.min_loss_scale,
                            .window = cfg.loss_scale_window,
                            .hysteresis = cfg.hysteresis});
  if (!cfg.load.empty() && state.trainer_state.contains("loss_scale")) {
    scaler.set_state({state.trainer_state["loss_scale"].get<double>(),
                      state.trainer_state["growth_tracker"].get<std::int64_t>(),
                      state.trainer_state["hysteresis_tracker"].get<std::int64_t>()});
  }
  // Megatron's scheduler counts samples of successful steps (a skipped step does not advance it).
  optim::MegatronLrScheduler lr_sched(
      {.samples = cfg.lr_steps,
       .warmup_tokens = cfg.lr_warmup_tokens >= 0
                            ? std::optional<double>(static_cast<double>(cfg.lr_warmup_tokens))
                            : std::nullopt,
       .decay_tokens = cfg.lr_decay_tokens > 0
                           ? std::optional<double>(static_cast<double>(cfg.lr_decay_tokens))
                           : std::nullopt});
  if (have_checkpoint) {
    optim::MegatronLrScheduler::State ls;
    // Checkpoints written before the scheduler was saved: every step counted.
    ls.num_steps = state.trainer_state.value("lr_num_steps", static_cast<double>(consumed));
    ls.num_tokens = state.trainer_state.value("lr_num_tokens", 0.0);
    if (state.trainer_state.contains("lr_warmup_tokens"))
      ls.warmup_tokens = state.trainer_state["lr_warmup_tokens"].get<double>();
    lr_sched.set_state(ls);
  }
  const std::int32_t mask_eod = cfg.eod_mask_loss ? tokenizer->eod() : -1;
  std::vector<std::int32_t> scratch;
  const bool counts_loss = par.is_last_stage() && par.coord().tp == 0;
  // The mean loss over the global batch: the last stage's tp rank 0 of every replica contributes.
  auto global_loss = [&](const model::LossSum& mine) {
    double v[2] = {counts_loss ? mine.sum : 0.0,
                   counts_loss ? static_cast<double>(mine.count) : 0.0};
    world.all_reduce(v, 2, comm::Datatype::kF64, comm::ReduceOp::kSum);
    return v[0] / std::max(v[1], 1.0);
  };

  // Evaluation continues through the validation set (consumed_valid_samples), as Megatron's
  // validation iterator does, at the full global batch size.
  auto evaluate = [&](std::int64_t it, const char* suffix = "", bool test = false) {
    const data::SampleDataset* eval_ds = test ? datasets.test.get() : datasets.valid.get();
    if (!eval_ds || cfg.eval_iters == 0) return;
    std::int64_t test_consumed = 0;
    std::int64_t& eval_consumed = test ? test_consumed : consumed_valid;
    const model::TpTraffic training_traffic = tp_traffic;  // evaluation is not counted
    model::LossSum total;
    const std::int64_t eval_micro = cfg.global_batch_size / (B * dp);
    for (std::int64_t e = 0; e < cfg.eval_iters; ++e) {
      const std::int64_t first = eval_consumed;
      const model::LossSum l = executor.evaluate(
          ctx, optimizer.views(), static_cast<int>(eval_micro),
          {.fill =
               [&](int j, std::int32_t* tokens, std::int32_t* labels) {
                 fill_micro_batch(*eval_ds, first, B, dp, dp_rank, j, tokens, labels, scratch,
                                  mc.vocab_size, mask_eod);
               },
           .first_sample =
               [&](int j) { return data::micro_batch_first_sample(first, j, dp_rank, B, dp); },
           .iteration = it});
      eval_consumed += cfg.global_batch_size;
      total.sum += l.sum;
      total.count += l.count;
    }
    const double loss = global_loss(total);
    const double ppl = std::exp(std::min(loss, 20.0));
    // Megatron's lines: dashes, the result, dashes.
    const std::string line =
        str(" validation loss at iteration ", it, suffix, " | lm loss value: ", fmt_e(loss),
            " | lm loss PPL: ", fmt_e(ppl), " | ");
    log::info(std::string(line.size() + 1, '-'));
    log::info(line);
    log::info(std::string(line.size() + 1, '-'));
    metrics.write(
        {{"iteration", it}, {"split", test ? "test" : "valid"}, {"lm_loss", loss}, {"ppl", ppl}});
    if (!test) {
      tb.add_scalar("lm loss validation", loss, it);
      tb.add_scalar("lm loss validation vs samples", loss, consumed);
      if (cfg.log_validation_ppl_to_tensorboard) {
        tb.add_scalar("lm loss validation ppl", ppl, it);
        tb.add_scalar("lm loss validation ppl vs samples", ppl, consumed);
      }
    }
    tp_traffic = training_traffic;
  };
  CheckpointSaver saver(cfg.save, cfg.async_save, {.retain = cfg.save_retain});
  auto save = [&](std::int64_t it) {
    if (cfg.save.empty()) return;
    state.iteration = it;
    state.consumed_train_samples = consumed;
    state.consumed_valid_samples = consumed_valid;
    const optim::LossScaler::State ls = scaler.state();
    state.trainer_state = {{"loss_scale", ls.scale},
                           {"growth_tracker", ls.growth_tracker},
                           {"hysteresis_tracker", ls.hysteresis_tracker},
                           {"skipped_iterations", skipped_iters},
                           {"nan_iterations", nan_iters},
                           {"lr_num_steps", lr_sched.state().num_steps},
                           {"lr_num_tokens", lr_sched.state().num_tokens}};
    if (lr_sched.state().warmup_tokens)
      state.trainer_state["lr_warmup_tokens"] = *lr_sched.state().warmup_tokens;
    const double blocked = saver.save(state, world);
    optimizer.checkpoint_io_done(/*written=*/false);
    log::info("ckpt: ", cfg.async_save ? "started saving" : "saved", " iteration ", it, " to ",
              cfg.save, " (training blocked ", blocked, " ms", cfg.async_save ? ", async" : "",
              ")");
  };

  double interval_loss = 0, interval_loss_all = 0, interval_ms = 0, interval_busy = 0,
         interval_pipe = 0;
  double interval_cpu0 = process_cpu_ms();  // CPU time per iteration: timing on a shared machine
  double interval_flops = 0, interval_tokens = 0;
  std::int64_t interval_iters = 0, interval_skipped = 0, interval_nan = 0, interval_advanced = 0;
  // Megatron-DeepSpeed's --train-tokens also ends training.
  auto tokens_left = [&] { return cfg.train_tokens == 0 || consumed * T < cfg.train_tokens; };
  while (iteration < cfg.train_iters && tokens_left()) {
    core::Timer timer;
    par.set_step(iteration + 1);
    const data::StepBatch step_batch = batches.at(consumed);
    if (step_batch.num_micro_batches != micro_batches) {
      micro_batches = step_batch.num_micro_batches;  // --rampup-batch-size
      executor.set_num_microbatches(static_cast<int>(micro_batches));
    }
    const std::int64_t tokens_per_iter = step_batch.running_global_batch_size * T;
    optimizer.begin_iteration();
    // Every token of the global batch weighs 1 / (tokens in the global batch).
    const float d_scale = static_cast<float>(scaler.scale()) / static_cast<float>(tokens_per_iter) *
                          test_gradient_poison(iteration + 1, world.rank());
    const PipelineStats ps = executor.train(
        ctx, optimizer.views(), d_scale,
        {.fill =
             [&](int j, std::int32_t* tokens, std::int32_t* labels) {
               fill_micro_batch(*datasets.train, consumed, B, dp, dp_rank, j, tokens, labels,
                                scratch, mc.vocab_size, mask_eod);
             },
         .first_sample =
             [&](int j) { return data::micro_batch_first_sample(consumed, j, dp_rank, B, dp); },
         .iteration = iteration + 1});
    const double lr = lr_sched.lr();  // the rate this iteration uses
    const OptimizerStepResult step =
        optimizer.step(ctx, lr, iteration + 1,
                       {.loss_scale = scaler.scale(),
                        .overflow_threshold = cfg.fp16 ? optim::kFp16Max : INFINITY});
    const double used_scale = scaler.scale();
    if (cfg.fp16) scaler.update(step.skipped);
    const double lm_loss = global_loss(ps.loss);
    if (!step.skipped) {
      lr_sched.step(static_cast<double>(step_batch.running_global_batch_size),
                    static_cast<double>(consumed * T));
    }
    ++iteration;
    consumed += step_batch.running_global_batch_size;
    if (step.skipped || !std::isfinite(lm_loss)) {
      ++skipped_iters;
      ++interval_skipped;
      if (!std::isfinite(lm_loss) || !std::isfinite(step.grad_norm)) {
        ++nan_iters;
        ++interval_nan;
      }
      if (cfg.fp16) {
        log::warn("train: iteration ", iteration, ": gradient overflow at loss scale ", used_scale,
                  "; update skipped, loss scale now ", scaler.scale());
      } else {
        log::warn("train: iteration ", iteration, ": loss ", lm_loss, ", grad norm ",
                  step.grad_norm, " is not finite; update skipped");
      }
    }
    const double iter_ms = timer.elapsed_ms();
    interval_loss_all += lm_loss;  // --metrics-jsonl: every iteration of the interval
    if (!step.skipped && std::isfinite(lm_loss)) {
      interval_loss += lm_loss;  // Megatron averages over the iterations that advanced
      ++interval_advanced;
    }
    interval_flops += mc.flops_per_iteration(tokens_per_iter);
    interval_tokens += tokens_per_iter;
    interval_ms += iter_ms;
    interval_busy += ps.busy_ms;
    interval_pipe += ps.total_ms;
    ++interval_iters;

    if (tb.enabled() && iteration % cfg.tensorboard_log_interval == 0) {
      auto both = [&](const char* name, double v) {
        tb.add_scalar(name, v, iteration);
        tb.add_scalar(std::string(name) + " vs samples", v, consumed);
      };
      if (!cfg.no_log_learning_rate_to_tensorboard) both("learning-rate", lr);
      both("batch-size", static_cast<double>(step_batch.running_global_batch_size));
      if (std::isfinite(lm_loss) && !step.skipped) both("lm loss", lm_loss);
      if (!cfg.no_log_loss_scale_to_tensorboard) both("loss-scale", used_scale);
      if (cfg.log_world_size_to_tensorboard) both("world-size", world.size());
      if (cfg.adamw.clip_grad > 0) both("grad-norm", step.grad_norm);
      if (cfg.log_memory_to_tensorboard) {
        tb.add_scalar("mem-allocated-bytes",
                      static_cast<double>(mem.param_bytes + mem.grad_bytes + mem.optimizer_bytes +
                                          mem.staging_bytes),
                      iteration);
      }
    }
    if (iteration % cfg.log_interval == 0 || iteration == cfg.train_iters) {
      const double avg_loss =
          interval_advanced > 0 ? interval_loss / static_cast<double>(interval_advanced) : 0.0;
      const double avg_ms = interval_ms / static_cast<double>(interval_iters);
      const double tokens_per_s = interval_tokens / (interval_ms / 1e3);
      const double tflops = interval_flops / (interval_ms / 1e3) / 1e12 / world.size();
      // Pipeline bubble: the share of the schedule this stage spent waiting, per stage.
      std::vector<double> idle(static_cast<std::size_t>(layout.pp_size), 0.0);
      const double my_idle = interval_pipe > 0 ? 1.0 - interval_busy / interval_pipe : 0.0;
      par.pp().all_gather(&my_idle, idle.data(), 1, comm::Datatype::kF64);
      if (cfg.log_timers_to_tensorboard) {
        tb.add_scalar("iteration-time", avg_ms / 1e3, iteration);
        if (cfg.log_throughput) tb.add_scalar("throughput", tflops, iteration);
      }
      log::info(iteration_log_line(
          {.megatron_deepspeed = cfg.megatron_deepspeed_log,
           .log_throughput = cfg.log_throughput,
           .iteration = iteration,
           .train_iters = cfg.train_iters,
           .consumed_samples = consumed,
           .consumed_tokens = consumed * T,
           .iter_ms = avg_ms,
           .tflops_per_rank = tflops,
           .lr = lr,
           .global_batch_size = step_batch.running_global_batch_size,
           .lm_loss = avg_loss,
           .loss_scale = used_scale,
           .grad_norm =
               cfg.adamw.clip_grad > 0 ? std::optional<double>(step.grad_norm) : std::nullopt,
           .skipped = interval_skipped,
           .nan = interval_nan,
           .samples_per_s =
               static_cast<double>(interval_tokens) / static_cast<double>(T) / (interval_ms / 1e3),
           .seq_length = T}));
      nlohmann::json record = {
          {"iteration", iteration},
          {"consumed_samples", consumed},
          {"lm_loss", interval_loss_all / static_cast<double>(interval_iters)},
          {"lr", lr},
          {"grad_norm", step.grad_norm},
          {"iter_ms", avg_ms},
          {"iter_cpu_ms", (process_cpu_ms() - interval_cpu0) / static_cast<double>(interval_iters)},
          {"tokens_per_s", tokens_per_s},
          {"tflops", tflops},
          {"mfu", tflops / peak},
          {"skipped_iterations", skipped_iters},
          {"nan_iterations", nan_iters},
          {"global_batch_size", step_batch.running_global_batch_size},
          {"loss_scale", used_scale}};
      // Data-parallel traffic this rank sent per iteration (ring-algorithm bytes).
      record["dp_comm_bytes_per_iteration"] =
          optimizer.comm().dp_bytes / static_cast<double>(interval_iters);
      optimizer.reset_comm();
      offload_report.interval(record, interval_iters);
      if (layout.tp_size > 1) {
        const double iters = static_cast<double>(interval_iters);
        record["tp_comm_bytes_per_iteration"] = tp_traffic.bytes / iters;
        record["tp_all_reduces_per_iteration"] =
            static_cast<double>(tp_traffic.all_reduces) / iters;
        record["tp_all_gathers_per_iteration"] =
            static_cast<double>(tp_traffic.all_gathers) / iters;
        record["tp_reduce_scatters_per_iteration"] =
            static_cast<double>(tp_traffic.reduce_scatters) / iters;
        tp_traffic = {};
      }
      if (layout.pp_size > 1) {
        record["pipeline_idle_fraction"] = idle;
        std::string text;
        for (double f : idle) text += core::str(text.empty() ? "" : " ", f);
        log::info("pipeline: idle fraction per stage [", text, "] (",
                  pipeline_schedule_name(schedule_kind), ", ", micro_batches, " micro-batches)");
      }
      metrics.write(record);
      interval_loss = interval_loss_all = interval_ms = interval_busy = interval_pipe =
          interval_flops = 0;
      interval_cpu0 = process_cpu_ms();
      interval_tokens = 0;
      interval_iters = interval_skipped = interval_nan = interval_advanced = 0;
    }
    if (iteration % cfg.eval_interval == 0) evaluate(iteration);
    saver.poll(world);  // finishes a background save once every rank has written its shard
    // Clean stops: save (when --save) and exit with the condition's code.
    int stop = stops.check(world);
    if (stop == 0 && cfg.exit_interval > 0 && iteration % cfg.exit_interval == 0)
      stop = kExitIntervalStop;
    if (iteration == cfg.train_iters) stop = 0;  // done anyway
    if ((cfg.save_interval > 0 && iteration % cfg.save_interval == 0) || stop != 0) save(iteration);
    if (stop != 0) {
      saver.poll(world, /*block=*/true);
      log::info("train: exiting at iteration ", iteration, " with code ", stop, " (",
                exit_code_name(stop), ")");
      log_peak_rss(world);
      return stop;
    }
  }
  // As Megatron's pretrain(): validation and test at the end of training.
  evaluate(iteration, " on validation set");
  evaluate(iteration, " on test set", /*test=*/true);
  if (cfg.save_interval == 0 || cfg.train_iters % cfg.save_interval != 0) save(iteration);
  saver.poll(world, /*block=*/true);
  log_peak_rss(world);
  return 0;
}

}  // namespace trident::train
