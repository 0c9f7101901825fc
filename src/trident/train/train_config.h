// TrainConfig: every `trident train` setting, with Megatron-LM's flag names. Parsed once (flags,
// or a TOML file given with --config holding the same keys; flags override it), validated on
// every rank before anything is allocated, and stored in checkpoints.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "trident/data/data_loader.h"
#include "trident/model/config.h"
#include "trident/optim/lr_schedule.h"
#include "trident/optim/offload.h"
#include "trident/optim/optimizer_config.h"

namespace CLI {
class App;
}

namespace trident::train {

struct TrainConfig {
  TrainConfig();  // Megatron's defaults: dropout 0.1 / 0.1
  model::ModelConfig model;
  std::string model_preset = "gpt";          // --model gpt|bloom|llama
  bool fp16 = false;                         // --fp16: loss scaling (see docs)
  bool bf16 = false;                         // --bf16: BF16 matmuls, FP32 master
  double loss_scale = 0;                     // --loss-scale (0: dynamic)
  double initial_loss_scale = 4294967296.0;  // 2^32, as Megatron
  double min_loss_scale = 1.0;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  std::string recompute_granularity;         // "", full, selective
  std::string recompute_method = "uniform";  // uniform, block
  std::string position_embedding_type = "learned_absolute";
  std::string normalization = "LayerNorm";  // --normalization LayerNorm|RMSNorm
  bool group_query_attention = false;       // --group-query-attention (with --num-query-groups)
  double rotary_percent = 1.0;              // --rotary-percent: only 1.0
  // Mixture of experts: the names of Megatron-Core's enum flags, parsed into model by finalize.
  std::string moe_router_score_function = "softmax";        // softmax, sigmoid
  std::string moe_token_drop_policy = "probs";              // probs, position
  std::string moe_router_load_balancing_type = "aux_loss";  // aux_loss, seq_aux_loss, none

  // Batches.
  std::int64_t micro_batch_size = 4;
  std::int64_t global_batch_size = 0;  // 0 -> micro_batch_size * data-parallel size

  // Schedule and optimizer. Megatron's scheduler counts samples: --lr-*-iters are converted to
  // iterations x global batch size; --train-samples / --lr-*-samples give samples directly;
  // Megatron-DeepSpeed's --train-tokens / --lr-*-tokens count tokens. 0 / negative: not given.
  std::int64_t train_iters = 0;  // 0: from --train-samples, else 100
  std::int64_t train_samples = 0, lr_warmup_samples = 0, lr_decay_samples = 0;
  std::int64_t train_tokens = 0, lr_warmup_tokens = -1, lr_decay_tokens = 0;
  double lr_warmup_fraction = -1;
  optim::LrSchedule lr;        // as given (iterations)
  optim::LrSchedule lr_steps;  // set by finalize: warm-up and decay in samples
  std::string lr_decay_style = "linear";
  std::string optimizer_type = "adam";  // --optimizer adam|lion (finalize sets optimizer.kind)
  optim::OptimizerConfig optimizer;     // the update rule and its hyper-parameters
  std::uint64_t seed = 1234;

  // Data.
  std::vector<std::string> data_path;  // "prefix" or "w1 prefix1 w2 prefix2 ..." (a blend)
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  // BigScience's named groups (--train/valid/test-weighted-split-paths, or the -path files, which
  // finalize reads into these); docs/data-indices.md.
  std::vector<std::string> train_weighted_split_paths, valid_weighted_split_paths,
      test_weighted_split_paths;
  std::string train_weighted_split_paths_path, valid_weighted_split_paths_path,
      test_weighted_split_paths_path;
  bool allow_split_paths_overlap = false;  // validation/test ranges may overlap training's
  std::string split = "969, 30, 1";
  std::string data_cache_path;
  double mid_level_dataset_surplus = 0.005;
  std::vector<std::int64_t> rampup_batch_size;  // START INCREMENT SAMPLES
  // --step-batch-size-schedule "0:16 2.4B:320 ...": thresholds in tokens (Megatron-LM); parsed
  // into step_schedule (thresholds in samples) by finalize.
  std::string step_batch_size_schedule;
  std::vector<data::StepBatchStage> step_schedule;
  bool decrease_batch_size_if_needed = false;
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string vocab_file, merge_file, tokenizer_model;
  std::string tokenizer_name_or_path;  // PretrainedFromHF: a directory or tokenizer.json
  std::int64_t pad_vocab_size_to = 0;  // 0: --make-vocab-size-divisible-by
  bool eod_mask_loss = false;
  std::int64_t null_tokenizer_vocab_size = 0;  // --vocab-size, for NullTokenizer
  std::string dataloader_type = "single";      // Megatron's pretraining sampler

