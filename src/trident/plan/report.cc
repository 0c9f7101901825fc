// make_plan, --search and the text / JSON output of `trident plan`.
#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trident/core/error.h"
#include "trident/plan/plan.h"

namespace trident::plan {

namespace {

// Bytes in GiB, MiB or KiB, whichever reads best.
std::string gib(double bytes) {
  char b[32];
  const double k = 1024.0;
  if (bytes >= k * k * k) {
    std::snprintf(b, sizeof(b), "%.3f GiB", bytes / (k * k * k));
  } else if (bytes >= k * k) {
    std::snprintf(b, sizeof(b), "%.3f MiB", bytes / (k * k));
  } else {
    std::snprintf(b, sizeof(b), "%.3f KiB", bytes / k);
  }
  return b;
}
std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%10.3f ms", s * 1e3);
  return b;
}
std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof(b), f, x);
  return b;
}

nlohmann::json memory_json(const RankMemory& r) {
  return {{"pp_rank", r.pp_rank},
          {"parameters_held", r.num_parameters},
          {"parameters", r.parameters},
          {"gradients", r.gradients},
          {"optimizer", r.optimizer},
          {"offloaded", r.offloaded},
          {"staging", r.staging},
          {"activation_slots", r.slots_per_chunk},
          {"activation_slot_bytes", r.slot_bytes},
          {"activations", r.activations},
          {"total", r.total()},
          {"peak", r.peak()}};
}

nlohmann::json time_json(const TimeBreakdown& t) {
  return {{"iteration_s", t.iteration},
          {"forward_s", t.forward},
          {"backward_s", t.backward},
          {"recompute_s", t.recompute},
          {"gemm_s", t.gemm},
          {"attention_s", t.attention},
          {"elementwise_s", t.elementwise},
          {"tp_comm_s", t.tp_comm},
          {"ep_comm_s", t.ep_comm},
          {"cp_comm_s", t.cp_comm},
          {"cp_exposed_s", t.cp_exposed},
          {"pp_comm_s", t.pp_comm},
          {"bubble_s", t.bubble},
          {"dp_comm_s", t.dp_comm},
          {"dp_exposed_s", t.dp_exposed},
          {"optimizer_s", t.optimizer},
          {"offload_io_s", t.offload_io},
          {"offload_param_io_s", t.offload_param_io},
          {"offload_param_exposed_s", t.offload_param_exposed},
          {"oversubscription_s", t.oversubscription},
          {"model_flops", t.model_flops},
          {"tflops_per_gpu", t.tflops_per_gpu},
          {"mfu", t.mfu},
          {"tokens_per_s", t.tokens_per_s},
          {"micro_batches", t.micro_batches}};
}

}  // namespace

bool collectives_measured(const Cluster& cluster) {
  if (!cluster.calibration) return false;
  const std::string prefix = std::to_string(cluster.num_gpus) + ",";
  for (const auto& [key, c] : cluster.calibration->comm) {
    if (key.starts_with(prefix)) return true;
  }
  return false;
}

Plan make_plan(const train::TrainConfig& cfg, const Cluster& cluster) {
  Plan p;
  p.memory = predict_memory(cfg, cluster.num_gpus);
  p.time = predict_time(cfg, cluster);
  p.capacity_bytes = cluster.hw.memory_bytes - cluster.hw.reserved_bytes;
  if (cluster.hw.is_cpu) {
    // Ranks of one machine share its memory.
    p.capacity_bytes = std::min<double>(cluster.num_gpus, cluster.hw.gpus_per_node) > 0
                           ? p.capacity_bytes / std::min(cluster.num_gpus, cluster.hw.gpus_per_node)
                           : p.capacity_bytes;
  }
  p.fits = static_cast<double>(p.memory.worst().peak()) <= p.capacity_bytes;
  return p;
}

std::string layout_flags(const train::TrainConfig& c) {
  std::ostringstream o;
  o << "--tensor-model-parallel-size " << c.tensor_model_parallel_size
    << " --pipeline-model-parallel-size " << c.pipeline_model_parallel_size;
  if (c.num_layers_per_virtual_pipeline_stage > 0)
    o << " --num-layers-per-virtual-pipeline-stage " << c.num_layers_per_virtual_pipeline_stage;
  else if (c.pipeline_model_parallel_size > 1)
    o << " --pipeline-schedule " << c.pipeline_schedule;
  o << " --micro-batch-size " << c.micro_batch_size << " --global-batch-size "
    << c.global_batch_size;
  if (c.expert_model_parallel_size > 1)
    o << " --expert-model-parallel-size " << c.expert_model_parallel_size;
  if (c.context_parallel_size > 1) o << " --context-parallel-size " << c.context_parallel_size;
  if (c.ulysses()) o << " --ds-sequence-parallel-size " << c.ds_sequence_parallel_size;
  if (c.zero_stage > 0) o << " --zero-stage " << c.zero_stage;
  if (c.sequence_parallel) o << " --sequence-parallel";
  if (!c.recompute_granularity.empty()) {
    o << " --recompute-granularity " << c.recompute_granularity;
    if (c.recompute_granularity == "full") o << " --recompute-method uniform";
  }
  if (c.bf16) o << " --bf16";
  return o.str();
}

