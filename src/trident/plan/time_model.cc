// Time per iteration: a per-op model of the slowest pipeline stage (see plan.h, docs/plan.md).
#include <algorithm>
#include <cmath>

#include "trident/core/error.h"
#include "trident/model/gpt_weights.h"
#include "trident/plan/plan.h"
#include "trident/train/rank_model.h"
#include "trident/train/zero_optimizer.h"

namespace trident::plan {

namespace {

enum class Ew { kLnFwd, kLnBwd, kGeluFwd, kGeluBwd, kAdd, kCrossEntropy, kEmbedding, kDropout };

// Cost of single kernels on one rank.
class Costs {
 public:
  explicit Costs(const Cluster& c, KernelShapes* record = nullptr)
      : c_(c), cal_(c.calibration && !record ? &*c.calibration : nullptr), rec_(record) {
    // trident keeps activations in FP32; the GPU model follows Megatron's BF16 activations.
    act_bytes_ = c.hw.is_cpu ? 4.0 : 2.0;
  }
  double act_bytes() const { return act_bytes_; }

  double gemm_fwd(std::int64_t rows, std::int64_t in, std::int64_t out) const {
    if (rec_) return rec_->linear.emplace_back(rows, in, out), 1e-9;
    if (cal_) return gemm_factor() * cal_->linear_forward_s(rows, in, out);
    return gpu_gemm(rows, in, out);
  }
  // d_in and d_weight (and d_bias).
  double gemm_bwd(std::int64_t rows, std::int64_t in, std::int64_t out) const {
    if (rec_) return rec_->linear.emplace_back(rows, in, out), 1e-9;
    if (cal_) return gemm_factor() * cal_->linear_backward_s(rows, in, out);
    return gpu_gemm(rows, out, in) + gpu_gemm(out, rows, in);
  }
  double attn_fwd(bool flash, std::int64_t bh, std::int64_t T, std::int64_t hs) const {
    if (rec_) return rec_->attention.emplace_back(flash, bh, T, hs), 1e-9;
    if (cal_) return compute_factor() * cal_->attention_forward_s(flash, bh, T, hs);
    // q k^T and p v over the causal half (flash kernels skip the masked blocks).
    const double flops = 4.0 * static_cast<double>(bh) * T * T * hs * (flash ? 0.5 : 1.0);
    return flops / (c_.hw.peak_tflops * 1e12 * c_.hw.attention_efficiency);
  }
  double attn_bwd(bool flash, std::int64_t bh, std::int64_t T, std::int64_t hs) const {
    if (rec_) return rec_->attention.emplace_back(flash, bh, T, hs), 1e-9;
    if (cal_) return compute_factor() * cal_->attention_backward_s(flash, bh, T, hs);
    return 2.5 * attn_fwd(flash, bh, T, hs);  // two GEMMs per forward one, plus the recompute
  }
  double ew(Ew kind, double elements) const {
    if (cal_) return compute_factor() * calibrated_ew(kind, elements);
    // Bytes moved per element: reads and writes of the kernel.
    double passes = 2;

    double bytes = act_bytes_;
    switch (kind) {
      case Ew::kLnFwd:
        passes = 2;
        break;
      case Ew::kLnBwd:
        passes = 4;
        break;
      case Ew::kGeluFwd:
        passes = 2;
        break;
      case Ew::kGeluBwd:
        passes = 3;
        break;
      case Ew::kAdd:
        passes = 3;
        break;
      case Ew::kCrossEntropy:
        passes = 3, bytes = 4;
        break;  // FP32 logits
      case Ew::kEmbedding:
        passes = 2;
        break;
      case Ew::kDropout:  // fused into the bias-dropout-add on GPUs: one more pass, as an add
        passes = 3;
        break;
    }
    return passes * bytes * elements / (c_.hw.memory_bw * c_.hw.bandwidth_efficiency) + 3e-6;
  }
  // The attention-dropout draws of one pass: one per causal score (CPU flash kernels; on GPUs
  // they hide under the attention's arithmetic).
  double attention_dropout(double scores) const {
    return cal_ ? compute_factor() * cal_->dropout.per_element_s * scores : 0.0;
  }
  // AdamW over n elements and the reads of the gradient norm and zeroing over n_grad.
  double optimizer(double n, double n_grad, bool bf16) const {
    if (cal_) {
      return compute_factor() *
             (cal_->adamw.at(n) + 2 * cal_->add.at(n_grad) + (bf16 ? cal_->add.at(n) : 0));
    }
    const double bytes = 28.0 * n + 8.0 * n_grad + (bf16 ? 6.0 * n : 0.0);
    return bytes / (c_.hw.memory_bw * c_.hw.bandwidth_efficiency);
  }

