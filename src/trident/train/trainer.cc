#include "trident/train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/ckpt/save_lock.h"
#include "trident/comm/launch.h"
#include "trident/core/arena.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/profile.h"
#include "trident/core/timer.h"
#include "trident/data/data_loader.h"
#include "trident/data/dataset_builder.h"
#include "trident/data/indexed_dataset.h"
#include "trident/data/tokenizer.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/memory.h"
#include "trident/model/gpt.h"
#include "trident/model/layers/context_parallel.h"
#include "trident/optim/loss_scaler.h"
#include "trident/parallel/layout.h"
#include "trident/parallel/parallel_context.h"
#include "trident/train/async_saver.h"
#include "trident/train/exit_codes.h"
#include "trident/train/launch_env.h"
#include "trident/train/metrics.h"
#include "trident/train/offload_report.h"
#include "trident/train/pipeline.h"
#include "trident/train/rank_model.h"
#include "trident/train/stop_conditions.h"
#include "trident/train/tensorboard_writer.h"
#include "trident/train/trainer_state.h"
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
// rank r as samples first + j * micro * dp + r * micro + [0, micro). Under context parallelism
// (cp > 1) the rank keeps its two chunks of each sample, chunk-major
// (model/layers/context_parallel.h): tokens and labels hold micro * T / cp rows.
struct DataSlice {
  int dp = 1, dp_rank = 0;  // data-parallel size and rank
  int cp = 1, cp_rank = 0;  // context-parallel size and rank
};
void fill_micro_batch(const data::SampleDataset& ds, std::int64_t first, std::int64_t micro,
                      const DataSlice& d, int j, std::int32_t* tokens, std::int32_t* labels,
                      std::vector<std::int32_t>& scratch, std::int64_t vocab,
                      std::int32_t mask_eod = -1) {
  const std::int64_t T = ds.seq_length(), Tl = T / d.cp;
  scratch.resize(static_cast<std::size_t>(T + 1));
  const std::int64_t start = data::micro_batch_first_sample(first, j, d.dp_rank, micro, d.dp);
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
    for (std::int64_t i = 0; i < Tl; ++i) {
      // Row i of this sample's rows: position t of the sequence.
      const std::int64_t row = d.cp == 1 ? b * T + i : model::layers::cp_chunk_row(micro, Tl, b, i);
      const std::int64_t t =
          d.cp == 1 ? i : model::layers::cp_row_position(d.cp, d.cp_rank, micro, Tl, row);
      tokens[row] = std::max(scratch[static_cast<std::size_t>(t)], 0);
      labels[row] = scratch[static_cast<std::size_t>(t + 1)];
      // --eod-mask-loss: no loss where the input is end-of-document (Megatron's loss_mask).
      if (mask_eod >= 0 && scratch[static_cast<std::size_t>(t)] == mask_eod) labels[row] = -1;
    }
  }
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

// `trident train` as steps: the constructor sets up (launch, data, model, checkpoint, schedules);
// run() trains iteration by iteration, logging, evaluating, saving and stopping between them.
class Trainer {
 public:
  Trainer(TrainConfig cfg, comm::Communicator& world);
  int run();

 private:
  // Set-up, in order.
  void place_ranks();
  void select_device();
  void build_tokenizer();
  void adopt_checkpoint_vocabulary();
  void build_data();
  void build_model();
  void log_model() const;
  void describe_checkpoint_state();
  // A checkpoint of device state goes through host buffers (checkpoint_out before a save,
  // checkpoint_in after a load); on the CPU the slices are the state itself.
  void checkpoint_out();
  void checkpoint_in();
  void resume_or_initialise();
  void build_schedules();
  // An iteration and what follows it.
  IterationResult train_iteration();
  void evaluate(std::int64_t it, const char* suffix = "", bool test = false);
  void evaluate_groups(std::int64_t it, bool at_end, bool test);
  double evaluation_loss(const data::SampleDataset& ds, std::int64_t& consumed,
                         std::int64_t eval_micro, std::int64_t it);
  void save(std::int64_t it);
  int stop_code();
  // Helpers.
  MicroBatches micro_batches_of(const data::SampleDataset& ds, std::int64_t first,
                                std::int64_t iteration);
  double global_loss(const model::LossSum& mine);
  MoeRouting global_moe_routing(const MoeRouting& mine);
  // --moe-router-enable-expert-bias: moves each MoE layer's expert bias by the update rate times
  // sign(mean - tokens) of the global batch's tokens per expert (this rank's counts in `mine`).
  void update_expert_bias(const MoeRouting& mine);

  TrainConfig cfg_;
  comm::Communicator& world_;
  core::Workspace workspace_;  // the kernels' scratch: grown in the first iteration, then reused
  core::ExecContext ctx_{.workspace = &workspace_};  // the device: the host, or a GPU (--device)
  const parallel::ParallelLayout layout_;
  parallel::ParallelContext par_;
  // The ranks holding the same dense weights (ZeRO shards and gradient sums over them: data
  // parallel x context parallel), and this rank's slice of the data.
  const int dp_, dp_rank_;
  const DataSlice data_;
  std::optional<StopConditions> stops_;
  std::unique_ptr<ckpt::SaveLock> save_lock_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::int32_t mask_eod_ = -1;
  data::TrainValidTestDatasets datasets_;
  std::optional<data::BatchSchedule> batches_;
  std::optional<RankModel> rank_model_;
  std::optional<ZeroOptimizer> optimizer_;
  // Expert parallelism: the dense parameters and the experts in optimizers of their own (the
  // experts data-parallel over the expert-data-parallel group), each over its part's tables;
  // optimizer_ is then the dense one.
  std::optional<RankModel> dense_model_, expert_model_;
  std::optional<ZeroOptimizer> expert_optimizer_;
  std::vector<std::unique_ptr<MergedLayerWeights>> merged_weights_;
  std::optional<OffloadReporter> offload_report_;
  model::TpTraffic tp_traffic_;
  parallel::PipelineScheduleKind schedule_kind_{};
  std::optional<GptPipeline> pipeline_;
  std::int64_t B_ = 0, T_ = 0, micro_batches_ = 0;
  MemoryReport mem_{};
  ckpt::CheckpointState state_;
  ckpt::CheckpointState expert_state_;  // expert parallelism: the experts' part (state_.experts)
  // On a device: the host buffers the checkpoint slices go through, and where they live on the
  // device (params, then the optimizer's state arrays).
  std::vector<kernels::HostBuffer> ckpt_host_;
  std::vector<ckpt::CheckpointState::Slice> ckpt_device_;
  Progress progress_;
  bool have_checkpoint_ = false;
  TrainerState resumed_;  // the checkpoint's trainer state (defaults without one or on --finetune)
  std::optional<optim::LossScaler> scaler_;
  std::optional<optim::MegatronLrScheduler> lr_sched_;
  std::optional<CheckpointSaver> saver_;
  std::optional<TrainingLog> log_;  // the log line, metrics, TensorBoard, the profile window
  std::vector<std::int32_t> scratch_;
};