  // Evaluation and logging.
  std::int64_t eval_interval = 1000;
  std::int64_t eval_iters = 100;
  std::int64_t log_interval = 100;
  bool megatron_deepspeed_log = false;  // Megatron-DeepSpeed's iteration line
  std::string tensorboard_dir;
  std::int64_t tensorboard_log_interval = 1;
  bool log_timers_to_tensorboard = false, log_batch_size_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false, log_memory_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false, log_throughput = false;
  bool no_log_loss_scale_to_tensorboard = false, no_log_learning_rate_to_tensorboard = false;
  std::string metrics_jsonl;
  double peak_tflops = 0;  // 0 -> measured at start-up (FP32 GEMM)
  // --profile: trident's per-op timers (core/profile.h) on rank 0 over the iterations after
  // iteration profile_step_start up to profile_step_end (Megatron's numbering and defaults).
  bool profile = false;
  std::int64_t profile_step_start = 10, profile_step_end = 12;

  // Checkpoints.
  std::string save, load;
  bool finetune = false;  // --finetune: load weights only; iteration, data and optimizer restart
  std::int64_t save_interval = 0;
  std::int64_t exit_interval = 0;
  bool exit_on_missing_checkpoint = false;

  // DeepSpeed: with --deepspeed, --deepspeed_config FILE is read (docs/training.md).
  bool deepspeed = false;
  std::string deepspeed_config;

  // Stopping cleanly and recovering (docs/failures-and-recovery.md).
  int save_retain = 0;               // --save-retain N: keep the newest N checkpoints (0: all)
  bool async_save = false;           // --async-save: write checkpoints in the background
  bool exit_signal_handler = false;  // --exit-signal-handler: SIGTERM / SIGUSR1 save and exit
  double exit_duration_in_mins = 0;  // --exit-duration-in-mins: save and exit after this long
  std::string kill_switch_path;      // --kill-switch-path: save and exit when this file exists
  // --exit-codes: what a planned stop exits with: "megatron" (0, the default) or "distinct" (its
  // own code, 10-13; exit_codes.h). TRIDENT_EXIT_CODES sets it when the flag is not given.
  std::string exit_codes = "megatron";
  bool distinct_exit_codes() const { return exit_codes == "distinct"; }
  // --loss-chunk-rows: -1 auto (model::auto_loss_chunk_rows, once the vocabulary is known), 0 the
  // full logits, else rows per chunk; resolved into model.loss_chunk_rows by
  // resolve_loss_chunk_rows().
  std::int64_t loss_chunk_rows = -1;

