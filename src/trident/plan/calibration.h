// Calibration of `--gpu cpu`: a short run of trident's own kernels on this machine (FP32 GEMMs of
// the linear layers on a grid of shapes, both attention kernels, the element-wise kernels, AdamW
// and a memory copy), cached in a JSON file and read by the time model (plan/time_model.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace trident::plan {

// Cost of an element-wise kernel: a fixed overhead per call plus a time per element.
struct LinearCost {
  double overhead_s = 0;
  double per_element_s = 0;
  double at(double n) const { return overhead_s + per_element_s * n; }
};

// Shapes a configuration runs (from the time model), timed exactly by --calibrate.
struct KernelShapes {
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> linear;  // rows, in, out
  std::vector<std::tuple<bool, std::int64_t, std::int64_t, std::int64_t>>
      attention;  // flash,
                  // batch x heads, seq, hs
};

// trident's own collectives (comm::Communicator over MPI, as trident train runs them) for one
// group size inside one job size: seconds per call at each measured message size. Measured by
// `mpirun -np W trident plan --gpu cpu --calibrate-comm` (plan/comm_calibration.h), with the W
// ranks split into W/n groups of n that communicate at once, as TP and DP groups do.
struct CommCosts {
  std::vector<std::int64_t> bytes;  // message sizes, increasing (all-gather, reduce-scatter: the
                                    // gathered / scattered total; p2p: one message)
  std::vector<double> all_reduce_s, reduce_scatter_s, all_gather_s, p2p_s;
  // Piecewise linear in the size; below the first size its time, above the last the last rate.
  static double at(const std::vector<std::int64_t>& bytes, const std::vector<double>& t, double b);
  double all_reduce(double b) const { return at(bytes, all_reduce_s, b); }
  double reduce_scatter(double b) const { return at(bytes, reduce_scatter_s, b); }
  double all_gather(double b) const { return at(bytes, all_gather_s, b); }
  double p2p(double b) const { return at(bytes, p2p_s, b); }
  // How the ranks slow each other inside a step, measured with the job's ranks computing at once
  // (when they fit the machine's cores; otherwise left at "none" and the time model's
  // shared-cores bound prices them): `corun_gemm`, a GEMM's time with every rank running GEMMs
  // over its time alone (shared caches and memory bandwidth); and the wait of a synchronising
  // call (a collective or a message) for the group's slowest rank, `sync_wait_s` per call plus
  // `sync_wait_fraction` of the compute since the previous one: the machine's noise (interrupts,
  // other processes, the hypervisor) delays one rank and every other one waits for it.
  double corun_gemm = 1, sync_wait_s = 0, sync_wait_fraction = 0;
  friend bool operator==(const CommCosts&, const CommCosts&) = default;
};

// The cache key of a group of `group` ranks inside a job of `world` ranks: "world,group".
std::string comm_key(int world, int group);

struct Calibration {
  int threads = 1;  // OpenMP / oneDNN threads per rank this was measured with
  // GEMM grid: every dimension takes the values of `grid`; seconds of linear_forward and
  // linear_backward (d_in, d_weight, d_bias) for rows x in_features -> out_features, indexed
  // [r][i][o] flattened. Points above the measured flop cap hold 0 (extrapolated at the
  // neighbouring rate).
  std::vector<std::int64_t> grid;
  std::vector<double> linear_fwd_s, linear_bwd_s;
  // Attention per (seq_len, head_dim) grid point, seconds per (batch x head): unfused and flash.
  std::vector<std::int64_t> attn_seq, attn_head_dim;
  std::vector<double> attn_fwd_s, attn_bwd_s, flash_fwd_s, flash_bwd_s;
  LinearCost layernorm_fwd, layernorm_bwd, bias_gelu_fwd, bias_gelu_bwd, add, cross_entropy, adamw,
      embedding;
  // Hidden dropout (p = 0.1) per element: one Philox draw each; its per-element cost also prices
  // the attention-dropout draws inside the flash kernels (one per causal score).
  LinearCost dropout;
  // Exact timings of the shapes a configuration runs (key "rows,in,out" and
  // "flash,bh,seq,head_dim"): seconds forward and backward; used instead of the grid.
  std::map<std::string, std::pair<double, double>> linear_exact, attention_exact;
  double memory_bw = 0;    // bytes/s of a large copy (what shared-memory MPI moves at)
  double peak_tflops = 0;  // best FP32 GEMM rate seen
  int cores = 1;           // hardware threads of the machine
  // Collectives by comm_key(world, group); absent until --calibrate-comm ran with that many ranks
  // (the time model then prices them from memory_bw).
  std::map<std::string, CommCosts> comm;
  const CommCosts* comm_costs(int world, int group) const;

  double linear_forward_s(std::int64_t rows, std::int64_t in, std::int64_t out) const;
  double linear_backward_s(std::int64_t rows, std::int64_t in, std::int64_t out) const;
  // One call over batch x heads (local heads).
  double attention_forward_s(bool flash, std::int64_t bh, std::int64_t seq,
                             std::int64_t head_dim) const;
  double attention_backward_s(bool flash, std::int64_t bh, std::int64_t seq,
                              std::int64_t head_dim) const;
};

// Runs the kernels with `threads` threads (about 10-30 s on a 2-core machine), then times the
// given shapes exactly. With `base` (a cached calibration for the same thread count) only the
// shapes it lacks are timed.
Calibration calibrate(int threads, const KernelShapes& shapes = {},
                      const Calibration* base = nullptr);

// The clock kernels are timed by: with one thread, the thread's CPU time (a machine shared with
// other jobs, its cores time-sliced, still measures the kernels' own speed); with several, the
// wall clock (CPU time would hide their synchronisation). Seconds.
double calibration_clock_s(int threads);

// The cache: one calibration per thread count, in a JSON file.
std::string default_calibration_path();  // $TRIDENT_PLAN_CACHE or ~/.cache/trident/plan-cpu.json
void save_calibration(const std::string& path, const Calibration& c);
// Returns false when the file has no calibration for `threads`.
bool load_calibration(const std::string& path, int threads, Calibration& out);

}  // namespace trident::plan