  // Ring collectives over a group of n ranks (`across_nodes`: the group spans nodes).
  double link_bw(bool across_nodes) const {
    if (c_.hw.is_cpu) return c_.hw.intra_bw;
    return (across_nodes ? c_.hw.inter_bw : c_.hw.intra_bw) * c_.hw.comm_efficiency;
  }
  double latency(bool across_nodes) const {
    return across_nodes ? c_.hw.inter_latency : c_.hw.intra_latency;
  }
  // Whether a non-blocking transfer moves while the rank computes: on the CPU the MPI library
  // moves data only inside its calls.
  bool transfers_overlap_compute() const { return !c_.hw.is_cpu; }
  // On the CPU, after `mpirun -np W trident plan --gpu cpu --calibrate-comm`: trident's own
  // collectives as measured for a group of n inside a job of this many ranks.
  const CommCosts* measured(int n) const {
    return cal_ && c_.hw.is_cpu ? cal_->comm_costs(c_.num_gpus, n) : nullptr;
  }
  // A job of several ranks, after --calibrate-comm measured how they slow each other
  // (CommCosts::corun_gemm, sync_wait_*): the job-wide group's figures. With more ranks than
  // cores, they are relative to a rank's share of a core (the shared-cores bound applies it).
  const CommCosts* interference() const {
    return c_.num_gpus >= 2 ? measured(c_.num_gpus) : nullptr;
  }
  // Every kernel pays the noise-driven waits in proportion to its time; GEMMs also slow down
  // when every rank computes at once.
  double compute_factor() const {
    const CommCosts* m = interference();
    return m ? 1 + m->sync_wait_fraction : 1.0;
  }
  double gemm_factor() const {
    const CommCosts* m = interference();
    return m ? (1 + (m->corun_gemm - 1) * busy_) * (1 + m->sync_wait_fraction) : 1.0;
  }
  // The share of its time the other ranks compute (1 unless a pipeline's stages differ; with
  // more ranks than cores the cores are always busy).
  void set_corunners_busy(double busy) { busy_ = ranks_fit_cores() ? busy : 1.0; }
  bool ranks_fit_cores() const {
    return cal_ && static_cast<double>(c_.num_gpus) * c_.threads_per_rank <= cal_->cores;
  }
  // The fixed wait of one synchronising call in a group of n.
  double sync_wait(int n) const {
    const CommCosts* m = interference() ? measured(n) : nullptr;
    return m ? m->sync_wait_s : 0.0;
  }
  bool comm_measured(int n) const { return measured(n) != nullptr; }
  double all_reduce(double bytes, int n, bool across) const {
    if (n <= 1) return 0;
    if (const CommCosts* m = measured(n)) return m->all_reduce(bytes) + sync_wait(n);
    return 2.0 * (n - 1) / n * bytes / link_bw(across) + 2.0 * (n - 1) * latency(across);
  }
  // `bytes` reduced in `buckets` equal calls (DDP's gradient buckets).
  double all_reduce_buckets(double bytes, int n, std::int64_t buckets, bool across) const {
    if (n <= 1) return 0;
    const double b = static_cast<double>(std::max<std::int64_t>(1, buckets));
    if (const CommCosts* m = measured(n)) return b * (m->all_reduce(bytes / b) + sync_wait(n));
    return all_reduce(bytes, n, across) + (b - 1) * 2.0 * (n - 1) * latency(across);
  }
  double all_gather(double bytes, int n, bool across) const {  // bytes: the gathered total
    if (n <= 1) return 0;
    if (const CommCosts* m = measured(n)) return m->all_gather(bytes) + sync_wait(n);
    return static_cast<double>(n - 1) / n * bytes / link_bw(across) + (n - 1) * latency(across);
  }
  // bytes: the scattered total, in `buckets` equal calls. Modelled: an all-gather's cost.
  double reduce_scatter(double bytes, int n, bool across, std::int64_t buckets = 1) const {
    if (n <= 1) return 0;
    const double b = static_cast<double>(std::max<std::int64_t>(1, buckets));
    if (const CommCosts* m = measured(n)) return b * (m->reduce_scatter(bytes / b) + sync_wait(n));
    return all_gather(bytes, n, across);
  }
  // An all-to-all in which each of n ranks sends `bytes` in total, an equal share to every rank
  // (pairwise exchange: (n-1)/n of it leaves the rank in n-1 steps). Modelled also on a calibrated
  // CPU (--calibrate-comm does not time all-to-alls), with its synchronising wait.
  double all_to_all(double bytes, int n, bool across) const {
    if (n <= 1) return 0;
    return static_cast<double>(n - 1) / n * bytes / link_bw(across) + (n - 1) * latency(across) +
           sync_wait(n);
  }
  double p2p(double bytes, bool across) const {
    if (const CommCosts* m = measured(2)) return m->p2p(bytes) + sync_wait(2);
    return bytes / link_bw(across) + latency(across);
  }

 private:
  double gpu_gemm(std::int64_t m, std::int64_t k, std::int64_t n) const {
    const double h = c_.hw.gemm_half_size;
    auto sat = [h](double x) { return x / (x + h); };
    const double eff = c_.hw.gemm_efficiency * sat(static_cast<double>(m)) *
                       sat(static_cast<double>(n)) * sat(static_cast<double>(k));
    return 2.0 * static_cast<double>(m) * k * n / (c_.hw.peak_tflops * 1e12 * eff) + 4e-6;
  }

  double calibrated_ew(Ew kind, double elements) const {
    switch (kind) {
      case Ew::kLnFwd:
        return cal_->layernorm_fwd.at(elements);
      case Ew::kLnBwd:
        return cal_->layernorm_bwd.at(elements);
      case Ew::kGeluFwd:
        return cal_->bias_gelu_fwd.at(elements);
      case Ew::kGeluBwd:
        return cal_->bias_gelu_bwd.at(elements);
      case Ew::kAdd:
        return cal_->add.at(elements);
      case Ew::kCrossEntropy:
        return cal_->cross_entropy.at(elements);
      case Ew::kEmbedding:
        return cal_->embedding.at(elements);
      case Ew::kDropout:
        return cal_->dropout.at(elements);
    }
    return 0;
  }