  // Parallelism: data-parallel size = world size / (tp x pp).
  int tensor_model_parallel_size = 1;
  int expert_model_parallel_size = 1;  // the experts split over this many dp ranks
  int context_parallel_size = 1;       // the sequence split over this many ranks (ring attention)
  int ds_sequence_parallel_size = 1;   // DeepSpeed-Ulysses: the same split, heads by all-to-all
  // The ranks each sequence is split over (either of the two above), and whether by Ulysses.
  int sequence_split() const {
    return ds_sequence_parallel_size > 1 ? ds_sequence_parallel_size : context_parallel_size;
  }
  bool ulysses() const { return ds_sequence_parallel_size > 1; }
  int pipeline_model_parallel_size = 1;
  bool sequence_parallel = false;
  int zero_stage = 0;  // --zero-stage (--use-distributed-optimizer = 1)
  bool use_distributed_optimizer = false;
  // --hierarchical-dp: host-aware data-parallel all-reduce (docs/clusters.md)
  bool hierarchical_dp = false;
  // --device: where the model trains: "cpu", "cuda" (this rank's GPU: its local rank among the
  // ranks of its host, modulo the GPUs it sees), or "auto" (the default: cuda when the build has
  // CUDA and a GPU is visible, else cpu).
  std::string device = "auto";
  std::int64_t ddp_bucket_size = 40'000'000;  // elements per gradient bucket
  // Optimizer-state offload (docs/offload.md): --offload-optimizer {none,cpu,nvme},
  // --offload-path DIR, --offload-window-mib, --offload-io {uring,threads}, --offload-buffered.
  std::string offload_optimizer = "none";
  std::string offload_params = "none";  // --offload-params: ZeRO-3 parameter shards (none, nvme)
  std::string offload_io = "uring";
  double offload_window_mib = 48;
  bool offload_buffered = false;
  optim::OffloadConfig offload;            // the above, parsed by finalize() (path: --offload-path)
  std::string pipeline_schedule = "1f1b";  // gpipe, 1f1b, interleaved
  std::int64_t num_layers_per_virtual_pipeline_stage = 0;
  std::int64_t decoder_first_pipeline_num_layers = -1;
  std::int64_t decoder_last_pipeline_num_layers = -1;
  double comm_timeout = 300;  // seconds; a collective waiting longer ends the job
  std::int64_t virtual_pipeline_model_parallel_size = 0;  // mapped from Megatron's flag
  bool no_pipeline_parallel = false;

  // Megatron / DeepSpeed flags trident maps or accepts (docs/flags.md), by name, with values;
  // the flags given explicitly (command line or --config); warnings to print at start-up.
  std::map<std::string, std::vector<std::string>> compat;
  std::set<std::string> given;
  std::vector<std::string> warnings;

  // Fill derived defaults and throw InvalidArgument naming the flag for inconsistent settings.
  // world_size = number of processes.
  void finalize(int world_size);
  // Once model.vocab_size is known (the tokenizer): model.loss_chunk_rows from --loss-chunk-rows.
  void resolve_loss_chunk_rows() {
    model.loss_chunk_rows = loss_chunk_rows < 0 ? model.auto_loss_chunk_rows() : loss_chunk_rows;
  }
  int data_parallel_size(int world_size) const;
  // The batch-size schedule (--global-batch-size, --rampup-batch-size or
  // --step-batch-size-schedule) for data-parallel size dp, after finalize.
  data::BatchScheduleConfig batch_schedule_config(int dp) const;
  int virtual_pipeline_chunks() const;
  std::int64_t num_micro_batches(int world_size) const;

  nlohmann::json to_json() const;
  // Megatron's start-up table: "------ arguments ------", one "  name ..... value" line per
  // setting, sorted.
  std::string arguments_table() const;

 private:
  // The parts of finalize, in order.
  void finalize_model();
  void finalize_moe();
  void finalize_moe_groups();
  void finalize_parallel(int world_size);
  void finalize_context_parallel(int dp);
  void finalize_offload();
  void finalize_schedule(int dp);
  void finalize_split_paths();
};

// Python's repr of a float (what Megatron's argument table prints): the shortest digits that
// read back as x, in fixed notation with at least one decimal (0.9, 1000.0, 0.0001) unless the
// decimal exponent is below -4 or above 15 (1e-08, 1e+16).
std::string python_float_repr(double x);

// Registers every flag on `app` (the `train` subcommand), writing into cfg, and --config FILE.
void add_train_options(CLI::App& app, TrainConfig& cfg);
// After parsing: notes in cfg.given which flags were given (the command line or --config).
void record_given_flags(const CLI::App& app, TrainConfig& cfg);

}  // namespace trident::train
