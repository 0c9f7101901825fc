// `trident plan`: memory per rank, time per iteration and the best layouts, before running.
//
// Memory comes from the tables trident allocates from: the ParamTable of each rank's chunks
// (train::RankModel), the ZeRO optimizer's arena sizes (train::zero_arena_bytes), the activation
// arena of one micro-batch (model::activation_bytes) times the slots the pipeline schedule keeps
// alive (parallel::activation_slots_per_chunk). On this machine that is what trident allocates
// (tests/plan check it against the optimizer's and executor's arenas and the peak RSS).
//
// Time is a per-op model of one iteration on the slowest pipeline stage: every GEMM, attention
// and element-wise kernel of the forward and backward (and recomputation), tensor-parallel
// collectives, pipeline sends and bubble, data-parallel / ZeRO traffic and the part of it the
// backward hides, and the optimizer step. GPUs use their datasheet peak with an efficiency
// curve; `cpu` uses a calibration run of trident's own kernels (plan/calibration.h).
// The formulas are in docs/plan.md.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trident/plan/calibration.h"
#include "trident/plan/hardware.h"
#include "trident/train/train_config.h"

namespace trident::plan {

struct Cluster {
  Hardware hw;
  int num_gpus = 1;                        // world size (ranks)
  int threads_per_rank = 1;                // cpu: OpenMP threads of each rank
  std::optional<Calibration> calibration;  // cpu only
  int num_nodes() const { return (num_gpus + hw.gpus_per_node - 1) / hw.gpus_per_node; }
};

// One rank's memory, by purpose, in bytes (as allocated: alignment and shard padding included).
struct RankMemory {
  int pp_rank = 0;
  std::int64_t parameters = 0;       // FP32 weights held (stage 3: this rank's shard), BF16 copies
  std::int64_t gradients = 0;        // FP32 gradient buffer (stages 2-3: shard)
  std::int64_t optimizer = 0;        // Adam moments (--offload-optimizer nvme: the window)
  std::int64_t offloaded = 0;        // offload nvme: the moments' / master shard's bytes on disk
  std::int64_t staging = 0;          // ZeRO 2-3 staging: layer buffers, embedding/head gathers
  std::vector<int> slots_per_chunk;  // activation slots the schedule keeps alive, per chunk
  std::vector<std::int64_t> slot_bytes;  // activation arena of one micro-batch, per chunk
  std::int64_t activations = 0;          // sum over chunks of slots x (arena + token/label buffers)
  std::int64_t num_parameters = 0;       // this rank's parameters (no padding)

