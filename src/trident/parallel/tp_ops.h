// Tensor-parallel collectives as Megatron's named conjugate pairs (megatron/core/tensor_parallel/
// mappings.py). Each forward op has a backward twin; the layers call them by name, so every
// communication of the model is visible at its call site, and every one is counted in TpTraffic.
//
//   forward                         backward (the conjugate)
//   copy_to_tp            identity  copy_to_tp_backward            all-reduce of the input grad
//   reduce_from_tp      all-reduce  reduce_from_tp_backward        identity
//   gather_from_sequence all-gather gather_from_sequence_backward  reduce-scatter
//   reduce_scatter_to_sequence  r-s reduce_scatter_to_sequence_backward  all-gather
//
// A column-parallel layer's input enters the tensor-parallel region through copy_to_tp (or, with
// sequence parallelism, gather_from_sequence); a row-parallel layer's partial output leaves it
// through reduce_from_tp (or reduce_scatter_to_sequence). TpRegion picks the pair for the layout.
//
// Buffers are FP32 (rows, cols) row-major; "full" means all B*T rows of the micro-batch, "local"
// means this rank's contiguous block of rows / tp_size (sequence parallelism).
#pragma once

#include <cstdint>

#include "trident/comm/communicator.h"

namespace trident::parallel {

// Tensor-parallel traffic, counted per call (for the log and the per-layer communication
// measurements in docs/3d-parallelism.md).
struct TpTraffic {
  std::int64_t all_reduces = 0, all_gathers = 0, reduce_scatters = 0;
  double bytes = 0;  // ring bytes sent per rank: all-reduce 2 (T-1)/T x, the others (T-1)/T x
};

// The model's handle on its tensor-parallel group: the communicator (null or size 1: no tensor
// parallelism, every op is the identity) and the traffic counter (null: not counted).
class TpGroup {
 public:
  TpGroup() = default;
  TpGroup(comm::Communicator* tp, TpTraffic* traffic)
      : tp_(tp && tp->size() > 1 ? tp : nullptr), traffic_(traffic) {}
  bool active() const { return tp_ != nullptr; }
  int size() const { return tp_ ? tp_->size() : 1; }
  int rank() const { return tp_ ? tp_->rank() : 0; }

  // f (before a column-parallel layer): forward identity; backward all-reduce of the partial
  // input gradient, in place (rows x cols).
  const float* copy_to_tp(const float* in) const { return in; }
  void copy_to_tp_backward(float* d_in, std::int64_t rows, std::int64_t cols) const;
  // g (after a row-parallel layer): forward all-reduce of the partial sums, in place; backward
  // identity.
  void reduce_from_tp(float* partial, std::int64_t rows, std::int64_t cols) const;
  const float* reduce_from_tp_backward(const float* d_out) const { return d_out; }
  // Sequence parallelism, before a column-parallel layer: all-gather the local rows into `full`
  // (full_rows x cols); backward: reduce-scatter the partial full-rows gradient, returning this
  // rank's block (inside `d_full`).
  const float* gather_from_sequence(const float* local, float* full, std::int64_t full_rows,
                                    std::int64_t cols) const;
  float* gather_from_sequence_backward(float* d_full, std::int64_t full_rows,
                                       std::int64_t cols) const;
  // Sequence parallelism, after a row-parallel layer: reduce-scatter the partial full-rows sums
  // into this rank's rows `local`; backward: all-gather the local gradient into `d_full`.
  void reduce_scatter_to_sequence(const float* partial, float* local, std::int64_t full_rows,
                                  std::int64_t cols) const;
  const float* reduce_scatter_to_sequence_backward(const float* d_local, float* d_full,
                                                   std::int64_t full_rows, std::int64_t cols) const;

  // Reductions of per-row values that are not activations (the vocab-parallel loss's max, sum of
  // exponentials and target logit), in place over `count` floats.
  void all_reduce_max(float* buf, std::int64_t count) const;
  void all_reduce_sum(float* buf, std::int64_t count) const;

 private:
  // One collective over `elements` floats: ring bytes = factor (T-1)/T x 4 bytes each.
  void count(std::int64_t TpTraffic::*what, double factor, std::int64_t elements) const;

  comm::Communicator* tp_ = nullptr;
  TpTraffic* traffic_ = nullptr;
};

// The conjugate pair around a tensor-parallel region, picked for the layout: without sequence
// parallelism the residual stream (rows x cols) is replicated on every tp rank (copy_to_tp /
// reduce_from_tp); with it, each rank holds a contiguous block of the rows (gather_from_sequence /
// reduce_scatter_to_sequence).
class TpRegion {
 public:
  TpRegion(const TpGroup& group, bool sequence_parallel, std::int64_t rows, std::int64_t cols)
      : g_(group), sp_(group.active() && sequence_parallel), rows_(rows), cols_(cols) {}
  const TpGroup& group() const { return g_; }
  bool sp() const { return sp_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t local_rows() const { return sp_ ? rows_ / g_.size() : rows_; }
  // First full-rows index of this rank's residual-stream rows.
  std::int64_t first_row() const { return sp_ ? g_.rank() * local_rows() : 0; }

  // Entering (forward): the full-rows input of the column-parallel layer (SP: gathered into full).
  const float* enter(const float* local, float* full) const {
    return sp_ ? g_.gather_from_sequence(local, full, rows_, cols_) : g_.copy_to_tp(local);
  }
  // Backward of enter: `partial` holds this rank's partial input gradient over the full rows;
  // returns the local rows' complete gradient (inside `partial`).
  float* enter_backward(float* partial) const {
    if (sp_) return g_.gather_from_sequence_backward(partial, rows_, cols_);
    g_.copy_to_tp_backward(partial, rows_, cols_);
    return partial;
  }
  // Where a row-parallel layer writes its partial sum before leave: in place without SP, else
  // the full-rows scratch.
  float* partial_of(float* out, float* full_scratch) const { return sp_ ? full_scratch : out; }
  // Leaving (forward): the partial sum over the full rows becomes the local rows' output `out`
  // (in place without SP: out == partial).
  void leave(float* partial, float* out) const {
    if (sp_) {
      g_.reduce_scatter_to_sequence(partial, out, rows_, cols_);
    } else {
      g_.reduce_from_tp(partial, rows_, cols_);
    }
  }
  // Backward of leave: the gradient over the full rows (SP: all-gathered into d_full).
  const float* leave_backward(const float* d_local, float* d_full) const {
    return sp_ ? g_.reduce_scatter_to_sequence_backward(d_local, d_full, rows_, cols_)
               : g_.reduce_from_tp_backward(d_local);
  }

 private:
  TpGroup g_;
  bool sp_;
  std::int64_t rows_, cols_;
};

}  // namespace trident::parallel