namespace {

// Context parallelism: every cp dividing the world / (tp x pp) ranks left after tp x pp (none
// when tp x pp does not divide the world) whose 2 x cp chunks divide the sequence, for a model
// trident train runs with it (dense, no documents); or only `fixed` (> 0) where it divides them.
// Searched at every sequence length: on a short one the ring and the narrower GEMMs make CP
// slower than plain dp, and the time model ranks it so.
std::vector<int> context_parallel_sizes(const model::ModelConfig& mc, int world, int tp_pp,
                                        int fixed) {
  std::vector<int> cps;
  const int dp_all = world % tp_pp == 0 ? world / tp_pp : 0;
  for (int c = 1; c <= dp_all; ++c) {
    if (dp_all % c != 0 || (fixed > 0 && c != fixed)) continue;
    if (c > 1 && (mc.seq_length % (2 * c) != 0 || mc.num_experts > 0 || mc.documents())) continue;
    cps.push_back(c);
  }
  return cps;
}

// Plans one candidate layout of the search: counted, and kept when it is valid and fits.
void consider(train::TrainConfig c, const Cluster& cluster, SearchResult& res) {
  ++res.evaluated;
  try {
    c.finalize(cluster.num_gpus);
    Plan p = make_plan(c, cluster);
    if (!p.fits) {
      ++res.rejected_memory;
      return;
    }
    std::string flags = layout_flags(c);
    res.ranked.push_back({std::move(c), std::move(p), std::move(flags)});
  } catch (const core::InvalidArgument&) {
    ++res.invalid;
  }
}

}  // namespace