TrainConfig finalized(TrainConfig cfg, int world_size) {
  cfg.finalize(world_size);
  return cfg;
}

parallel::ParallelLayout layout_of(const TrainConfig& cfg, int world_size) {
  parallel::ParallelLayout l = parallel::ParallelLayout::from_world_size(
      world_size, cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size);
  l.ep_size = cfg.expert_model_parallel_size;
  l.cp_size = cfg.sequence_split();
  l.validate();
  return l;
}

comm::Communicator& with_timeout(comm::Communicator& world, double seconds) {
  world.set_timeout(seconds);
  return world;
}

Trainer::Trainer(TrainConfig cfg, comm::Communicator& world)
    : cfg_(finalized(std::move(cfg), world.size())),
      world_(world),
      layout_(layout_of(cfg_, world.size())),
      par_(with_timeout(world, cfg_.comm_timeout), layout_, cfg_.hierarchical_dp),
      dp_(layout_.dp_size),
      dp_rank_(par_.coord().dp),
      data_{.dp = layout_.data_size(),
            .dp_rank = layout_.data_rank(par_.coord()),
            .cp = layout_.cp_size,
            .cp_rank = layout_.cp_rank(par_.coord())} {
  place_ranks();
  select_device();
  build_tokenizer();
  adopt_checkpoint_vocabulary();
  build_data();
  build_model();
  log_model();
  describe_checkpoint_state();
  resume_or_initialise();
  build_schedules();
}

// Logging, clean-stop handlers, the save-directory lock and this rank's threads.
void Trainer::place_ranks() {
  par_.set_timeout(cfg_.comm_timeout);
  log::Settings log_settings = log::settings();
  log_settings.rank = world_.rank();
  log_settings.coords = par_.coords_string();
  log::configure(log_settings);
  if (world_.rank() == 0) {
    for (const std::string& w : cfg_.warnings) log::warn(w);
    log::info("\n", cfg_.arguments_table());
  }
  stops_.emplace(cfg_);
  // The save directory belongs to this job until it ends (a second job on it is refused).
  if (!cfg_.save.empty()) save_lock_ = ckpt::lock_save_dir(cfg_.save, world_);
  // Where this rank runs and its OpenMP threads (docs/clusters.md): an error if they oversubscribe.
  const comm::HostPlacement placement = comm::host_placement(world_);
  const comm::ThreadPlan thread_plan = comm::plan_threads(placement, comm::requested_threads());
  omp_set_num_threads(thread_plan.threads);
  log::info("launch: ", world_.size(), " rank", world_.size() == 1 ? "" : "s", "; ",
            thread_plan.text);
  if (thread_plan.oversubscribed && placement.local_rank == 0) {
    log::warn("launch: more ranks than cores on this host, they share cores: ", thread_plan.text);
  }
}

