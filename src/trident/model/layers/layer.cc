#include "trident/model/layers/layer.h"

#include <algorithm>

#include "trident/kernels/bf16.h"
#include "trident/kernels/dropout.h"
#include "trident/kernels/linear.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/model/layers/context_parallel.h"

namespace trident::model::layers {

namespace k = trident::kernels;

std::uint64_t drop_stream(std::int64_t iteration, std::int64_t layer, DropSite site) {
  return (static_cast<std::uint64_t>(iteration) << 24) ^
         (static_cast<std::uint64_t>(layer + 1) << 4) ^ static_cast<std::uint64_t>(site);
}

// The one place a precision is picked: by the weight view. When kernels take typed views this
// becomes a single kernels::linear call.
void linear(const LayerContext& lc, const LinearArgs& a) {
  const core::Device dev = lc.ctx.device;
  const core::TensorView out = core::view(a.out, {a.rows, a.out_features}, dev);
  const core::TensorView bias =
      a.bias != nullptr ? core::view(a.bias, {a.out_features}, dev) : core::TensorView{};
  if (a.weight.bf16 == nullptr) {
    return k::linear(lc.ctx,
                     {.out = out,
                      .in = core::view(a.in, {a.rows, a.in_features}, dev),
                      .weight = core::view(a.weight.f32, {a.out_features, a.in_features}, dev),
                      .bias = bias});
  }
  const core::bf16* in16 = a.in_bf16;
  if (in16 == nullptr) {
    k::convert(lc.ctx, {.out = core::view(lc.ws.bf16_in, {a.rows, a.in_features}, dev),
                        .in = core::view(a.in, {a.rows, a.in_features}, dev)});
    in16 = lc.ws.bf16_in;
  }
  k::linear(lc.ctx, {.out = out,
                     .in = core::view(in16, {a.rows, a.in_features}, dev),
                     .weight = core::view(a.weight.bf16, {a.out_features, a.in_features}, dev),
                     .bias = bias,
                     .scratch = lc.ws.gemm_scratch});
}

void linear_backward(const LayerContext& lc, const LinearBackwardArgs& a) {
  const core::Device dev = lc.ctx.device;
  const core::Shape in_shape{a.rows, a.in_features}, out_shape{a.rows, a.out_features};
  const core::Shape w_shape{a.out_features, a.in_features};
  k::LinearBackwardViews v{
      .d_in = a.d_in != nullptr ? core::view(a.d_in, in_shape, dev) : core::TensorView{},
      .d_weight = core::view(a.d_weight, w_shape, dev),
      .d_bias =
          a.d_bias != nullptr ? core::view(a.d_bias, {a.out_features}, dev) : core::TensorView{},
      .d_out = core::view(a.d_out, out_shape, dev),
  };
  if (a.weight.bf16 == nullptr) {
    v.in = core::view(a.in, in_shape, dev);
    v.weight = core::view(a.weight.f32, w_shape, dev);
    return k::linear_backward(lc.ctx, v);
  }
  v.in = core::view(lc.ws.bf16_in, in_shape, dev);
  v.d_out_bf16 = core::view(lc.ws.bf16_dout, out_shape, dev);
  k::convert(lc.ctx, {.out = v.in, .in = core::view(a.in, in_shape, dev)});
  k::convert(lc.ctx, {.out = v.d_out_bf16, .in = v.d_out});
  v.weight = core::view(a.weight.bf16, w_shape, dev);
  v.scratch = lc.ws.gemm_scratch;
  k::linear_backward(lc.ctx, v);
}

namespace {
k::HiddenDropoutViews dropout_args(const LayerContext& lc, float* out, const float* in,
                                   std::int64_t cols, std::int64_t layer, DropSite site) {
  const core::Shape rows{lc.local_rows(), cols};
  return {.out = view_of(lc, out, rows),
          .in = view_of(lc, in, rows),
          .first_row = lc.dropout.first_sample * lc.seq_len + lc.region.first_row(),
          .p = lc.dropout.hidden_p,
          .seed = lc.dropout.seed,
          .stream = drop_stream(lc.dropout.iteration, layer, site)};
}

// out = dropout(in) over this rank's rows. The mask of a row is keyed by its global token row
// (sample x T + position); under context parallelism the rows are chunk-major
// (context_parallel.h), so the rows go by runs that are contiguous in the global sequence.
void hidden_dropout_rows(const LayerContext& lc, float* out, const float* in, std::int64_t cols,
                         std::int64_t layer, DropSite site) {
  k::HiddenDropoutViews v = dropout_args(lc, out, in, cols, layer, site);
  if (!lc.context_parallel()) return k::hidden_dropout(lc.ctx, v);
  const int size = lc.cp->size(), rank = lc.cp->rank();
  const std::int64_t B = lc.batch, Tl = lc.seq_len, Tc = Tl / 2, T = lc.total_len();
  const std::int64_t first = lc.region.first_row(), end = first + lc.local_rows();
  for (std::int64_t r = first; r < end;) {
    const std::int64_t run = std::min(end, (r / Tc + 1) * Tc) - r;  // to the chunk's end
    const core::Shape rows{run, cols};
    const std::int64_t at = (r - first) * cols;
    v.out = view_of(lc, out + at, rows);
    v.in = view_of(lc, in + at, rows);
    v.first_row = (lc.dropout.first_sample + cp_row_sample(B, Tl, r)) * T +
                  cp_row_position(size, rank, B, Tl, r);
    k::hidden_dropout(lc.ctx, v);
    r += run;
  }
}
}  // namespace

void dropout_forward(const LayerContext& lc, float* x, std::int64_t cols, std::int64_t layer,
                     DropSite site) {
  if (lc.dropout.hidden_p <= 0.0f) return;
  hidden_dropout_rows(lc, x, x, cols, layer, site);
}

const float* dropout_backward(const LayerContext& lc, const float* d, std::int64_t cols,
                              std::int64_t layer, DropSite site) {
  if (lc.dropout.hidden_p <= 0.0f) return d;
  hidden_dropout_rows(lc, lc.ws.d_drop, d, cols, layer, site);
  return lc.ws.d_drop;
}

}  // namespace trident::model::layers
