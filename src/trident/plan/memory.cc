// Memory per rank from trident's own size tables (see plan.h).
#include <algorithm>
#include <exception>

#include "trident/core/arena.h"
#include "trident/model/gpt.h"
#include "trident/optim/model_state.h"
#include "trident/optim/offload.h"
#include "trident/optim/update_rule.h"
#include "trident/optim/zero3_gather.h"
#include "trident/parallel/pipeline_schedule.h"
#include "trident/plan/plan.h"
#include "trident/train/rank_model.h"
#include "trident/train/zero_optimizer.h"

namespace trident::plan {

namespace {

// model::activation_bytes. With --bf16 it asks oneDNN for its BF16 matmul workspace, which fails
// on a CPU without BF16 matmuls (planning for a GPU from such a machine): then the BF16 operand
// buffers are counted as gpt.cc lays them out (the widest matmul input and output of the shard,
// two bytes an element) and the oneDNN workspace, a CPU-only buffer, as zero.
std::int64_t slot_activation_bytes(const model::ModelConfig& mc, const model::ModelShard& shard,
                                   std::int64_t B, std::int64_t T, bool bf16) {
  if (!bf16) return model::activation_bytes(mc, shard, B, T, false);
  try {
    return model::activation_bytes(mc, shard, B, T, true);
  } catch (const std::exception&) {
    const std::int64_t BT = B * T, C = mc.hidden_size, tp = shard.tp_size;
    const std::int64_t F = mc.ffn() / tp, Vl = mc.padded_vocab_size(tp) / tp;
    const std::int64_t in = std::max(C, F), out = std::max({3 * C / tp, C, F, Vl});
    return model::activation_bytes(mc, shard, B, T, false) +
           core::Arena::footprint(core::DType::kF32, {(BT * in + 1) / 2}) +
           core::Arena::footprint(core::DType::kF32, {(BT * out + 1) / 2});
  }
}

}  // namespace

MemoryPlan predict_memory(const train::TrainConfig& cfg, int world_size) {
  const model::ModelConfig& mc = cfg.model;
  const int tp = cfg.tensor_model_parallel_size, pp = cfg.pipeline_model_parallel_size;
  // The ranks that hold the same weights, over which ZeRO shards and the gradients are summed:
  // data parallel x context parallel (parallel/layout.h; cfg.data_parallel_size counts only the
  // ranks reading different samples). cp: --context-parallel-size or, with the same split,
  // --ds-sequence-parallel-size (DeepSpeed-Ulysses).
  const int cp = cfg.sequence_split();
  const int dp = cfg.data_parallel_size(world_size) * cp;
  const int v = cfg.virtual_pipeline_chunks();
  const train::PipelineSplit split{.pp_size = pp,
                                   .num_chunks = v,
                                   .first_stage_layers = cfg.decoder_first_pipeline_num_layers,
                                   .last_stage_layers = cfg.decoder_last_pipeline_num_layers};
  const auto kind = parallel::parse_pipeline_schedule(cfg.pipeline_schedule);
  const int m = static_cast<int>(cfg.num_micro_batches(world_size));
  // Context parallelism: each rank holds seq_length / cp tokens of a sample, and the ring's (or
  // Ulysses') buffers (model/gpt.cc), as GptPipeline::add_slots sizes them.
  const std::int64_t B = cfg.micro_batch_size, T = mc.seq_length / cp;
  // Expert parallelism (docs/moe.md): the rank holds experts block 0 of ep (every block is the
  // same size); the trainer keeps the dense part in an optimizer over dp and the experts in one
  // over the expert-data-parallel group (dp / ep), and sums the two reports (train/trainer.cc).
  const int ep = cfg.expert_model_parallel_size;
  const int edp = dp / ep;
  auto rank_model = [&](int stage, model::ParamPart part) {
    return train::RankModel(mc, split, tp, 0, stage, cfg.sequence_parallel,
                            {.ep_size = ep, .ep_rank = 0, .part = part});
  };
  MemoryPlan plan;
  for (int stage = 0; stage < pp; ++stage) {
    train::RankModel rm = rank_model(stage, model::ParamPart::kAll);
    rm.set_context_parallel(cp, 0, cfg.ulysses());  // every cp rank's arenas are the same size
    // The optimizer's buffers as ParamGradBuffers and DistributedOptimizer allocate them (the
    // update rule's state arrays: AdamW 2, Lion 1).
    const int state_arrays = optim::state_array_count(cfg.optimizer.kind);
    const bool params_nvme = cfg.offload_params == "nvme" && cfg.zero_stage == 3;
    const bool moments_nvme = cfg.offload.device == optim::OffloadDevice::kNvme;
    const optim::FlatLayout layout = train::flat_layout_of(rm);
    optim::MemoryReport states;
    if (ep > 1) {
      // Offloading is refused with expert parallelism (TrainConfig::finalize), so the two parts'
      // resident buffers are all there is.
      for (const auto& [part, group] :
           {std::pair{model::ParamPart::kDense, dp}, std::pair{model::ParamPart::kExperts, edp}}) {
        const optim::MemoryReport part_states =
            optim::model_state_memory(train::flat_layout_of(rank_model(stage, part)),
                                      cfg.zero_stage, group, cfg.bf16, state_arrays);
        states.param_bytes += part_states.param_bytes;
        states.grad_bytes += part_states.grad_bytes;
        states.optimizer_bytes += part_states.optimizer_bytes;
        states.staging_bytes += part_states.staging_bytes;
      }
    } else {
      states = optim::model_state_memory(layout, cfg.zero_stage, dp, cfg.bf16, state_arrays,
                                         params_nvme);
    }
    RankMemory r;
    r.pp_rank = stage;
    r.num_parameters = rm.num_parameters();
    r.parameters = states.param_bytes;  // FP32 weights and the BF16 copies
    r.gradients = states.grad_bytes;
    r.optimizer = states.optimizer_bytes;
    if (moments_nvme || params_nvme) {
      // The offloaded arrays (master shard, moments) of the updated range live on disk; the
      // streaming window stays, an equal share per array, and ZeRO-3's read-ahead buffers
      // (optim/offload.h, optim/zero3_gather.h).
      const parallel::ShardPlan sp =
          parallel::build_shard_plan(rm.total_numel(), dp, optim::kShardAlign);
      const std::int64_t n =
          optim::buffer_sizes(layout, sp, optim::zero_policy(cfg.zero_stage), cfg.bf16).state;
      const int arrays = (params_nvme ? 1 : 0) + (moments_nvme ? state_arrays : 0);
      const optim::OffloadFootprint f =
          optim::offload_footprint(cfg.offload.window_bytes, arrays, n);
      const std::int64_t share = f.window_bytes / arrays;
      if (moments_nvme) r.optimizer = state_arrays * share;
      if (params_nvme) {
        r.parameters += share + optim::Zero3ParamGatherer::fetch_window_bytes(layout, sp);
      }
      r.offloaded = f.file_bytes;
    }
    r.staging = states.staging_bytes;
    r.slots_per_chunk = parallel::activation_slots_per_chunk(kind, {pp, m, v}, stage);
    for (std::size_t c = 0; c < rm.chunks().size(); ++c) {
      const std::int64_t bytes = slot_activation_bytes(mc, rm.chunks()[c].shard, B, T, cfg.bf16);
      r.slot_bytes.push_back(bytes);
      // Each slot also holds the micro-batch's token ids and labels (2 x B x T int32).
      r.activations += r.slots_per_chunk[c] * (bytes + 2 * B * T * std::int64_t{4});
    }
    plan.stages.push_back(std::move(r));
  }
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    if (plan.stages[s].peak() > plan.worst().peak()) plan.worst_stage = static_cast<int>(s);
  }
  return plan;
}

}  // namespace trident::plan