SearchResult search_layouts(const train::TrainConfig& base, const Cluster& cluster,
                            std::size_t keep, const SearchConstraints& fixed) {
  SearchResult res;
  const int world = cluster.num_gpus;
  const model::ModelConfig& mc = base.model;
  const std::int64_t gbs = base.global_batch_size;
  std::vector<int> tps, pps;
  for (int t = 1; t <= world; ++t)
    if (world % t == 0 && t <= std::max(1, cluster.hw.gpus_per_node) &&
        mc.num_attention_heads % t == 0 && mc.ffn() % t == 0 &&
        (mc.num_experts == 0 || mc.moe_ffn() % t == 0))
      tps.push_back(t);
  for (int p = 1; p <= world; ++p)
    if (world % p == 0 && mc.num_layers % p == 0) pps.push_back(p);
  const std::vector<std::string> recomputes = {"", "selective", "full"};
  // A sequence split above 1 in the base configuration is kept as a given one, and so is its
  // kind (a --ds-sequence-parallel-size stays Ulysses, a --context-parallel-size the ring); a
  // --context-parallel-size given to the search is the ring. Otherwise each split above 1 is
  // tried both ways: the ring, and Ulysses where the heads of a tp rank divide.
  int fixed_cp = fixed.context_parallel_size;
  if (fixed_cp == 0 && base.sequence_split() > 1) fixed_cp = base.sequence_split();
  const bool kind_given = fixed.context_parallel_size > 0 || base.sequence_split() > 1;
  auto split_kinds = [&](int tp, int cp) {
    std::vector<bool> kinds;  // false: the ring, true: Ulysses
    if (cp == 1 || kind_given) return std::vector<bool>{cp > 1 && base.ulysses()};
    kinds.push_back(false);
    if ((mc.num_attention_heads / tp) % cp == 0) kinds.push_back(true);
    return kinds;
  };
  for (int tp : tps)
    for (int pp : pps)
      for (int cp : context_parallel_sizes(mc, world, tp * pp, fixed_cp))
        for (bool ulysses : split_kinds(tp, cp)) {
          // dp: the ranks reading different samples (the batch's divisor); the ep and cp factors
          // split the tp x pp remainder dp x cp.
          const int dp = world / (tp * pp * cp);
          // Expert parallelism: every ep dividing the experts and dp (a dense model: 1), or the
          // given one where it divides them (a layout it does not divide is not proposed).
          std::vector<int> eps;
          for (int e = 1; e <= dp; ++e) {
            if (dp % e != 0 || (e > 1 && (mc.num_experts == 0 || mc.num_experts % e != 0)))
              continue;
            if (fixed.expert_model_parallel_size > 0 && e != fixed.expert_model_parallel_size)
              continue;
            eps.push_back(e);
          }
          for (int ep : eps)
            for (int v : {1, 2, 3, 4, 6, 8}) {
              if (v > 1 && (pp == 1 || mc.num_layers % (pp * v) != 0)) continue;
              for (std::int64_t mbs : {1, 2, 4, 8, 16}) {
                if (gbs % (mbs * dp) != 0) continue;
                const std::int64_t m = gbs / (mbs * dp);
                if (v > 1 && m % pp != 0) continue;
                for (int zero = 0; zero <= 3; ++zero) {
                  if (dp == 1 && zero > 0) continue;
                  for (bool sp : {false, true}) {
                    if (sp && (tp == 1 || (mbs * mc.seq_length / cp) % tp != 0)) continue;
                    for (const std::string& rc : recomputes) {
                      // Selective recomputation only drops the unfused attention's probabilities
                      // (context parallelism runs flash attention).
                      if (rc == "selective" && (mc.flash_attention() || cp > 1)) continue;
                      train::TrainConfig c = base;
                      c.tensor_model_parallel_size = tp;
                      c.pipeline_model_parallel_size = pp;
                      c.expert_model_parallel_size = ep;
                      c.context_parallel_size = ulysses ? 1 : cp;
                      c.ds_sequence_parallel_size = ulysses ? cp : 1;
                      c.num_layers_per_virtual_pipeline_stage =
                          v > 1 ? mc.num_layers / (pp * v) : 0;
                      c.pipeline_schedule = v > 1 ? "interleaved" : "1f1b";
                      c.decoder_first_pipeline_num_layers = c.decoder_last_pipeline_num_layers = -1;
                      c.micro_batch_size = mbs;
                      c.zero_stage = zero;
                      c.use_distributed_optimizer = false;
                      c.sequence_parallel = sp;
                      c.recompute_granularity = rc;
                      c.recompute_method = "uniform";
                      c.model.recompute_num_layers = 1;
                      c.model.make_vocab_size_divisible_by =
                          base.model.make_vocab_size_divisible_by;
                      consider(std::move(c), cluster, res);
                    }
                  }
                }
              }
            }
        }
  std::stable_sort(res.ranked.begin(), res.ranked.end(),
                   [](const Candidate& a, const Candidate& b) {
                     return a.plan.time.tokens_per_s > b.plan.time.tokens_per_s;
                   });
  if (res.ranked.size() > keep) res.ranked.resize(keep);
  return res;
}

