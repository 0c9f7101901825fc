#include "trident/parallel/tp_ops.h"

namespace trident::parallel {

void TpGroup::count(std::int64_t TpTraffic::*what, double factor, std::int64_t elements) const {
  if (!traffic_) return;
  ++(traffic_->*what);
  const double t = tp_->size();
  traffic_->bytes += factor * (t - 1) / t * static_cast<double>(elements) * 4.0;
}

void TpGroup::copy_to_tp_backward(float* d_in, std::int64_t rows, std::int64_t cols) const {
  if (!tp_) return;
  count(&TpTraffic::all_reduces, 2.0, rows * cols);
  tp_->all_reduce(d_in, rows * cols, comm::Datatype::kF32, comm::ReduceOp::kSum);
}

void TpGroup::reduce_from_tp(float* partial, std::int64_t rows, std::int64_t cols) const {
  if (!tp_) return;
  count(&TpTraffic::all_reduces, 2.0, rows * cols);
  tp_->all_reduce(partial, rows * cols, comm::Datatype::kF32, comm::ReduceOp::kSum);
}

const float* TpGroup::gather_from_sequence(const float* local, float* full, std::int64_t full_rows,
                                           std::int64_t cols) const {
  if (!tp_) return local;
  count(&TpTraffic::all_gathers, 1.0, full_rows * cols);
  tp_->all_gather(local, full, full_rows / tp_->size() * cols, comm::Datatype::kF32);
  return full;
}

float* TpGroup::gather_from_sequence_backward(float* d_full, std::int64_t full_rows,
                                              std::int64_t cols) const {
  if (!tp_) return d_full;
  count(&TpTraffic::reduce_scatters, 1.0, full_rows * cols);
  const std::int64_t block = full_rows / tp_->size() * cols;
  float* mine = d_full + static_cast<std::int64_t>(tp_->rank()) * block;
  tp_->reduce_scatter(d_full, mine, block, comm::Datatype::kF32, comm::ReduceOp::kSum);
  return mine;
}

void TpGroup::reduce_scatter_to_sequence(const float* partial, float* local, std::int64_t full_rows,
                                         std::int64_t cols) const {
  if (!tp_) return;
  count(&TpTraffic::reduce_scatters, 1.0, full_rows * cols);
  tp_->reduce_scatter(partial, local, full_rows / tp_->size() * cols, comm::Datatype::kF32,
                      comm::ReduceOp::kSum);
}

const float* TpGroup::reduce_scatter_to_sequence_backward(const float* d_local, float* d_full,
                                                          std::int64_t full_rows,
                                                          std::int64_t cols) const {
  return gather_from_sequence(d_local, d_full, full_rows, cols);
}

void TpGroup::all_reduce_max(float* buf, std::int64_t count_) const {
  if (!tp_) return;
  count(&TpTraffic::all_reduces, 2.0, count_);
  tp_->all_reduce(buf, count_, comm::Datatype::kF32, comm::ReduceOp::kMax);
}

void TpGroup::all_reduce_sum(float* buf, std::int64_t count_) const {
  if (!tp_) return;
  count(&TpTraffic::all_reduces, 2.0, count_);
  tp_->all_reduce(buf, count_, comm::Datatype::kF32, comm::ReduceOp::kSum);
}

}  // namespace trident::parallel