  std::int64_t states() const { return parameters + gradients + optimizer; }
  std::int64_t total() const { return states() + staging + activations; }
  // Highest resident point: every buffer above is allocated before training starts.
  std::int64_t peak() const { return total(); }
};

struct MemoryPlan {
  std::vector<RankMemory> stages;  // one per pipeline stage (tp and dp ranks hold the same)
  int worst_stage = 0;
  const RankMemory& worst() const { return stages[static_cast<std::size_t>(worst_stage)]; }
};

// `cfg` must be finalized for `world_size` and have model.vocab_size set.
MemoryPlan predict_memory(const train::TrainConfig& cfg, int world_size);

struct TimeBreakdown {
  // Per iteration on the slowest stage, seconds.
  double forward = 0, backward = 0, recompute = 0;  // compute (GEMM + attention + element-wise)
  double gemm = 0, attention = 0, elementwise = 0;  // the same compute, by kind of kernel
  double tp_comm = 0;                               // tensor-parallel collectives (not overlapped)
  double ep_comm = 0;     // expert parallelism: the count all-gathers and token all-to-alls
  double cp_comm = 0;     // context parallelism: the ring's key/value blocks and gradients
  double cp_exposed = 0;  // the part of cp_comm the attention does not hide
  double pp_comm = 0;     // pipeline sends and receives
  double bubble = 0;      // pipeline fill and drain
  double dp_comm = 0;     // data-parallel / ZeRO traffic in total
  double dp_exposed = 0;  // the part the backward does not hide
  double optimizer = 0;   // clipping norm, AdamW, gradient zeroing, BF16 refresh
  double offload_io = 0;  // offload nvme: moments / master shard read and written (overlapped)
  double offload_param_io = 0;       // --offload-params nvme: the gathers' reads of layer pieces
  double offload_param_exposed = 0;  // the part of those reads the passes' compute does not hide
  double oversubscription = 0;       // cpu: extra time because ranks x threads exceed the cores
  double iteration = 0;
  // Derived.
  double model_flops = 0;  // Megatron's formula, per iteration
  double tflops_per_gpu = 0, mfu = 0, tokens_per_s = 0;
  std::int64_t micro_batches = 0;
};

// cpu: whether the calibration holds trident's measured collectives for a job of this many ranks
// (`--calibrate-comm`); without them the time model prices collectives from the copy bandwidth.
bool collectives_measured(const Cluster& cluster);

// A mixture-of-experts layer's work on one rank for one micro-batch of `rows` tokens, with its
// experts over `ep` ranks and tensor-parallel over `tp` (docs/plan.md "Mixture of experts").
// The busiest ep rank's experts run moe_load_imbalance(ep) times the mean rows (dropless, ep > 1):
// 1 + 0.25 log2(ep), fitted to the measured busiest-rank load of a router trained with the Switch
// load-balancing loss 0.01 (bench/moe/run_moe_bench.py --ep-load; docs/plan.md: medians 1.26,
// 1.41 and 1.76 at EP 2, 4 and 8). 1 at ep 1.
double moe_load_imbalance(int ep);
struct MoeLayerCost {
  std::int64_t routed_rows = 0;              // rows the permute produces (MoeConfig::max_rows)
  std::int64_t local_experts = 0;            // E / ep
  std::int64_t rows_per_local_expert = 0;    // on the busiest rank: ceil(ep x routed / E x load)
  std::int64_t ffn_local = 0, fc_local = 0;  // each expert's F / tp, its up-projection's outputs
  double all_to_all_bytes = 0;  // what each rank sends in one all-to-all: routed rows x C x 4
  double count_bytes = 0;       // the count all-gather's total: ep x E x 8 (int64)
};
MoeLayerCost moe_layer_cost(const model::ModelConfig& mc, std::int64_t rows, int tp, int ep);

// Throws InvalidArgument for a cluster that does not match the layout (cpu without calibration).
TimeBreakdown predict_time(const train::TrainConfig& cfg, const Cluster& cluster);

// The GEMM and attention shapes `cfg` runs on each rank (for --calibrate to time exactly).
KernelShapes kernel_shapes(const train::TrainConfig& cfg, const Cluster& cluster);

struct Plan {
  MemoryPlan memory;
  TimeBreakdown time;
  double capacity_bytes = 0;  // per rank, after the reserve
  bool fits = true;
};
Plan make_plan(const train::TrainConfig& cfg, const Cluster& cluster);

// --search: layouts (TP, PP, CP, virtual stages, DP, micro-batch size, ZeRO stage, SP, recompute)
// of cfg's model and global batch on the cluster; those that fit, best throughput first.
struct Candidate {
  train::TrainConfig cfg;
  Plan plan;
  std::string flags;  // the `trident train` flags of this layout
};
struct SearchResult {
  std::vector<Candidate> ranked;  // fitting layouts, best first
  std::int64_t evaluated = 0, rejected_memory = 0, invalid = 0;
};
// Sizes the search keeps fixed (0: searched). --expert-model-parallel-size given to
// `trident plan --search` fixes the expert-parallel size; otherwise a mixture-of-experts model's
// search tries every ep dividing both the number of experts and dp (dense models: 1).
// context_parallel_size fixes cp (a base configuration's cp above 1 is kept as well); otherwise
// the search tries every cp dividing world / (tp x pp) whose 2 x cp chunks divide the sequence
// (dense models without --reset-position-ids / --reset-attention-mask; others: 1).
struct SearchConstraints {
  int expert_model_parallel_size = 0;
  int context_parallel_size = 0;
};
SearchResult search_layouts(const train::TrainConfig& base, const Cluster& cluster,
                            std::size_t keep = 10, const SearchConstraints& fixed = {});

// Training length: time and GPU-hours to train `tokens` tokens at the predicted speed.
struct TrainingEstimate {
  double tokens = 0, seconds = 0, gpu_hours = 0;
};
TrainingEstimate estimate_training(const TimeBreakdown& t, const Cluster& c, double tokens);

// Output.
std::string format_plan(const train::TrainConfig& cfg, const Cluster& cluster, const Plan& plan,
                        double train_tokens);
std::string format_search(const Cluster& cluster, const SearchResult& result, std::size_t top);
nlohmann::json plan_json(const train::TrainConfig& cfg, const Cluster& cluster, const Plan& plan,
                         double train_tokens);
nlohmann::json search_json(const Cluster& cluster, const SearchResult& result, std::size_t top);
// The layout flags of cfg as `trident train` takes them.
std::string layout_flags(const train::TrainConfig& cfg);

}  // namespace trident::plan