std::string format_plan(const train::TrainConfig& cfg, const Cluster& cluster, const Plan& plan,
                        double train_tokens) {
  std::ostringstream o;
  const model::ModelConfig& mc = cfg.model;
  const int world = cluster.num_gpus;
  o << "trident plan: GPT " << mc.num_layers << " layers, hidden " << mc.hidden_size << ", heads "
    << mc.num_attention_heads << ", seq " << mc.seq_length << ", vocab " << mc.vocab_size << " ("
    << mc.num_parameters() << " parameters)\n";
  o << "cluster: " << world << " x " << cluster.hw.name << " (" << cluster.num_nodes()
    << " node(s) of " << cluster.hw.gpus_per_node << ")";
  if (cluster.hw.is_cpu) o << ", " << cluster.threads_per_rank << " thread(s) per rank";
  if (cluster.hw.is_cpu && world > 1) {
    o << (collectives_measured(cluster)
              ? "\ncollectives: measured (trident plan --calibrate-comm over " +
                    std::to_string(world) + " ranks)"
              : "\ncollectives: modelled from the copy bandwidth; measure them with mpirun -np " +
                    std::to_string(world) + " trident plan --gpu cpu --calibrate-comm");
  }
  o << "\nlayout: tp " << cfg.tensor_model_parallel_size << " x pp "
    << cfg.pipeline_model_parallel_size << " x dp " << cfg.data_parallel_size(world)
    << (cfg.sequence_split() > 1
            ? (cfg.ulysses() ? " x ulysses " : " x cp ") + std::to_string(cfg.sequence_split())
            : std::string())
    << (cfg.expert_model_parallel_size > 1
            ? " (experts: ep " + std::to_string(cfg.expert_model_parallel_size) + " x expert dp " +
                  std::to_string(cfg.data_parallel_size(world) / cfg.expert_model_parallel_size) +
                  ")"
            : std::string())
    << ", " << cfg.virtual_pipeline_chunks() << " chunk(s) per stage, " << cfg.pipeline_schedule
    << ", micro-batch " << cfg.micro_batch_size << " x " << plan.time.micro_batches << ", ZeRO "
    << cfg.zero_stage << (cfg.sequence_parallel ? ", SP" : "")
    << (cfg.recompute_granularity.empty() ? "" : ", recompute " + cfg.recompute_granularity)
    << (cfg.bf16 ? ", bf16" : ", fp32") << "\n\n";
  o << "memory per rank (bytes as trident allocates them)\n";
  o << "  stage  parameters      gradients       optimizer       staging         activations "
       "(slots)   total\n";
  for (const RankMemory& r : plan.memory.stages) {
    std::string slots;
    for (int s : r.slots_per_chunk) {
      // Appended in two steps: GCC 12 warns (-Wrestrict, a false positive) about "+" + to_string.
      if (!slots.empty()) slots += '+';
      slots += std::to_string(s);
    }
    char line[512];
    std::snprintf(line, sizeof(line), "  %5d  %-15s %-15s %-15s %-15s %-15s (%s)  %-15s%s\n",
                  r.pp_rank, gib(static_cast<double>(r.parameters)).c_str(),
                  gib(static_cast<double>(r.gradients)).c_str(),
                  gib(static_cast<double>(r.optimizer)).c_str(),
                  gib(static_cast<double>(r.staging)).c_str(),
                  gib(static_cast<double>(r.activations)).c_str(), slots.c_str(),
                  gib(static_cast<double>(r.total())).c_str(),
                  r.pp_rank == plan.memory.worst_stage ? "  <- most" : "");
    o << line;
  }
  if (plan.memory.worst().offloaded > 0) {
    o << "  offloaded to disk (--offload-optimizer / --offload-params nvme, not counted above): "
      << gib(static_cast<double>(plan.memory.worst().offloaded)) << " per rank\n";
  }
  o << "  capacity per rank " << gib(plan.capacity_bytes)
    << (cluster.hw.reserved_bytes > 0
            ? " (after " + gib(cluster.hw.reserved_bytes) + " reserved for the runtime)"
            : std::string())
    << ": " << (plan.fits ? "fits" : "DOES NOT FIT") << "\n\n";
  const TimeBreakdown& t = plan.time;
  o << "time per iteration (slowest stage)\n";
  o << "  forward        " << ms(t.forward) << "\n  backward       " << ms(t.backward)
    << "\n  recompute      " << ms(t.recompute) << "\n    (GEMM " << ms(t.gemm) << ", attention "
    << ms(t.attention) << ", element-wise " << ms(t.elementwise) << ")\n  TP comm        "
    << ms(t.tp_comm)
    << (cfg.expert_model_parallel_size > 1 ? "\n  EP all-to-all  " + ms(t.ep_comm) : std::string())
    << (cfg.sequence_split() > 1
            ? std::string(cfg.ulysses() ? "\n  Ulysses a2a    " : "\n  CP ring        ") +
                  ms(t.cp_comm) + " (exposed " + ms(t.cp_exposed) + ")"
            : std::string())
    << "\n  PP comm        " << ms(t.pp_comm) << "\n  pipeline bubble" << ms(t.bubble)
    << "\n  DP/ZeRO comm   " << ms(t.dp_comm) << " (exposed " << ms(t.dp_exposed)
    << ")\n  optimizer      " << ms(t.optimizer) << "\n";
  if (t.offload_io > 0) {
    o << "    (offload I/O " << ms(t.offload_io) << " at "
      << fmt("%.1f", cluster.hw.offload_disk_bw / 1e9) << " GB/s, overlapped with AdamW)\n";
  }
  if (t.offload_param_io > 0) {
    o << "  weight reads   " << ms(t.offload_param_io) << " (--offload-params nvme, read ahead of "
      << "the gathers; exposed " << ms(t.offload_param_exposed) << ")\n";
  }
  if (t.oversubscription > 0) o << "  cores shared   " << ms(t.oversubscription) << "\n";
  o << "  iteration      " << ms(t.iteration) << "\n\n";
  o << "throughput: " << fmt("%.3f", t.tflops_per_gpu) << " TFLOP/s per "
    << (cluster.hw.is_cpu ? "rank" : "GPU") << " (Megatron's formula), MFU "
    << fmt("%.1f%%", 100 * t.mfu) << ", " << fmt("%.0f", t.tokens_per_s) << " tokens/s\n";
  if (train_tokens > 0) {
    const TrainingEstimate e = estimate_training(t, cluster, train_tokens);
    o << "training " << fmt("%.4g", train_tokens) << " tokens: " << fmt("%.2f", e.seconds / 86400)
      << " days, " << fmt("%.0f", e.gpu_hours) << " GPU-hours\n";
  }
  return o.str();
}

