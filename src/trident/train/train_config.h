// TrainConfig: every `trident train` setting, with Megatron-LM's flag names. Parsed once (flags,
// or a TOML file given with --config holding the same keys; flags override it), validated on
// every rank before anything is allocated, and stored in checkpoints.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "trident/model/config.h"
#include "trident/optim/adamw_optimizer.h"
#include "trident/optim/lr_schedule.h"

namespace CLI {
class App;
}

namespace trident::train {

struct TrainConfig {
  model::ModelConfig model;
  std::string model_preset = "gpt";          // --model gpt|bloom
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

  // Batches.
  std::int64_t micro_batch_size = 4;
  std::int64_t global_batch_size = 0;  // 0 -> micro_batch_size * data-parallel size

  // Schedule and optimizer.
  std::int64_t train_iters = 100;
  optim::LrSchedule lr;
  std::string lr_decay_style = "linear";
  optim::AdamWConfig adamw;
  std::uint64_t seed = 1234;

  // Data.
  std::vector<std::string> data_path;  // "prefix" or "w1 prefix1 w2 prefix2 ..." (a blend)
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969, 30, 1";
  std::string data_cache_path;
  double mid_level_dataset_surplus = 0.005;
  std::vector<std::int64_t> rampup_batch_size;  // START INCREMENT SAMPLES
  bool decrease_batch_size_if_needed = false;
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string vocab_file, merge_file, tokenizer_model;
  std::int64_t null_tokenizer_vocab_size = 0;  // --vocab-size, for NullTokenizer
  std::string dataloader_type = "single";      // Megatron's pretraining sampler

  // Evaluation and logging.
  std::int64_t eval_interval = 1000;
  std::int64_t eval_iters = 10;
  std::int64_t log_interval = 100;
  std::string metrics_jsonl;
  double peak_tflops = 0;  // 0 -> measured at start-up (FP32 GEMM)

  // Checkpoints.
  std::string save, load;
  std::int64_t save_interval = 0;
  std::int64_t exit_interval = 0;
  // Stopping cleanly and recovering (docs/failures-and-recovery.md).
  int save_retain = 0;               // --save-retain N: keep the newest N checkpoints (0: all)
  bool async_save = false;           // --async-save: write checkpoints in the background
  bool exit_signal_handler = false;  // --exit-signal-handler: SIGTERM / SIGUSR1 save and exit
  double exit_duration_in_mins = 0;  // --exit-duration-in-mins: save and exit after this long
  std::string kill_switch_path;      // --kill-switch-path: save and exit when this file exists

  // Parallelism: data-parallel size = world size / (tp x pp).
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  bool sequence_parallel = false;
  int zero_stage = 0;  // --zero-stage (--use-distributed-optimizer = 1)
  bool use_distributed_optimizer = false;
  // --hierarchical-dp: host-aware data-parallel all-reduce (docs/clusters.md)
  bool hierarchical_dp = false;
  std::int64_t ddp_bucket_size = 40'000'000;  // elements per gradient bucket
  std::string pipeline_schedule = "1f1b";     // gpipe, 1f1b, interleaved
  std::int64_t num_layers_per_virtual_pipeline_stage = 0;
  std::int64_t decoder_first_pipeline_num_layers = -1;
  std::int64_t decoder_last_pipeline_num_layers = -1;
  double comm_timeout = 300;  // seconds; a collective waiting longer ends the job

  // Fill derived defaults and throw InvalidArgument naming the flag for inconsistent settings.
  // world_size = number of processes.
  void finalize(int world_size);
  int data_parallel_size(int world_size) const;
  int virtual_pipeline_chunks() const;
  std::int64_t num_micro_batches(int world_size) const;

  nlohmann::json to_json() const;
};

// Registers every flag on `app` (the `train` subcommand), writing into cfg, and --config FILE.
void add_train_options(CLI::App& app, TrainConfig& cfg);

}  // namespace trident::train