  const Cluster& c_;
  const Calibration* cal_;
  KernelShapes* rec_;
  double act_bytes_ = 4;
  double busy_ = 1;
};

struct Pass {  // one micro-batch through one chunk
  double gemm = 0, attn = 0, ew = 0, tp = 0;
  double ep = 0;  // expert parallelism: the dispatcher's count all-gathers and all-to-alls
  // Context parallelism: the ring's transfers, and the part of them the attention does not hide.
  double cp_traffic = 0, cp = 0;
  double compute() const { return gemm + attn + ew; }
  Pass& operator+=(const Pass& o) {
    gemm += o.gemm, attn += o.attn, ew += o.ew, tp += o.tp, ep += o.ep;
    cp_traffic += o.cp_traffic, cp += o.cp;
    return *this;
  }
};

// Context parallelism's ring attention (model/layers/context_parallel.cc) on one rank for one
// layer and micro-batch: cp steps, each a pair of flash tiles whose work is a causal attention
// over the rank's T / cp tokens (`step_fwd`, `step_bwd`), so the cp steps make 1/cp of the whole
// sequence's causal attention. The next key/value block (B x T/cp x 2C/tp FP32: keys and values
// only, `block_bytes`)
// travels to the next rank of the ring while a step computes: a step costs max(compute,
// transfer), i.e. the compute plus the transfer's excess over it, and the last step sends
// nothing (cp - 1 transfers). The backward overlaps its cp - 1 blocks the same way, and after
// each step passes the block's key/value gradients one hop on, waiting for them (cp hops, not
// overlapped). On the CPU nothing overlaps. With cp = 1: one step, no transfer.
struct CoreCost {  // the attention core of one layer and micro-batch
  Pass fwd, bwd;
};
CoreCost ring_attention_cost(const Costs& k, int cp, double step_fwd, double step_bwd,
                             double block_bytes, bool across) {
  CoreCost r;
  r.fwd.attn = cp * step_fwd;
  r.bwd.attn = cp * step_bwd;
  if (cp <= 1) return r;
  const double hop = k.p2p(block_bytes, across);
  const double hidden = k.transfers_overlap_compute() ? 1.0 : 0.0;
  r.fwd.cp_traffic = (cp - 1) * hop;
  r.fwd.cp = (cp - 1) * std::max(0.0, hop - hidden * step_fwd);
  r.bwd.cp_traffic = (2 * cp - 1) * hop;
  r.bwd.cp = (cp - 1) * std::max(0.0, hop - hidden * step_bwd) + cp * hop;
  return r;
}

// DeepSpeed-Ulysses on the same group of u ranks (--ds-sequence-parallel-size, shard.ulysses):
// the core runs once over the whole sequence for 1/u of the rank's heads (`core_fwd`,
// `core_bwd`), between an all-to-all of the rows' qkv (each rank sends B x T/u x 3C/tp FP32,
// 3 x `row_bytes`) and one bringing the output back (B x T/u x C/tp); the backward makes the same
// two, reversed. On the critical path (trident waits for each).
CoreCost ulysses_attention_cost(const Costs& k, int u, double core_fwd, double core_bwd,
                                double row_bytes, bool across) {
  CoreCost r;
  r.fwd.attn = core_fwd;
  r.bwd.attn = core_bwd;
  const double a2a = k.all_to_all(3 * row_bytes, u, across) + k.all_to_all(row_bytes, u, across);
  r.fwd.cp_traffic = r.fwd.cp = r.bwd.cp_traffic = r.bwd.cp = a2a;
  return r;
}

// How the experts' group is placed: ep ranks, spanning nodes or not.
struct ExpertGroup {
  int ep = 1;
  bool across = false;
};

struct ChunkCost {
  Pass fwd, bwd, recompute;
};

}  // namespace

double moe_load_imbalance(int ep) {
  return ep > 1 ? 1.0 + 0.25 * std::log2(static_cast<double>(ep)) : 1.0;
}

MoeLayerCost moe_layer_cost(const model::ModelConfig& mc, std::int64_t rows, int tp, int ep) {
  const model::layers::MoeConfig moe = model::moe_config(mc, ep);
  MoeLayerCost c;
  if (moe.num_experts == 0) return c;
  const std::int64_t E = moe.num_experts, cap = moe.capacity(rows);
  c.routed_rows = moe.max_rows(rows);  // every choice, at most E x capacity, or exactly (padded)
  c.local_experts = moe.local_experts();
  // The rows of one expert from one rank, on average; the busiest ep rank's experts get ep times
  // that, times the load imbalance (none when padded: every block is the capacity), at most the
  // capacity from every rank.
  double rows_per_expert = static_cast<double>(ep) * static_cast<double>(c.routed_rows) /
                           static_cast<double>(E) *
                           (moe.pad_to_capacity ? 1.0 : moe_load_imbalance(ep));
  if (cap > 0) rows_per_expert = std::min(rows_per_expert, static_cast<double>(ep * cap));
  c.rows_per_local_expert = static_cast<std::int64_t>(std::ceil(rows_per_expert));
  c.ffn_local = moe.ffn / tp;
  c.fc_local = mc.swiglu ? 2 * c.ffn_local : c.ffn_local;
  c.all_to_all_bytes = static_cast<double>(c.routed_rows) * static_cast<double>(mc.hidden_size) * 4;
  c.count_bytes = static_cast<double>(ep) * static_cast<double>(E) * 8;
  return c;
}

namespace {

// With context parallelism (shard.cp_size > 1) every shape is the rank's: T = seq_length / cp
// tokens of each sample, its rows B x T, the attention a ring (ring_attention_cost) over the cp
// group (`cp_across`: spanning nodes).
ChunkCost chunk_cost(const train::TrainConfig& cfg, const model::ModelShard& shard, const Costs& k,
                     bool tp_across, const ExpertGroup& eg, bool cp_across) {
  const model::ModelConfig& mc = cfg.model;
  const int tp = shard.tp_size, cp = shard.cp_size;
  const bool sp = shard.sequence_parallel && tp > 1;
  const std::int64_t B = cfg.micro_batch_size, T = mc.seq_length / cp, rows = B * T;
  const std::int64_t C = mc.hidden_size, Cl = C / tp, Fl = mc.ffn() / tp;
  // Llama's shapes: grouped-query QKV (key/value heads per group, replicated when G < tp), the
  // SwiGLU up-projection's gate and up halves in one GEMM. The gated activation and RMSNorm are
  // priced as the GeLU and LayerNorm kernels over the same elements (the same passes, within a
  // few percent on the CPU), rotary positions as an add over the query and key heads.
  const std::int64_t QKVl = mc.local_qkv_rows(tp), UPl = mc.fc_rows() / tp;
  const std::int64_t NHl = mc.num_attention_heads / tp, HS = mc.head_dim();
  const std::int64_t R = sp ? rows / tp : rows;
  const std::int64_t Vl = mc.padded_vocab_size(tp) / tp;
  const bool flash = mc.flash_attention();
  const double act = k.act_bytes();
  const double full_bytes = static_cast<double>(rows * C) * act;
  // The two collectives of a tensor-parallel region each way: all-reduce, or with SP an
  // all-gather plus a reduce-scatter (each moving (tp-1)/tp of the full rows).
  const double region =
      tp <= 1 ? 0
      : sp ? k.all_gather(full_bytes, tp, tp_across) + k.reduce_scatter(full_bytes, tp, tp_across)
           : k.all_reduce(full_bytes, tp, tp_across);
  const double drop = mc.hidden_dropout > 0 ? 1 : 0;
  // Hidden dropout on the rows this rank holds (after the attention and the MLP, and on the
  // embedding); the backward draws the same masks again.
  const double dropout = drop * k.ew(Ew::kDropout, static_cast<double>(R * C));
  // Attention dropout: a draw per causal score of `heads` heads over `len` tokens.
  auto attn_drop = [&](std::int64_t heads, std::int64_t len) {
    return mc.attention_dropout > 0
               ? k.attention_dropout(static_cast<double>(B * heads) * static_cast<double>(len) *
                                     static_cast<double>(len + 1) / 2)
               : 0.0;
  };
  const double rope =
      mc.position_embedding == model::PositionEmbedding::kRope
          ? k.ew(Ew::kAdd, static_cast<double>(rows * (NHl + mc.local_query_groups(tp)) * HS))
          : 0.0;

  const std::int64_t L = shard.layers(mc);
  bool any_dense = false, any_moe = false;
  for (std::int64_t l = 0; l < L; ++l) {
    (mc.moe_layer(shard.first_layer + l) ? any_moe : any_dense) = true;
  }
  // The attention core with its dropout: a ring of cp steps over the local tokens under context
  // parallelism, Ulysses' whole sequence for 1/cp of the heads.
  const double row_bytes = static_cast<double>(rows * Cl) * 4;  // B x T x C/tp FP32
  const std::int64_t NHu = NHl / cp, Tu = T * cp;
  const CoreCost core =
      shard.ulysses && cp > 1
          ? ulysses_attention_cost(k, cp, k.attn_fwd(flash, B * NHu, Tu, HS) + attn_drop(NHu, Tu),
                                   k.attn_bwd(flash, B * NHu, Tu, HS) + attn_drop(NHu, Tu),
                                   row_bytes, cp_across)
          : ring_attention_cost(k, cp, k.attn_fwd(flash, B * NHl, T, HS) + attn_drop(NHl, T),
                                k.attn_bwd(flash, B * NHl, T, HS) + attn_drop(NHl, T),
                                2 * row_bytes, cp_across);
  Pass lf = core.fwd;  // one layer forward without its MLP
  lf.ew = 2 * k.ew(Ew::kLnFwd, static_cast<double>(R * C)) +
          2 * k.ew(Ew::kAdd, static_cast<double>(R * C)) + 2 * dropout + rope;
  lf.gemm = k.gemm_fwd(rows, C, QKVl) + k.gemm_fwd(rows, Cl, C);
  lf.tp = 2 * region;
  Pass lb = core.bwd;  // one layer backward without its MLP
  lb.ew = 2 * k.ew(Ew::kLnBwd, static_cast<double>(R * C)) +
          2 * k.ew(Ew::kAdd, static_cast<double>(R * C)) + 2 * dropout + rope;
  lb.gemm = k.gemm_bwd(rows, C, QKVl) + k.gemm_bwd(rows, Cl, C);
  // SP's backward gathers each region's input again for the weight gradient (the forward kept
  // only the local rows).
  lb.tp = 2 * region + (sp ? 2 * k.all_gather(full_bytes, tp, tp_across) : 0);
  // The dense MLP.
  Pass mf, mb;
  if (any_dense) {
    mf.ew = k.ew(Ew::kGeluFwd, static_cast<double>(rows * Fl));
    mf.gemm = k.gemm_fwd(rows, C, UPl) + k.gemm_fwd(rows, Fl, C);
    mb.ew = k.ew(Ew::kGeluBwd, static_cast<double>(rows * Fl));
    mb.gemm = k.gemm_bwd(rows, C, UPl) + k.gemm_bwd(rows, Fl, C);
  }
  // A mixture of experts instead (docs/plan.md "Mixture of experts"): the router's GEMM and
  // softmax / top-k, the permute and the weighted combine, each local expert's two GEMMs and
  // activation on the busiest rank's rows per expert, and with expert parallelism the count
  // all-gather and the two all-to-alls of the routed rows, forward and backward alike.
  Pass xf, xb;
  if (any_moe) {
    const MoeLayerCost m = moe_layer_cost(mc, rows, tp, eg.ep);
    const std::int64_t E = mc.num_experts, RE = m.rows_per_local_expert;
    const auto El = static_cast<double>(m.local_experts);
    const double routed = static_cast<double>(m.routed_rows * C);
    const double act_elems = El * static_cast<double>(RE * m.ffn_local);
    xf.gemm = k.gemm_fwd(rows, C, E) +
              El * (k.gemm_fwd(RE, C, m.fc_local) + k.gemm_fwd(RE, m.ffn_local, C));
    xf.ew = k.ew(Ew::kLnFwd, static_cast<double>(rows * E)) + k.ew(Ew::kGeluFwd, act_elems) +
            k.ew(Ew::kEmbedding, routed) + k.ew(Ew::kAdd, routed);
    xb.gemm = k.gemm_bwd(rows, C, E) +
              El * (k.gemm_bwd(RE, C, m.fc_local) + k.gemm_bwd(RE, m.ffn_local, C));
    xb.ew = k.ew(Ew::kLnBwd, static_cast<double>(rows * E)) + k.ew(Ew::kGeluBwd, act_elems) +
            k.ew(Ew::kEmbedding, routed) + k.ew(Ew::kAdd, routed);
    xf.ep = xb.ep = eg.ep > 1 ? k.all_gather(m.count_bytes, eg.ep, eg.across) +
                                    2 * k.all_to_all(m.all_to_all_bytes, eg.ep, eg.across)
                              : 0;
    // Shared experts: a dense MLP of the shared size on every row (tensor-parallel as the dense
    // MLP: one more region each way), and Qwen2-MoE's gate (a C -> 1 GEMM and its weighing).
    const std::int64_t S = mc.moe_shared_expert_intermediate_size;
    if (S > 0) {
      const std::int64_t SFl = S / tp, SUPl = mc.swiglu ? 2 * SFl : SFl;
      xf.gemm += k.gemm_fwd(rows, C, SUPl) + k.gemm_fwd(rows, SFl, C);
      xb.gemm += k.gemm_bwd(rows, C, SUPl) + k.gemm_bwd(rows, SFl, C);
      xf.ew += k.ew(Ew::kGeluFwd, static_cast<double>(rows * SFl)) +
               k.ew(Ew::kAdd, static_cast<double>(R * C));
      xb.ew += k.ew(Ew::kGeluBwd, static_cast<double>(rows * SFl)) +
               k.ew(Ew::kAdd, static_cast<double>(R * C));
      xf.tp += region;
      xb.tp += region + (sp ? k.all_gather(full_bytes, tp, tp_across) : 0);
      if (mc.moe_shared_expert_gate) {
        xf.gemm += k.gemm_fwd(R, C, 1);
        xb.gemm += k.gemm_bwd(R, C, 1);
      }
    }
  }

  ChunkCost cc;
  for (std::int64_t l = 0; l < L; ++l) {
    const bool moe = mc.moe_layer(shard.first_layer + l);
    Pass f = lf, b = lb;
    f += moe ? xf : mf;
    b += moe ? xb : mb;
    cc.fwd += f;
    cc.bwd += b;
    if (mc.recomputes(l)) {
      cc.recompute += f;
    } else if (mc.recompute == model::Recompute::kSelective && !flash) {
      Pass a;
      a.attn = k.attn_fwd(false, B * NHl, T, HS);
      cc.recompute += a;
    }
  }
  if (shard.has_embedding) {
    Pass e;
    e.ew = k.ew(Ew::kEmbedding, static_cast<double>(rows * C)) +
           (mc.embed_layernorm ? k.ew(Ew::kLnFwd, static_cast<double>(rows * C)) : 0) + dropout;
    cc.fwd += e;
    Pass eb;
    eb.ew = k.ew(Ew::kEmbedding, static_cast<double>(rows * C)) +
            (mc.embed_layernorm ? k.ew(Ew::kLnBwd, static_cast<double>(rows * C)) : 0) + dropout;
    // The vocab-parallel embedding sums its partial rows (SP: reduce-scatters them); the
    // backward of that sum is a copy (SP: an all-gather).
    eb.tp = sp ? k.all_gather(full_bytes, tp, tp_across) : 0;
    cc.bwd += eb;
    cc.fwd.tp += sp       ? k.reduce_scatter(full_bytes, tp, tp_across)
                 : tp > 1 ? k.all_reduce(full_bytes, tp, tp_across)
                          : 0;
  }
  if (shard.has_head) {
    Pass h;
    h.ew = k.ew(Ew::kLnFwd, static_cast<double>(R * C)) +
           k.ew(Ew::kCrossEntropy, static_cast<double>(rows * Vl));
    h.gemm = k.gemm_fwd(rows, C, Vl);
    // SP gathers the final LayerNorm output; the vocab-parallel loss reduces three row stats.
    h.tp = (sp ? k.all_gather(full_bytes, tp, tp_across) : 0) +
           (tp > 1 ? 2 * k.all_reduce(static_cast<double>(rows) * 4 * 1.5, tp, tp_across) : 0);
    cc.fwd += h;
    Pass hb;
    hb.ew = k.ew(Ew::kLnBwd, static_cast<double>(R * C));
    hb.gemm = k.gemm_bwd(rows, C, Vl);
    // SP gathers the input again for the weight gradient, then reduce-scatters the input's.
    hb.tp = tp > 1 ? (sp ? k.all_gather(full_bytes, tp, tp_across) +
                               k.reduce_scatter(full_bytes, tp, tp_across)
                         : k.all_reduce(full_bytes, tp, tp_across))
                   : 0;
    cc.bwd += hb;
  }
  return cc;
}

}  // namespace

namespace {
TimeBreakdown predict(const train::TrainConfig& cfg, const Cluster& cluster, KernelShapes* rec);
}  // namespace

TimeBreakdown predict_time(const train::TrainConfig& cfg, const Cluster& cluster) {
  TRIDENT_CHECK(!cluster.hw.is_cpu || cluster.calibration.has_value(),
                "--gpu cpu needs a calibration: run trident plan --gpu cpu --calibrate first");
  return predict(cfg, cluster, nullptr);
}

KernelShapes kernel_shapes(const train::TrainConfig& cfg, const Cluster& cluster) {
  KernelShapes shapes;
  Cluster c = cluster;
  c.calibration.reset();
  if (c.hw.memory_bw <= 0) c.hw.memory_bw = 1e9;  // element-wise costs are not needed here
  if (c.hw.intra_bw <= 0) c.hw.intra_bw = c.hw.inter_bw = 1e9;
  predict(cfg, c, &shapes);
  std::sort(shapes.linear.begin(), shapes.linear.end());
  shapes.linear.erase(std::unique(shapes.linear.begin(), shapes.linear.end()), shapes.linear.end());
  std::sort(shapes.attention.begin(), shapes.attention.end());
  shapes.attention.erase(std::unique(shapes.attention.begin(), shapes.attention.end()),
                         shapes.attention.end());
  return shapes;
}

namespace {
// What a layout's placement implies for the links (GPUs per node) and its sizes.
struct Layout {
  // dp: the ranks holding the same weights (gradient sums and ZeRO shards), data parallel x
  // context parallel (ParallelLayout::dp_size); cp: the context-parallel factor of it.
  int world, tp, pp, dp, v, cp;
  bool tp_across, dp_across, pp_across;  // the group spans nodes
  bool cp_across;                        // the cp group (tp x cp consecutive ranks) spans nodes
  ExpertGroup experts;                   // the ep group (tp x ep consecutive ranks)
  int edp;                               // the expert-data-parallel size, dp / ep
  std::int64_t m;                        // micro-batches per iteration
};

Layout layout_of(const train::TrainConfig& cfg, const Cluster& cluster) {
  Layout l;
  l.world = cluster.num_gpus;
  l.tp = cfg.tensor_model_parallel_size;
  l.pp = cfg.pipeline_model_parallel_size;
  l.cp = cfg.sequence_split();  // --context-parallel-size or --ds-sequence-parallel-size
  l.dp = cfg.data_parallel_size(l.world) * l.cp;
  l.v = cfg.virtual_pipeline_chunks();
  const int g = cluster.hw.gpus_per_node;
  l.tp_across = l.tp > g;
  l.cp_across = static_cast<std::int64_t>(l.tp) * l.cp > g;
  l.dp_across = static_cast<std::int64_t>(l.tp) * l.dp > g;
  l.pp_across = static_cast<std::int64_t>(l.tp) * l.dp >= g;
  l.experts.ep = cfg.expert_model_parallel_size;
  l.experts.across = static_cast<std::int64_t>(l.tp) * l.experts.ep > g;
  l.edp = l.dp / l.experts.ep;
  l.m = cfg.num_micro_batches(l.world);
  return l;
}

// One pipeline stage's work per micro-batch (all its chunks) and what it holds.
// What one optimizer of a stage holds and how trident's gradient sync calls its data-parallel
// group (optim/grad_sync.cc): the layers' elements, their DDP buckets (stages 0-1), and the
// non-layer ranges (embeddings, final LayerNorm), each reduced in its own call once per iteration.
struct DpPart {
  std::int64_t numel = 0;
  std::int64_t units = 0;  // ZeRO-3 gathers: one per layer, the embedding and the head
  std::int64_t layer_numel = 0, layer_calls = 0, buckets = 0, rest_calls = 0;
};

DpPart dp_part(const train::RankModel& rm, std::int64_t bucket_size) {
  DpPart d;
  d.numel = rm.total_numel();
  const optim::FlatLayout flat = train::flat_layout_of(rm);
  d.layer_numel = d.numel - flat.rest_numel();
  d.layer_calls = static_cast<std::int64_t>(flat.units().size());
  d.buckets = static_cast<std::int64_t>(flat.layer_buckets(bucket_size).size());
  d.rest_calls = static_cast<std::int64_t>(flat.rest().size());
  for (const train::ModelChunk& ch : rm.chunks()) {
    const model::ModelShard& sh = ch.shard;
    d.units += sh.layers(rm.config()) + (sh.has_embedding ? 1 : 0) + (sh.has_head ? 1 : 0);
  }
  return d;
}

struct Stage {
  double fwd = 0, bwd = 0, rec = 0, gemm = 0, attn = 0, ew = 0, tp = 0, p2p = 0, ep = 0;
  double cp = 0, cp_traffic = 0;  // the ring's exposed transfers and all of them
  double per_micro() const { return fwd + bwd + rec + tp + p2p + ep + cp; }
  // The optimizer over dp (everything, or with expert parallelism the dense part) and the
  // experts' over the expert-data-parallel group (expert parallelism only).
  DpPart dense, experts;
  std::int64_t numel() const { return dense.numel + experts.numel; }
  double embed_bytes = 0;
};

std::vector<Stage> stage_costs(const train::TrainConfig& cfg, const Layout& l, const Costs& k) {
  const model::ModelConfig& mc = cfg.model;
  const train::PipelineSplit split{.pp_size = l.pp,
                                   .num_chunks = l.v,
                                   .first_stage_layers = cfg.decoder_first_pipeline_num_layers,
                                   .last_stage_layers = cfg.decoder_last_pipeline_num_layers};
  const std::int64_t rows_local =
      cfg.micro_batch_size * mc.seq_length / l.cp / (cfg.sequence_parallel && l.tp > 1 ? l.tp : 1);
  const double p2p_bytes = static_cast<double>(rows_local * mc.hidden_size) * k.act_bytes();
  std::vector<Stage> stages;
  const int ep = l.experts.ep;
  auto rank_model = [&](int stage, model::ParamPart part) {
    return train::RankModel(mc, split, l.tp, 0, stage, cfg.sequence_parallel,
                            {.ep_size = ep, .ep_rank = 0, .part = part});
  };
  for (int s = 0; s < l.pp; ++s) {
    train::RankModel rm = rank_model(s, model::ParamPart::kAll);
    rm.set_context_parallel(l.cp, 0, cfg.ulysses());
    Stage st;
    if (ep > 1) {
      st.dense = dp_part(rank_model(s, model::ParamPart::kDense), cfg.ddp_bucket_size);
      st.experts = dp_part(rank_model(s, model::ParamPart::kExperts), cfg.ddp_bucket_size);
    } else {
      st.dense = dp_part(rm, cfg.ddp_bucket_size);
    }
    for (std::size_t c = 0; c < rm.chunks().size(); ++c) {
      const model::ModelShard& sh = rm.chunks()[c].shard;
      const ChunkCost cc = chunk_cost(cfg, sh, k, l.tp_across, l.experts, l.cp_across);
      st.fwd += cc.fwd.compute();
      st.bwd += cc.bwd.compute();
      st.rec += cc.recompute.compute();
      st.gemm += cc.fwd.gemm + cc.bwd.gemm + cc.recompute.gemm;
      st.attn += cc.fwd.attn + cc.bwd.attn + cc.recompute.attn;
      st.ew += cc.fwd.ew + cc.bwd.ew + cc.recompute.ew;
      st.tp += cc.fwd.tp + cc.bwd.tp + cc.recompute.tp;
      st.ep += cc.fwd.ep + cc.bwd.ep + cc.recompute.ep;
      st.cp += cc.fwd.cp + cc.bwd.cp + cc.recompute.cp;
      st.cp_traffic += cc.fwd.cp_traffic + cc.bwd.cp_traffic + cc.recompute.cp_traffic;
      const int u = static_cast<int>(c) * l.pp + s;
      if (u > 0) st.p2p += k.p2p(p2p_bytes, l.pp_across);               // receive the input
      if (u < l.pp * l.v - 1) st.p2p += k.p2p(p2p_bytes, l.pp_across);  // receive its gradient
      if ((sh.has_embedding || sh.has_head) && l.pp > 1) {
        st.embed_bytes =
            static_cast<double>(mc.padded_vocab_size(l.tp) / l.tp * mc.hidden_size) * 4;
      }
    }
    stages.push_back(st);
  }
  return stages;
}

// The pipeline: m micro-batches on the slowest stage plus the fill and drain.
void add_pipeline(TimeBreakdown& t, const Layout& l, const std::vector<Stage>& stages,
                  std::size_t worst) {
  double sum = 0;
  for (const Stage& s : stages) sum += s.per_micro();
  const Stage& w = stages[worst];
  const double md = static_cast<double>(l.m);
  t.micro_batches = l.m;
  t.forward = md * w.fwd;
  t.backward = md * w.bwd;
  t.recompute = md * w.rec;
  t.gemm = md * w.gemm;
  t.attention = md * w.attn;
  t.elementwise = md * w.ew;
  t.tp_comm = md * w.tp;
  t.ep_comm = md * w.ep;
  t.cp_comm = md * w.cp_traffic;
  t.cp_exposed = md * w.cp;
  t.pp_comm = md * w.p2p;
  // Fill and drain: every other stage's share of one micro-batch, spread over v chunks.
  t.bubble = (sum - w.per_micro()) / l.v;
}

// One optimizer's data-parallel / ZeRO traffic per iteration over its group of n ranks (the
// stage with the most of its elements sets it), and its DDP buckets (the last one is exposed).
struct DpTraffic {
  double comm = 0;
  std::int64_t buckets = 1;
};

DpTraffic dp_traffic(const train::TrainConfig& cfg, const Layout& l, const Costs& k,
                     const std::vector<Stage>& stages, DpPart Stage::*part, int n) {
  const double md = static_cast<double>(l.m);
  const DpPart* big = &(stages.front().*part);
  for (const Stage& s : stages) {
    if ((s.*part).numel > big->numel) big = &(s.*part);
  }
  DpTraffic r;
  const double bytes = 4.0 * static_cast<double>(big->numel);
  const double layer_bytes = 4.0 * static_cast<double>(big->layer_numel);
  const double rest_bytes = bytes - layer_bytes;
  // Stages 0-1: the layers' DDP buckets on the last micro-batch, then each non-layer range.
  const std::int64_t buckets = std::max<std::int64_t>(1, big->buckets);
  r.buckets = buckets;
  const std::int64_t rest_calls = std::max<std::int64_t>(1, big->rest_calls);
  const double rest_rs =
      rest_bytes > 0 ? k.reduce_scatter(rest_bytes, n, l.dp_across, rest_calls) : 0;
  // One all-gather of the parameters after the step.
  const double ag = k.all_gather(bytes, n, l.dp_across);
  switch (cfg.zero_stage) {
    case 0:
      r.comm = k.all_reduce_buckets(layer_bytes, n, buckets, l.dp_across) +
               (rest_bytes > 0 ? k.all_reduce_buckets(rest_bytes, n, rest_calls, l.dp_across) : 0);
      break;
    case 1:
      r.comm = k.reduce_scatter(layer_bytes, n, l.dp_across, buckets) + rest_rs + ag;
      break;
    case 2: {
      // Every micro-batch reduce-scatters each layer's gradient after its backward (one call a
      // layer); the non-layer gradients accumulate whole and are reduce-scattered once.
      const std::int64_t layers = std::max<std::int64_t>(1, big->layer_calls);
      r.comm = md * k.reduce_scatter(layer_bytes, n, l.dp_across, layers) + rest_rs + ag;
      break;
    }
    default: {  // per micro-batch and unit: gathered for the forward and the backward, and
                // its gradient reduce-scattered
      double units = 1;
      for (const Stage& s : stages) units = std::max(units, static_cast<double>((s.*part).units));
      r.comm = md * units *
               (2 * k.all_gather(bytes / units, n, l.dp_across) +
                k.reduce_scatter(bytes / units, n, l.dp_across));
    }
  }
  if (n <= 1 || big->numel == 0) r.comm = 0;
  return r;
}

// Data-parallel / ZeRO traffic of the largest stage's buffers (FP32 gradients and weights; with
// expert parallelism the dense part's over dp and the experts' over the expert-data-parallel
// group), the part the backward does not hide, and the tied embedding's sum over first and last
// stage.
void add_data_parallel(TimeBreakdown& t, const train::TrainConfig& cfg, const Cluster& cluster,
                       const Layout& l, const Costs& k, const std::vector<Stage>& stages,
                       const Stage& w) {
  const double md = static_cast<double>(l.m);
  double embed_bytes = 0;
  for (const Stage& s : stages) embed_bytes = std::max(embed_bytes, s.embed_bytes);
  const DpTraffic dense = dp_traffic(cfg, l, k, stages, &Stage::dense, l.dp);
  const DpTraffic experts = l.experts.ep > 1 ? dp_traffic(cfg, l, k, stages, &Stage::experts, l.edp)
                                             : DpTraffic{.comm = 0, .buckets = 1};
  t.dp_comm = dense.comm + experts.comm;
  // The backward compute the reduction can run under.
  const double one_bwd = w.bwd + w.rec;
  double window = cfg.zero_stage <= 1   ? one_bwd
                  : cfg.zero_stage == 2 ? md * one_bwd
                                        : md * (w.fwd + one_bwd);
  // On the CPU the MPI library moves data only inside its calls: nothing overlaps.
  if (cluster.hw.is_cpu) window = 0;
  // The last piece of each is exposed.
  const double tail = dense.comm / static_cast<double>(dense.buckets + 1) +
                      experts.comm / static_cast<double>(experts.buckets + 1);
  t.dp_exposed = std::max(tail, t.dp_comm - window);
  if (l.pp > 1) t.dp_exposed += k.all_reduce(embed_bytes, 2, l.pp_across || l.dp_across);
}

// AdamW over the rank's range, the gradient norm and zeroing, the BF16 refresh; the offloaded
// state's transfers and the parameter reads of --offload-params nvme.
void add_optimizer_and_offload(TimeBreakdown& t, const train::TrainConfig& cfg,
                               const Cluster& cluster, const Layout& l, const Costs& k,
                               const std::vector<Stage>& stages, const Stage& w) {
  // The elements the rank updates (n_opt) and whose gradients it reads (n_grad): each part's
  // whole or its shard over its group (dp; the experts' expert dp), on the largest stage.
  const int stage_z = cfg.zero_stage, dp = l.dp;
  double max_numel = 0, n_opt = 0, n_grad = 0;
  for (const Stage& s : stages) {
    const double dense = static_cast<double>(s.dense.numel);
    const double experts = static_cast<double>(s.experts.numel);
    max_numel = std::max(max_numel, dense + experts);
    n_opt = std::max(n_opt, stage_z == 0 ? dense + experts : dense / dp + experts / l.edp);
    n_grad = std::max(n_grad, stage_z >= 2 ? dense / dp + experts / l.edp : dense + experts);
  }
  const double md = static_cast<double>(l.m);
  t.optimizer = k.optimizer(n_opt, n_grad, cfg.bf16);
  const bool params_nvme = cfg.offload_params == "nvme" && stage_z == 3;
  const double disk_bw = cluster.hw.offload_disk_bw;
  if (cfg.offload.device == optim::OffloadDevice::kNvme || params_nvme) {
    // Both moments (16 bytes) and/or the FP32 master shard (8) read and written back per
    // step; the streamed update overlaps the transfers with AdamW, so the slower of the two sets
    // the pace.
    const double per_elem =
        (cfg.offload.device == optim::OffloadDevice::kNvme ? 16.0 : 0.0) + (params_nvme ? 8 : 0);
    t.offload_io = per_elem * n_opt / disk_bw;
    t.optimizer = std::max(t.optimizer, t.offload_io);
  }
  if (params_nvme) {
    // Every gather (forward and backward of each micro-batch) reads the rank's piece of the layer
    // first; read ahead of the layer, the reads overlap the passes' compute.
    t.offload_param_io = 2.0 * md * 4.0 * n_opt / disk_bw;
    t.offload_param_exposed = std::max(0.0, t.offload_param_io - md * (w.fwd + w.bwd + w.rec));
  }
}

// CPU ranks sharing the cores: the total work over all ranks bounds the iteration from below.
void add_oversubscription(TimeBreakdown& t, const Cluster& cluster, const Layout& l,
                          const std::vector<Stage>& stages) {
  if (!cluster.hw.is_cpu || !cluster.calibration) return;
  const double cores = cluster.calibration->cores;
  const double threads = static_cast<double>(l.world) * cluster.threads_per_rank;
  if (threads <= cores) return;
  const double md = static_cast<double>(l.m);
  double work = 0;
  for (const Stage& s : stages) work += md * (s.fwd + s.bwd + s.rec) + t.optimizer;
  work *= static_cast<double>(l.tp) * l.dp * cluster.threads_per_rank / cores;
  const double shared = work + t.tp_comm + t.ep_comm + t.cp_exposed + t.pp_comm + t.dp_exposed;
  if (shared > t.iteration) {
    t.oversubscription = shared - t.iteration;
    t.iteration = shared;
  }
}

// Megatron's model FLOPs per iteration, TFLOP/s per GPU, MFU and tokens/s.
void add_throughput(TimeBreakdown& t, const train::TrainConfig& cfg, const Cluster& cluster) {
  const std::int64_t tokens = cfg.global_batch_size * cfg.model.seq_length;
  t.model_flops = cfg.model.flops_per_iteration(tokens);
  t.tflops_per_gpu = t.model_flops / t.iteration / cluster.num_gpus / 1e12;
  const double peak = cluster.hw.is_cpu && cluster.calibration ? cluster.calibration->peak_tflops
                                                               : cluster.hw.peak_tflops;
  t.mfu = t.tflops_per_gpu / peak;
  t.tokens_per_s = static_cast<double>(tokens) / t.iteration;
}

TimeBreakdown predict(const train::TrainConfig& cfg, const Cluster& cluster, KernelShapes* rec) {
  Costs k(cluster, rec);
  const Layout l = layout_of(cfg, cluster);
  std::vector<Stage> stages = stage_costs(cfg, l, k);
  auto slowest = [&stages] {
    std::size_t worst = 0;
    for (std::size_t s = 0; s < stages.size(); ++s) {
      if (stages[s].per_micro() > stages[worst].per_micro()) worst = s;
    }
    return worst;
  };
  std::size_t worst = slowest();
  if (l.pp > 1 && k.ranks_fit_cores()) {
    // The slowest stage's GEMMs are slowed by the other ranks only while those compute: its
    // tensor- and data-parallel peers always, the other stages' ranks for their share of it.
    const double wm = stages[worst].per_micro();
    double others = static_cast<double>(l.tp) * l.dp - 1;
    for (std::size_t s = 0; s < stages.size(); ++s) {
      if (s != worst && wm > 0) {
        others += static_cast<double>(l.tp) * l.dp * std::min(1.0, stages[s].per_micro() / wm);
      }
    }
    k.set_corunners_busy(others / std::max(1, l.world - 1));
    stages = stage_costs(cfg, l, k);
    worst = slowest();
  }
  const Stage& w = stages[worst];
  TimeBreakdown t;
  add_pipeline(t, l, stages, worst);
  add_data_parallel(t, cfg, cluster, l, k, stages, w);
  add_optimizer_and_offload(t, cfg, cluster, l, k, stages, w);
  t.iteration = static_cast<double>(l.m) * w.per_micro() + t.bubble + t.dp_exposed + t.optimizer +
                t.offload_param_exposed;
  add_oversubscription(t, cluster, l, stages);
  add_throughput(t, cfg, cluster);
  return t;
}

}  // namespace

TrainingEstimate estimate_training(const TimeBreakdown& t, const Cluster& c, double tokens) {
  TrainingEstimate e;
  e.tokens = tokens;
  e.seconds = tokens / t.tokens_per_s;
  e.gpu_hours = e.seconds / 3600.0 * c.num_gpus;
  return e;
}

}  // namespace trident::plan