std::string format_search(const Cluster& cluster, const SearchResult& r, std::size_t top) {
  std::ostringstream o;
  o << "search: " << r.evaluated << " layouts on " << cluster.num_gpus << " x " << cluster.hw.name
    << "; " << r.invalid << " invalid, " << r.rejected_memory << " do not fit\n";
  std::size_t i = 0;
  for (const Candidate& c : r.ranked) {
    if (i++ >= top) break;
    const TimeBreakdown& t = c.plan.time;
    o << "\n#" << i << "  " << fmt("%.0f", t.tokens_per_s) << " tokens/s, "
      << fmt("%.1f", t.tflops_per_gpu) << " TFLOP/s/GPU, MFU " << fmt("%.1f%%", 100 * t.mfu)
      << ", iteration " << fmt("%.3f", t.iteration) << " s, peak memory "
      << gib(static_cast<double>(c.plan.memory.worst().peak())) << "\n";
    o << "    compute " << fmt("%.3f", t.forward + t.backward + t.recompute) << " s, TP "
      << fmt("%.3f", t.tp_comm) << " s, "
      << (c.cfg.expert_model_parallel_size > 1 ? "EP " + fmt("%.3f", t.ep_comm) + " s, "
                                               : std::string())
      << (c.cfg.sequence_split() > 1 ? "CP exposed " + fmt("%.3f", t.cp_exposed) + " s, "
                                     : std::string())
      << "PP " << fmt("%.3f", t.pp_comm) << " s, bubble " << fmt("%.3f", t.bubble)
      << " s, DP exposed " << fmt("%.3f", t.dp_exposed) << " s, optimizer "
      << fmt("%.3f", t.optimizer) << " s\n";
    o << "    trident train " << c.flags << "\n";
  }
  if (r.ranked.empty()) o << "no layout fits: add GPUs or memory, or shorten the sequence\n";
  return o.str();
}

nlohmann::json plan_json(const train::TrainConfig& cfg, const Cluster& cluster, const Plan& plan,
                         double train_tokens) {
  nlohmann::json j;
  j["gpu"] = cluster.hw.name;
  j["num_gpus"] = cluster.num_gpus;
  if (cluster.hw.is_cpu) j["collectives_measured"] = collectives_measured(cluster);
  j["layout"] = {{"tp", cfg.tensor_model_parallel_size},
                 {"pp", cfg.pipeline_model_parallel_size},
                 {"ep", cfg.expert_model_parallel_size},
                 {"cp", cfg.sequence_split()},
                 {"ulysses", cfg.ulysses()},
                 {"dp", cfg.data_parallel_size(cluster.num_gpus)},
                 {"virtual_chunks", cfg.virtual_pipeline_chunks()},
                 {"schedule", cfg.pipeline_schedule},
                 {"micro_batch_size", cfg.micro_batch_size},
                 {"global_batch_size", cfg.global_batch_size},
                 {"zero_stage", cfg.zero_stage},
                 {"sequence_parallel", cfg.sequence_parallel},
                 {"recompute", cfg.recompute_granularity},
                 {"bf16", cfg.bf16},
                 {"flags", layout_flags(cfg)}};
  j["memory"] = nlohmann::json::array();
  for (const RankMemory& r : plan.memory.stages) j["memory"].push_back(memory_json(r));
  j["worst_stage"] = plan.memory.worst_stage;
  j["capacity_bytes"] = plan.capacity_bytes;
  j["fits"] = plan.fits;
  j["time"] = time_json(plan.time);
  if (train_tokens > 0) {
    const TrainingEstimate e = estimate_training(plan.time, cluster, train_tokens);
    j["training"] = {{"tokens", e.tokens}, {"seconds", e.seconds}, {"gpu_hours", e.gpu_hours}};
  }
  return j;
}

nlohmann::json search_json(const Cluster& cluster, const SearchResult& r, std::size_t top) {
  nlohmann::json j;
  j["evaluated"] = r.evaluated;
  j["invalid"] = r.invalid;
  j["rejected_memory"] = r.rejected_memory;
  j["ranked"] = nlohmann::json::array();
  std::size_t i = 0;
  for (const Candidate& c : r.ranked) {
    if (i++ >= top) break;
    j["ranked"].push_back(plan_json(c.cfg, cluster, c.plan, 0));
  }
  return j;
}

}  // namespace trident::plan