// --device: the host, or this rank's GPU, with its stream and the groups' device communicators.
// What does not run on a GPU yet is refused here, by name.
void Trainer::select_device() {
  std::string device = cfg_.device;
  const int gpus = kernels::cuda_device_count();
  if (device == "auto") device = gpus > 0 ? "cuda" : "cpu";
  if (device == "cpu") {
    log::info("device: cpu", cfg_.device == "auto" && !kernels::cuda_no_device_reason().empty()
                                 ? str(" (--device auto: ", kernels::cuda_no_device_reason(), ")")
                                 : std::string());
    return;
  }
  TRIDENT_CHECK(gpus > 0, "--device cuda: no GPU: ", kernels::cuda_no_device_reason(),
                " (check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu)");
  auto refuse = [](bool used, const char* what) {
    TRIDENT_CHECK(!used, what,
                  " does not run with --device cuda yet: drop it, or use --device cpu");
  };
  refuse(cfg_.offload_params != "none",
         "--offload-params (the ZeRO-3 gather reads the offloaded weights on the host)");
  refuse(cfg_.hierarchical_dp, "--hierarchical-dp (NCCL is host-aware itself)");
  // The GPU of this rank: its local rank (the launcher's, else by host name) modulo the GPUs.
  int local = comm::host_placement(world_).local_rank;
  for (const char* var :
       {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    if (const char* v = std::getenv(var)) {
      local = std::atoi(v);
      break;
    }
  }
  const int gpu = local % gpus;
  core::Workspace* ws = ctx_.workspace;
  ctx_ = kernels::make_cuda_context(gpu);
  ctx_.workspace = ws;
  log::info("device: cuda:", gpu, " (", kernels::cuda_device_name(gpu), "; local rank ", local,
            ", ", gpus, " GPU", gpus == 1 ? "" : "s", " visible)");
  const std::string comms = par_.use_device(ctx_);
  if (world_.rank() == 0) log::info("device communicators: ", comms);
  // The interleaved schedule runs in lockstep rounds (parallel::build_lockstep_plan), so NCCL,
  // which matches a pair's sends and receives by posting order, carries it too.
}

// The tokenizer sets the vocabulary size.
void Trainer::build_tokenizer() {
  tokenizer_ = data::make_tokenizer({.type = cfg_.tokenizer_type,
                                     .vocab_file = cfg_.vocab_file,
                                     .merge_file = cfg_.merge_file,
                                     .model_file = cfg_.tokenizer_model,
                                     .vocab_size = cfg_.null_tokenizer_vocab_size});
  cfg_.model.vocab_size = tokenizer_->vocab_size();
  if (cfg_.pad_vocab_size_to > 0) {
    // Megatron-DeepSpeed's --pad-vocab-size-to: padded = N exactly, via the padding multiple.
    TRIDENT_CHECK(cfg_.pad_vocab_size_to >= cfg_.model.vocab_size, "--pad-vocab-size-to ",
                  cfg_.pad_vocab_size_to, " is smaller than the tokenizer's vocabulary (",
                  cfg_.model.vocab_size, ")");
    TRIDENT_CHECK(cfg_.pad_vocab_size_to % cfg_.tensor_model_parallel_size == 0,
                  "--pad-vocab-size-to ", cfg_.pad_vocab_size_to,
                  " must be divisible by --tensor-model-parallel-size ",
                  cfg_.tensor_model_parallel_size);
    cfg_.model.make_vocab_size_divisible_by =
        cfg_.pad_vocab_size_to / cfg_.tensor_model_parallel_size;
  }
  cfg_.model.validate();
  cfg_.resolve_loss_chunk_rows();
  mask_eod_ = cfg_.eod_mask_loss ? tokenizer_->eod() : -1;
  // --reset-position-ids / --reset-attention-mask: documents end at the tokenizer's EOD.
  if (cfg_.model.documents()) cfg_.model.eod_token = tokenizer_->eod();
}

// Resuming (--load) from a checkpoint whose vocabulary is padded to other rows than this layout's
// default (its tensor-parallel size differed: Megatron pads to a multiple of 128 x TP): when this
// layout can split the checkpoint's rows and the padding was not chosen by a flag, the run adopts
// them, so it continues with exactly the saved model (and Megatron's rows). Otherwise the
// checkpoint's padding rows are trimmed, or rows are added (copies of its last row, as Megatron's
// checkpoint converters pad), when it loads (ckpt/reshard.h); said loudly. Padding rows take no
// probability in trident's loss (kernels/cross_entropy.h), so either way training continues
// the same up to summation order.
void Trainer::adopt_checkpoint_vocabulary() {
  if (cfg_.load.empty()) return;
  const int tp = layout_.tp_size;
  const std::int64_t mine = cfg_.model.padded_vocab_size(tp);
  // Rank 0 reads the newest manifest and decides; -1: nothing to adopt (no checkpoint, or one
  // load_checkpoint will report: corrupt, another vocabulary).
  std::int64_t saved[2] = {-1, 1};  // rows, tensor-parallel size
  if (world_.rank() == 0) {
    try {
      if (ckpt::has_checkpoint(cfg_.load)) {
        const nlohmann::json m = ckpt::read_manifest(cfg_.load, -1);
        const model::ModelConfig mc = ckpt::model_config_from_json(m.at("config"));
        const int saved_tp = m.at("layout").value("tp", 1);
        if (mc.vocab_size == cfg_.model.vocab_size && saved_tp >= 1) {
          saved[0] = mc.padded_vocab_size(saved_tp);
          saved[1] = saved_tp;
        }
      }
    } catch (const std::exception&) {
      // load_checkpoint names the problem (and may fall back to an older checkpoint).
    }
  }
  if (world_.size() > 1) world_.broadcast(saved, 2, comm::Datatype::kI64, 0);
  const std::int64_t rows = saved[0];
  if (rows < 0 || rows == mine) return;
  const bool chosen =
      cfg_.given.count("--make-vocab-size-divisible-by") > 0 || cfg_.pad_vocab_size_to > 0;
  if (!chosen && rows % tp == 0) {
    cfg_.model.make_vocab_size_divisible_by = rows / tp;
    cfg_.resolve_loss_chunk_rows();
    log::info("ckpt: adopting the checkpoint's padded vocabulary of ", rows,
              " rows (saved with tensor-parallel size ", saved[1], "; ", rows / tp,
              " per rank here) instead of this layout's ", mine,
              ": the run continues with exactly the saved model");
    return;
  }
  if (world_.rank() == 0) {
    log::warn("ckpt: *** the checkpoint's vocabulary is padded to ", rows,
              " rows (saved with tensor-parallel size ", saved[1], "), this run's to ", mine, " (",
              chosen ? "--make-vocab-size-divisible-by / --pad-vocab-size-to"
                     : str("tensor-parallel size ", tp, " does not split ", rows),
              "): ",
              rows > mine
                  ? str("padding rows ", mine, "..", rows - 1, " are dropped")
                  : str("rows ", rows, "..", mine - 1, " are added as copies of row ", rows - 1),
              " (the ", cfg_.model.vocab_size,
              " real tokens are kept; padding rows take no probability in the loss) ***");
  }
}

// Megatron's GPTDataset / BlendedDataset indices, built (or loaded from the cache) on rank 0
// first, then loaded by the other ranks; the batch schedule.
void Trainer::build_data() {
  const model::ModelConfig& mc = cfg_.model;
  data::DatasetBuildConfig dcfg;
  dcfg.data_path = cfg_.data_path;
  dcfg.train_data_path = cfg_.train_data_path;
  dcfg.valid_data_path = cfg_.valid_data_path;
  dcfg.test_data_path = cfg_.test_data_path;
  dcfg.train_weighted_split_paths = cfg_.train_weighted_split_paths;
  dcfg.valid_weighted_split_paths = cfg_.valid_weighted_split_paths;
  dcfg.test_weighted_split_paths = cfg_.test_weighted_split_paths;
  dcfg.allow_split_paths_overlap = cfg_.allow_split_paths_overlap;
  dcfg.split = cfg_.split;
  dcfg.seq_length = mc.seq_length;
  dcfg.seed = static_cast<std::int64_t>(cfg_.seed);
  batches_.emplace(cfg_.batch_schedule_config(data_.dp));
  std::int64_t train_samples =
      cfg_.train_samples > 0 ? cfg_.train_samples : cfg_.train_iters * cfg_.global_batch_size;
  if (!cfg_.step_schedule.empty() && cfg_.train_samples == 0) {
    // Megatron-LM sizes it as train_iters x --global-batch-size, which under a step schedule is
    // micro x dp unless given: fewer samples than the schedule consumes. trident builds what the
    // iterations will read when that is more.
    train_samples = std::max(train_samples, batches_->samples_for_iterations(cfg_.train_iters));
  }
  dcfg.num_samples = {
      train_samples,
      (cfg_.train_iters / cfg_.eval_interval + 1) * cfg_.eval_iters * cfg_.global_batch_size,
      cfg_.eval_iters * cfg_.global_batch_size};
  dcfg.data_cache_path = cfg_.data_cache_path;
  dcfg.mid_level_dataset_surplus = cfg_.mid_level_dataset_surplus;
  dcfg.tokenizer = tokenizer_identity(cfg_);
  dcfg.eod_id = tokenizer_->eod();
  if (world_.rank() == 0) datasets_ = data::build_train_valid_test_datasets(dcfg);
  world_.barrier();
  if (world_.rank() != 0) {
    dcfg.cache_mode = data::CacheMode::kLoadOnly;
    datasets_ = data::build_train_valid_test_datasets(dcfg);
  }
  TRIDENT_CHECK(datasets_.train != nullptr, "no training data: the split '", cfg_.split,
                "' gives the training set no documents");
  log::info("data: train ", datasets_.train->describe());
  if (datasets_.valid) log::info("data: valid ", datasets_.valid->describe());
  if (datasets_.test) log::info("data: test ", datasets_.test->describe());
  for (const data::NamedDataset& g : datasets_.valid_groups) {
    log::info("data: valid group \"", g.name, "\": ", g.dataset->describe());
  }
  for (const data::NamedDataset& g : datasets_.test_groups) {
    log::info("data: test group \"", g.name, "\": ", g.dataset->describe());
  }
}

// This rank's part of the model (its pipeline chunks, each a tensor-parallel slice), its
// parameters, gradients and Adam moments sharded by ZeRO stage, and the pipeline executor.
void Trainer::build_model() {
  const PipelineSplit split{.pp_size = layout_.pp_size,
                            .num_chunks = cfg_.virtual_pipeline_chunks(),
                            .first_stage_layers = cfg_.decoder_first_pipeline_num_layers,
                            .last_stage_layers = cfg_.decoder_last_pipeline_num_layers};
  const bool ep = layout_.ep_size > 1;
  const ExpertSplit experts{.ep_size = layout_.ep_size, .ep_rank = layout_.ep_rank(par_.coord())};
  auto model_of = [&](model::ParamPart part) -> RankModel {
    ExpertSplit e = experts;
    e.part = part;
    return RankModel(cfg_.model, split, layout_.tp_size, par_.coord().tp, par_.coord().pp,
                     cfg_.sequence_parallel, e);
  };
  rank_model_.emplace(model_of(model::ParamPart::kAll));
  rank_model_->set_context_parallel(data_.cp, data_.cp_rank, cfg_.ulysses());
  ZeroConfig zero{.stage = cfg_.zero_stage,
                  .bucket_size = cfg_.ddp_bucket_size,
                  .bf16 = cfg_.bf16,
                  .offload = cfg_.offload,
                  .offload_params = cfg_.offload_params == "nvme",
                  .ctx = ctx_};
  if (ep) {
    dense_model_.emplace(model_of(model::ParamPart::kDense));
    expert_model_.emplace(model_of(model::ParamPart::kExperts));
  }
  optimizer_.emplace(ep ? *dense_model_ : *rank_model_, par_, cfg_.optimizer, zero);
  if (ep) {
    zero.experts = true;
    expert_optimizer_.emplace(*expert_model_, par_, cfg_.optimizer, zero);
  }
  offload_report_.emplace(*optimizer_, expert_optimizer_ ? &*expert_optimizer_ : nullptr, cfg_);
  B_ = cfg_.micro_batch_size;
  T_ = cfg_.model.seq_length;
  micro_batches_ = cfg_.num_micro_batches(world_.size());
  std::vector<model::ModelRuntime> runtimes;
  for (const ModelChunk& ch : rank_model_->chunks()) {
    model::ModelRuntime rt;
    rt.shard = ch.shard;
    rt.tp = &par_.tp();
    rt.dropout_seed = cfg_.seed ^ 0x5eed0d0bull;
    rt.tp_traffic = &tp_traffic_;
    if (ep) {
      rt.ep = &par_.ep();
      rt.ep_host = &par_.ep_host();
    }
    if (data_.cp > 1) rt.cp = &par_.cp();
    runtimes.push_back(rt);
  }
  optimizer_->install_hooks(runtimes);
  if (expert_optimizer_) expert_optimizer_->merge_hooks(runtimes, merged_weights_);
  schedule_kind_ = parallel::parse_pipeline_schedule(cfg_.pipeline_schedule);
  pipeline_.emplace(*rank_model_, par_, schedule_kind_, static_cast<int>(micro_batches_), B_,
                    std::move(runtimes), ctx_);
  mem_ = optimizer_->memory();
  if (expert_optimizer_) {
    const MemoryReport e = expert_optimizer_->memory();
    mem_.param_bytes += e.param_bytes;
    mem_.grad_bytes += e.grad_bytes;
    mem_.optimizer_bytes += e.optimizer_bytes;
    mem_.staging_bytes += e.staging_bytes;
    mem_.predicted_param_bytes += e.predicted_param_bytes;
    mem_.predicted_grad_bytes += e.predicted_grad_bytes;
    mem_.predicted_optimizer_bytes += e.predicted_optimizer_bytes;
  }
}

void Trainer::log_model() const {
  const model::ModelConfig& mc = cfg_.model;
  log::info("model: GPT ", mc.num_layers, " layers, hidden ", mc.hidden_size, ", heads ",
            mc.num_attention_heads, ", ffn ", mc.ffn(), ", vocab ", mc.vocab_size, " (padded ",
            mc.padded_vocab_size(layout_.tp_size), "), ", mc.num_parameters(), " parameters");
  log::info(
      "layout: tp ", layout_.tp_size, " x pp ", layout_.pp_size, " x dp ", data_.dp,
      data_.cp > 1 ? core::str(cfg_.ulysses() ? " x ulysses " : " x cp ", data_.cp) : std::string(),
      layout_.ep_size > 1
          ? core::str(" (experts: ep ", layout_.ep_size, " x expert dp ", layout_.edp_size(), ")")
          : std::string(),
      " on ", world_.size(), " ranks; ", rank_model_->chunks().size(), " chunk(s) per stage, ",
      pipeline_schedule_name(schedule_kind_), " schedule; this rank holds ",
      rank_model_->num_parameters(), " parameters");
  log::info("memory per rank (ZeRO stage ", cfg_.zero_stage, ", dp ", dp_, "): parameters ",
            mem_.param_bytes, " B, gradients ", mem_.grad_bytes, " B, optimizer state ",
            mem_.optimizer_bytes, " B; staging ", mem_.staging_bytes, " B; activations ",
            pipeline_->slots_per_chunk(), " slot(s) x ", pipeline_->activation_bytes_per_slot(0),
            " B");
  log::info(
      "memory per rank predicted by the ZeRO paper's formulas (psi = ", rank_model_->total_numel(),
      " parameters on this rank): parameters ", mem_.predicted_param_bytes, " B, gradients ",
      mem_.predicted_grad_bytes, " B, optimizer state ", mem_.predicted_optimizer_bytes,
      " B (differences: shard padding)");
}

// What a checkpoint of this rank holds: the configuration, the layout and this rank's slices
// (with expert parallelism, the experts' part in expert_state_, its extra shard).
void Trainer::describe_checkpoint_state() {
  state_.config = cfg_.to_json();
  state_.layout = {{"tp", layout_.tp_size},
                   {"pp", layout_.pp_size},
                   {"dp", dp_},
                   {"virtual_chunks", cfg_.virtual_pipeline_chunks()},
                   {"first_stage_layers", cfg_.decoder_first_pipeline_num_layers},
                   {"last_stage_layers", cfg_.decoder_last_pipeline_num_layers},
                   {"zero_stage", cfg_.zero_stage}};
  if (layout_.ep_size > 1) state_.layout["ep"] = layout_.ep_size;
  if (layout_.cp_size > 1) state_.layout[cfg_.ulysses() ? "ulysses" : "cp"] = layout_.cp_size;
  state_.coords = {{"tp", par_.coord().tp}, {"pp", par_.coord().pp}, {"dp", dp_rank_}};
  state_.tp_rank = par_.coord().tp;
  auto slice = [](ZeroOptimizer::TensorSlice t) {
    return ckpt::CheckpointState::Slice{t.data, t.range.begin, t.range.end};
  };
  // One part: a model's tables and its optimizer's slices, data-parallel over `dp` ranks.
  auto describe = [&](ckpt::CheckpointState& part, const RankModel& model, ZeroOptimizer& opt,
                      int dp, int dp_rank) {
    const std::int64_t n = model.total_numel();
    for (const ModelChunk& ch : model.chunks()) part.tables.push_back({&ch.table, ch.base});
    part.numel = n;
    part.params = slice(opt.params_slice());
    part.optimizer_state.clear();
    for (const ZeroOptimizer::NamedSlice& s : opt.state_slices()) {
      part.optimizer_state.push_back({s.name, slice(s.slice)});
      part.optimizer_state.back().slice.mapped = opt.state_offloaded();
    }
    part.params.mapped = opt.params_offloaded();
    if (ctx_.device.kind == core::DeviceKind::kCuda) {
      // The checkpoint code reads and writes host memory: each slice on the device gets a pinned
      // host buffer (offloaded optimizer state is in host memory already).
      std::vector<ckpt::CheckpointState::Slice*> on_device{&part.params};
      if (!opt.state_on_host()) {
        for (ckpt::CheckpointState::NamedSlice& s : part.optimizer_state) {
          on_device.push_back(&s.slice);
        }
      }
      for (ckpt::CheckpointState::Slice* s : on_device) {
        ckpt_device_.push_back(*s);
        ckpt_host_.emplace_back(ctx_,
                                (s->end - s->begin) * static_cast<std::int64_t>(sizeof(float)));
        s->data = ckpt_host_.back().as<float>();
      }
    }
    // `trident convert` writes other layouts' shards from the same rule (zero_optimizer.h).
    TRIDENT_ASSERT(ZeroOptimizer::stored_range(cfg_.zero_stage, false, n, dp, dp_rank) ==
                           opt.params_slice().range &&
                       ZeroOptimizer::stored_range(cfg_.zero_stage, true, n, dp, dp_rank) ==
                           opt.state_slices().front().slice.range,
                   "checkpoint slices disagree with ZeroOptimizer::stored_range");
  };
  if (!expert_optimizer_) {
    describe(state_, *rank_model_, *optimizer_, dp_, dp_rank_);
    return;
  }
  describe(state_, *dense_model_, *optimizer_, dp_, dp_rank_);
  expert_state_.coords = state_.coords;
  expert_state_.coords["ep"] = layout_.ep_rank(par_.coord());
  expert_state_.tp_rank = state_.tp_rank;
  describe(expert_state_, *expert_model_, *expert_optimizer_, layout_.edp_size(),
           layout_.edp_rank(par_.coord()));
  state_.experts = &expert_state_;
  state_.experts_first_shard = world_.size();
}

void Trainer::checkpoint_out() {
  for (std::size_t i = 0; i < ckpt_device_.size(); ++i) {
    const ckpt::CheckpointState::Slice& d = ckpt_device_[i];
    kernels::copy_to_host(ctx_, ckpt_host_[i].data(), d.data,
                          (d.end - d.begin) * static_cast<std::int64_t>(sizeof(float)));
  }
  kernels::synchronize(ctx_);
}

void Trainer::checkpoint_in() {
  for (std::size_t i = 0; i < ckpt_device_.size(); ++i) {
    const ckpt::CheckpointState::Slice& d = ckpt_device_[i];
    kernels::copy_to_device(ctx_, d.data, ckpt_host_[i].data(),
                            (d.end - d.begin) * static_cast<std::int64_t>(sizeof(float)));
  }
  kernels::synchronize(ctx_);
}

void Trainer::resume_or_initialise() {
  if (!cfg_.load.empty()) {
    // A Megatron or DeepSpeed checkpoint is not "nothing to load".
    const std::string foreign = describe_foreign_checkpoint(cfg_.load);
    TRIDENT_CHECK(foreign.empty(), "--load ", cfg_.load, ": ", foreign);
  }
  have_checkpoint_ = !cfg_.load.empty() && ckpt::has_checkpoint(cfg_.load);
  TRIDENT_CHECK(have_checkpoint_ || !cfg_.exit_on_missing_checkpoint, "--load ", cfg_.load,
                ": no trident checkpoint there (--exit-on-missing-checkpoint)");
  if (have_checkpoint_) {
    if (cfg_.finetune) {  // weights only: the moments stay zero (null data skips a tensor)
      const std::vector<ckpt::CheckpointState::NamedSlice> kept = state_.optimizer_state;
      const std::vector<ckpt::CheckpointState::NamedSlice> kept_experts =
          expert_state_.optimizer_state;
      for (ckpt::CheckpointState* part : {&state_, &expert_state_}) {
        for (ckpt::CheckpointState::NamedSlice& s : part->optimizer_state) s.slice.data = nullptr;
      }
      ckpt::load_checkpoint(cfg_.load, -1, state_, world_);
      state_.optimizer_state = kept;
      expert_state_.optimizer_state = kept_experts;
      // Only the weights came from the checkpoint (on a device: the parts' params slices).
      for (std::size_t i = 0; i < ckpt_device_.size(); ++i) {
        const float* host = ckpt_host_[i].as<float>();
        if (host != state_.params.data && host != expert_state_.params.data) continue;
        kernels::copy_to_device(ctx_, ckpt_device_[i].data, host, ckpt_host_[i].bytes());
      }
      if (!ckpt_device_.empty()) kernels::synchronize(ctx_);
      state_.trainer_state = nlohmann::json::object();
      log::info("train: --finetune: weights of ", cfg_.load, " iteration ", state_.iteration,
                "; starting at iteration 0 with a fresh optimizer");
    } else {
      ckpt::load_checkpoint(cfg_.load, -1, state_, world_);
      checkpoint_in();
      progress_.iteration = state_.iteration;
      progress_.consumed = state_.consumed_train_samples;
      progress_.consumed_valid = state_.consumed_valid_samples;
    }
    optimizer_->checkpoint_io_done(/*written=*/true);
    if (expert_optimizer_) expert_optimizer_->checkpoint_io_done(/*written=*/true);
    resumed_ = TrainerState::from_json(state_.trainer_state);
    progress_.skipped_iters = resumed_.skipped_iterations;
    progress_.nan_iters = resumed_.nan_iterations;
  } else {
    if (!cfg_.load.empty())
      log::warn("ckpt: nothing to load in ", cfg_.load, "; starting from scratch");
    optimizer_->init_params(cfg_.seed);
    if (expert_optimizer_) expert_optimizer_->init_params(cfg_.seed);
  }
  optimizer_->refresh_bf16(ctx_);
  if (expert_optimizer_) expert_optimizer_->refresh_bf16(ctx_);
}

// The MFU reference, the writers, the loss scaler and the learning-rate schedule (restored from
// the checkpoint when there is one).
void Trainer::build_schedules() {
  if (!cfg_.step_schedule.empty()) {
    // The stages still ahead must fit this layout (earlier ones may have run on another).
    batches_->check_from(progress_.consumed);
    log::info("> using step batch size schedule: ", cfg_.step_batch_size_schedule, "\n",
              batches_->describe_step_schedule(cfg_.model.seq_length));
  }
  // MFU's denominator: --peak-tflops, else the GPU's dense peak at the training precision, else
  // the CPU's measured FP32 GEMM rate; the slowest rank's.
  double peak_tflops = cfg_.peak_tflops;
  std::string peak_basis = "--peak-tflops";
  if (peak_tflops <= 0 && ctx_.device.kind == core::DeviceKind::kCuda) {
    const kernels::DevicePeak peak = kernels::cuda_device_peak(ctx_.device.index);
    const bool tensor_cores = cfg_.bf16 || cfg_.fp16;
    peak_tflops = tensor_cores ? peak.bf16_tflops : peak.fp32_tflops;
    peak_basis = core::str(tensor_cores ? "GPU dense BF16/FP16" : "GPU FP32", ": ", peak.basis);
  } else if (peak_tflops <= 0) {
    peak_tflops = measure_peak_tflops();
    peak_basis = "measured FP32 GEMM";
  }
  world_.all_reduce(&peak_tflops, 1, comm::Datatype::kF64, comm::ReduceOp::kMin);
  log::info("train: global batch ", cfg_.global_batch_size, " = micro ", B_, " x ", micro_batches_,
            " micro-batches x ", data_.dp, " data-parallel; ", omp_get_max_threads(),
            " threads per rank; MFU against ", peak_tflops, " TFLOP/s per rank (", peak_basis, ")");
  log_.emplace(
      TrainingLog::Sources{.cfg = cfg_,
                           .world = world_,
                           .par = par_,
                           .ctx = ctx_,
                           .optimizer = *optimizer_,
                           .offload = *offload_report_,
                           .tp_traffic = tp_traffic_,
                           .progress = progress_,
                           .mem = mem_,
                           .micro_batches = micro_batches_,
                           .expert_optimizer = expert_optimizer_ ? &*expert_optimizer_ : nullptr},
      peak_tflops, schedule_kind_);
  scaler_.emplace(optim::LossScalerConfig{
      .dynamic = cfg_.fp16 && cfg_.loss_scale <= 0,
      .static_scale = cfg_.fp16 && cfg_.loss_scale > 0 ? cfg_.loss_scale : 1.0,
      .initial_scale = cfg_.initial_loss_scale,
      .min_scale = cfg_.min_loss_scale,
      .window = cfg_.loss_scale_window,
      .hysteresis = cfg_.hysteresis});
  if (resumed_.scaler) scaler_->set_state(*resumed_.scaler);
  // Megatron's scheduler counts samples of successful steps (a skipped step does not advance it).
  lr_sched_.emplace(optim::MegatronLrScheduler::Config{
      .samples = cfg_.lr_steps,
      .warmup_tokens = cfg_.lr_warmup_tokens >= 0
                           ? std::optional<double>(static_cast<double>(cfg_.lr_warmup_tokens))
                           : std::nullopt,
      .decay_tokens = cfg_.lr_decay_tokens > 0
                          ? std::optional<double>(static_cast<double>(cfg_.lr_decay_tokens))
                          : std::nullopt});
  if (have_checkpoint_) {
    // Checkpoints written before the scheduler was saved: every step counted.
    optim::MegatronLrScheduler::State every_sample;
    every_sample.num_steps = static_cast<double>(progress_.consumed);
    lr_sched_->set_state(resumed_.lr.value_or(every_sample));
  }
  saver_.emplace(cfg_.save, cfg_.async_save, ckpt::SaveOptions{.retain = cfg_.save_retain});
}

// Megatron's micro-batch order from the global batch starting at sample `first`.
MicroBatches Trainer::micro_batches_of(const data::SampleDataset& ds, std::int64_t first,
                                       std::int64_t iteration) {
  return {.fill =
              [this, &ds, first](int j, std::int32_t* tokens, std::int32_t* labels) {
                fill_micro_batch(ds, first, B_, data_, j, tokens, labels, scratch_,
                                 cfg_.model.vocab_size, mask_eod_);
              },
          .first_sample =
              [this, first](int j) {
                return data::micro_batch_first_sample(first, j, data_.dp_rank, B_, data_.dp);
              },
          .iteration = iteration};
}

// The mean loss over the global batch: the last stage's tp rank 0 of every replica contributes.
double Trainer::global_loss(const model::LossSum& mine) {
  const bool counts = par_.is_last_stage() && par_.coord().tp == 0;
  double v[2] = {counts ? mine.sum : 0.0, counts ? static_cast<double>(mine.count) : 0.0};
  world_.all_reduce(v, 2, comm::Datatype::kF64, comm::ReduceOp::kSum);
  return v[0] / std::max(v[1], 1.0);
}

// The MoE routing summed over every rank (pipeline stages hold different layers, data-parallel
// ranks different micro-batches; tp rank 0 of each group speaks for it). Only rank 0 logs it.
MoeRouting Trainer::global_moe_routing(const MoeRouting& mine) {
  const std::size_t E = static_cast<std::size_t>(cfg_.model.num_experts);
  std::vector<double> v(5 + E, 0.0);
  if (par_.coord().tp != 0) {  // the tp ranks route the same rows alike: count them once
    world_.all_reduce(v.data(), static_cast<std::int64_t>(v.size()), comm::Datatype::kF64,
                      comm::ReduceOp::kSum);
    return {};
  }
  v[0] = mine.aux_loss;
  v[1] = mine.z_loss;
  v[2] = static_cast<double>(mine.calls);
  v[3] = static_cast<double>(mine.dropped);
  v[4] = static_cast<double>(mine.choices);
  for (std::size_t e = 0; e < mine.tokens_per_expert.size() && e < E; ++e) {
    v[5 + e] = mine.tokens_per_expert[e];
  }
  world_.all_reduce(v.data(), static_cast<std::int64_t>(v.size()), comm::Datatype::kF64,
                    comm::ReduceOp::kSum);
  MoeRouting all{.aux_loss = v[0],
                 .z_loss = v[1],
                 .calls = static_cast<std::int64_t>(v[2]),
                 .dropped = static_cast<std::int64_t>(v[3]),
                 .choices = static_cast<std::int64_t>(v[4])};
  all.tokens_per_expert.assign(v.begin() + 5, v.end());
  return all;
}

void Trainer::update_expert_bias(const MoeRouting& mine) {
  const model::ModelConfig& mc = cfg_.model;
  const std::size_t E = static_cast<std::size_t>(mc.num_experts);
  const auto L = static_cast<std::size_t>(mc.num_layers);
  // Every layer's counts summed over the job: each layer's stage fills its rows, the dp ranks add
  // theirs, the tp ranks (which route the same rows alike) count once.
  std::vector<double> v(L * E, 0.0);
  if (par_.coord().tp == 0) {
    for (std::size_t l = 0; l < std::min(L, mine.layer_tokens.size()); ++l) {
      const std::vector<double>& t = mine.layer_tokens[l];
      for (std::size_t e = 0; e < std::min(E, t.size()); ++e) v[l * E + e] = t[e];
    }
  }
  world_.all_reduce(v.data(), static_cast<std::int64_t>(v.size()), comm::Datatype::kF64,
                    comm::ReduceOp::kSum);
  const auto rate = static_cast<float>(mc.moe_router_bias_update_rate);
  for (std::size_t l = 0; l < L; ++l) {
    if (!mc.moe_layer(static_cast<std::int64_t>(l))) continue;
    double mean = 0;
    for (std::size_t e = 0; e < E; ++e) mean += v[l * E + e];
    mean /= static_cast<double>(E);
    std::vector<float> delta(E);
    for (std::size_t e = 0; e < E; ++e) {
      const double gap = mean - v[l * E + e];  // underused experts (gap > 0) move up
      delta[e] = gap > 0 ? rate : gap < 0 ? -rate : 0.0f;
    }
    optimizer_->add_to_param(core::str("layers.", l, ".mlp.router.expert_bias"), delta);
  }
}

int Trainer::run() {
  // Megatron-DeepSpeed's --train-tokens also ends training.
  auto tokens_left = [this] {
    return cfg_.train_tokens == 0 || progress_.consumed * T_ < cfg_.train_tokens;
  };
  while (progress_.iteration < cfg_.train_iters && tokens_left()) {
    log_->before_iteration();
    const IterationResult r = train_iteration();
    log_->after_iteration(r);
    const std::int64_t it = progress_.iteration;
    if (it % cfg_.eval_interval == 0) evaluate(it);
    saver_->poll(world_);  // finishes a background save once every rank has written its shard
    // Clean stops: save (when --save) and exit with the condition's code.
    const int stop = stop_code();
    if ((cfg_.save_interval > 0 && it % cfg_.save_interval == 0) || stop != 0) save(it);
    if (stop != 0) {
      saver_->poll(world_, /*block=*/true);
      // A planned stop exits 0 (Megatron's), or its own code with --exit-codes distinct.
      const int code = planned_stop_exit_code(stop, cfg_.distinct_exit_codes());
      log::info("train: exiting at iteration ", it, " with code ", code, " (", exit_code_name(stop),
                code == stop ? std::string(")")
                             : str("; --exit-codes distinct exits with ", stop, " instead)"));
      log_->finish_profile();
      log_peak_rss(world_);
      log_peak_device_memory(world_, ctx_);
      return code;
    }
  }
  log_->finish_profile();
  // As Megatron's pretrain(): validation and test at the end of training.
  evaluate(progress_.iteration, " on validation set");
  evaluate(progress_.iteration, " on test set", /*test=*/true);
  if (cfg_.save_interval == 0 || cfg_.train_iters % cfg_.save_interval != 0) {
    save(progress_.iteration);
  }
  saver_->poll(world_, /*block=*/true);
  log_peak_rss(world_);
  log_peak_device_memory(world_, ctx_);
  return 0;
}

// One iteration: the pipeline's forward and backward over the global batch, the optimizer step,
// the loss scale and learning rate, the counters.
IterationResult Trainer::train_iteration() {
  core::Timer timer;
  IterationResult r;
  par_.set_step(progress_.iteration + 1);
  r.batch = batches_->at(progress_.consumed);
  if (r.batch.num_micro_batches != micro_batches_) {
    micro_batches_ = r.batch.num_micro_batches;  // --rampup-batch-size, a step schedule
    pipeline_->set_num_microbatches(static_cast<int>(micro_batches_));
  }
  r.tokens = r.batch.running_global_batch_size * T_;
  optimizer_->begin_iteration();
  if (expert_optimizer_) expert_optimizer_->begin_iteration();
  // Every token of the global batch weighs 1 / (tokens in the global batch).
  const float d_scale = static_cast<float>(scaler_->scale()) / static_cast<float>(r.tokens) *
                        test_gradient_poison(progress_.iteration + 1, world_.rank());
  // A micro-batch's MoE auxiliary losses weigh 1 / (micro-batches in the global batch): Megatron
  // averages them over the micro-batches and the data-parallel ranks.
  pipeline_->set_moe_aux_loss_scale(static_cast<double>(d_scale) * static_cast<double>(B_ * T_));
  r.pipeline = pipeline_->train(
      ctx_, optimizer_->views(), d_scale,
      micro_batches_of(*datasets_.train, progress_.consumed, progress_.iteration + 1));
  r.lr = lr_sched_->lr();
  const optim::GradScaling scaling{.loss_scale = scaler_->scale(),
                                   .overflow_threshold = cfg_.fp16 ? optim::kFp16Max : INFINITY};
  r.step = expert_optimizer_
               ? ZeroOptimizer::step_together(ctx_, r.lr, progress_.iteration + 1, scaling,
                                              *optimizer_, *expert_optimizer_)
               : optimizer_->step(ctx_, r.lr, progress_.iteration + 1, scaling);
  r.used_scale = scaler_->scale();
  if (cfg_.fp16) scaler_->update(r.step.skipped);
  pipeline_->read_loss(ctx_, r.pipeline);  // after the step: its norm's host sync brought it
  r.lm_loss = global_loss(r.pipeline.loss);
  if (cfg_.model.moe_router_enable_expert_bias && !r.step.skipped) {
    update_expert_bias(r.pipeline.moe);
  }
  if (cfg_.model.num_experts > 0) r.pipeline.moe = global_moe_routing(r.pipeline.moe);
  if (!r.step.skipped) {
    lr_sched_->step(static_cast<double>(r.batch.running_global_batch_size),
                    static_cast<double>(progress_.consumed * T_));
  }
  ++progress_.iteration;
  progress_.consumed += r.batch.running_global_batch_size;
  if (!r.advanced()) {
    ++progress_.skipped_iters;
    if (r.non_finite()) ++progress_.nan_iters;
    if (cfg_.fp16) {
      log::warn("train: iteration ", progress_.iteration, ": gradient overflow at loss scale ",
                r.used_scale, "; update skipped, loss scale now ", scaler_->scale());
    } else {
      log::warn("train: iteration ", progress_.iteration, ": loss ", r.lm_loss, ", grad norm ",
                r.step.grad_norm, " is not finite; update skipped");
    }
  }
  r.ms = timer.elapsed_ms();
  return r;
}

// Evaluation continues through the validation set (consumed_valid_samples), as Megatron's
// validation iterator does, at the full global batch size.
// The mean loss of eval_iters batches of eval_micro micro-batches from sample `consumed` on
// (advanced past them).
double Trainer::evaluation_loss(const data::SampleDataset& ds, std::int64_t& consumed,
                                std::int64_t eval_micro, std::int64_t it) {
  const model::TpTraffic training_traffic = tp_traffic_;     // evaluation is not counted
  if (log_->profiling()) core::profile::set_enabled(false);  // nor profiled
  model::LossSum total;
  optimizer_->begin_evaluation();  // ZeRO-3: gather the weights the last step updated
  if (expert_optimizer_) expert_optimizer_->begin_evaluation();
  for (std::int64_t e = 0; e < cfg_.eval_iters; ++e) {
    const model::LossSum l =
        pipeline_->evaluate(ctx_, optimizer_->views(), static_cast<int>(eval_micro),
                            micro_batches_of(ds, consumed, it));
    consumed += eval_micro * B_ * data_.dp;
    total.sum += l.sum;
    total.count += l.count;
  }
  tp_traffic_ = training_traffic;
  if (log_->profiling()) core::profile::resume();
  return global_loss(total);
}

// BigScience's evaluate_and_print_results over the named groups of --valid/test-weighted-split-
// paths: each group evaluated and logged under its name ("NAME loss at iteration N | ..."), with
// TensorBoard scalars under lm-loss-validation/NAME/. As BigScience's training loop: a batch is the
// current one (get_num_microbatches(), the ramp's), the validation groups read from
// consumed_valid_samples / (number of groups) each and consumed_valid_samples counts them all, the
// test groups read from 0 (and their scalars go to step 0).
void Trainer::evaluate_groups(std::int64_t it, bool at_end, bool test) {
  const std::vector<data::NamedDataset>& groups =
      test ? datasets_.test_groups : datasets_.valid_groups;
  if (groups.empty() || cfg_.eval_iters == 0) return;
  const auto n = static_cast<std::int64_t>(groups.size());
  const std::int64_t start = test ? 0 : progress_.consumed_valid / n;
  const std::string where = test     ? std::string("the end of training for test data")
                            : at_end ? std::string("the end of training for val data")
                                     : str("iteration ", it);
  for (const data::NamedDataset& g : groups) {
    std::int64_t consumed = start;
    const double loss = evaluation_loss(*g.dataset, consumed, micro_batches_, it);
    const double ppl = std::exp(std::min(loss, 20.0));
    const std::string line = str(g.name, " loss at ", where, " | lm loss value: ", fmt_e(loss),
                                 " | lm loss PPL: ", fmt_e(ppl), " | ");
    log::info(std::string(line.size() + 1, '-'));
    log::info(line);
    log::info(std::string(line.size() + 1, '-'));
    log_->metrics().write({{"iteration", it},
                           {"split", test ? "test" : "valid"},
                           {"name", g.name},
                           {"lm_loss", loss},
                           {"ppl", ppl}});
    const std::string tag = "lm-loss-validation/" + g.name + "/lm loss validation";
    const std::int64_t step = test ? 0 : it;
    log_->tensorboard().add_scalar(tag, loss, step);
    log_->tensorboard().add_scalar(tag + " vs samples", loss, progress_.consumed);
    log_->tensorboard().add_scalar(tag + " vs tokens", loss, progress_.consumed * T_);
    if (cfg_.log_validation_ppl_to_tensorboard) {
      log_->tensorboard().add_scalar(tag + " ppl", ppl, step);
      log_->tensorboard().add_scalar(tag + " ppl vs samples", ppl, progress_.consumed);
      log_->tensorboard().add_scalar(tag + " ppl vs tokens", ppl, progress_.consumed * T_);
    }
  }
  if (!test) progress_.consumed_valid += n * cfg_.eval_iters * micro_batches_ * B_ * data_.dp;
}

void Trainer::evaluate(std::int64_t it, const char* suffix, bool test) {
  if (!datasets_.valid_groups.empty() || !datasets_.test_groups.empty()) {
    evaluate_groups(it, suffix[0] != '\0', test);
    return;
  }
  const data::SampleDataset* eval_ds = test ? datasets_.test.get() : datasets_.valid.get();
  if (!eval_ds || cfg_.eval_iters == 0) return;
  std::int64_t test_consumed = 0;
  std::int64_t& eval_consumed = test ? test_consumed : progress_.consumed_valid;
  const double loss =
      evaluation_loss(*eval_ds, eval_consumed, cfg_.global_batch_size / (B_ * data_.dp), it);
  const double ppl = std::exp(std::min(loss, 20.0));
  // Megatron's lines: dashes, the result, dashes.
  const std::string line =
      str(" validation loss at iteration ", it, suffix, " | lm loss value: ", fmt_e(loss),
          " | lm loss PPL: ", fmt_e(ppl), " | ");
  log::info(std::string(line.size() + 1, '-'));
  log::info(line);
  log::info(std::string(line.size() + 1, '-'));
  log_->metrics().write(
      {{"iteration", it}, {"split", test ? "test" : "valid"}, {"lm_loss", loss}, {"ppl", ppl}});
  if (!test) {
    log_->tensorboard().add_scalar("lm loss validation", loss, it);
    log_->tensorboard().add_scalar("lm loss validation vs samples", loss, progress_.consumed);
    if (cfg_.log_validation_ppl_to_tensorboard) {
      log_->tensorboard().add_scalar("lm loss validation ppl", ppl, it);
      log_->tensorboard().add_scalar("lm loss validation ppl vs samples", ppl, progress_.consumed);
    }
  }
}

void Trainer::save(std::int64_t it) {
  if (cfg_.save.empty()) return;
  state_.iteration = it;
  state_.consumed_train_samples = progress_.consumed;
  state_.consumed_valid_samples = progress_.consumed_valid;
  state_.trainer_state = TrainerState{.scaler = scaler_->state(),
                                      .skipped_iterations = progress_.skipped_iters,
                                      .nan_iterations = progress_.nan_iters,
                                      .lr = lr_sched_->state()}
                             .to_json();
  checkpoint_out();
  const double blocked = saver_->save(state_, world_);
  optimizer_->checkpoint_io_done(/*written=*/false);
  log::info("ckpt: ", cfg_.async_save ? "started saving" : "saved", " iteration ", it, " to ",
            cfg_.save, " (training blocked ", blocked, " ms", cfg_.async_save ? ", async" : "",
            ")");
}

// The code of a clean stop after this iteration (0: go on): a signal, the duration or the kill
// switch (collective), --exit-interval; never at the last iteration. run() turns it into the
// process exit code (planned_stop_exit_code).
int Trainer::stop_code() {
  int stop = stops_->check(world_);
  if (stop == 0 && cfg_.exit_interval > 0 && progress_.iteration % cfg_.exit_interval == 0)
    stop = kExitIntervalStop;
  if (progress_.iteration == cfg_.train_iters) stop = 0;  // done anyway
  return stop;
}

}  // namespace

int run_training(TrainConfig cfg, comm::Communicator& world) {
  Trainer trainer(std::move(cfg), world);
  return trainer.run();
}

}  // namespace trident::train
