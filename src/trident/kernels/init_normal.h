// Parameter initialization from a normal distribution keyed by GLOBAL element indices, so every
// parallel layout (tp split, ZeRO shard) that holds element g of a parameter draws the same value:
//   out[i - begin] = stddev * philox_normal(seed, stream, g(i))   for local elements i in [begin,
//   end) g(i) = base + (i / local_cols) * global_cols + col_offset + i % local_cols
// which covers a replicated parameter (base 0, local_cols = global_cols), a split along dim 0
// (base = tp_rank * local numel) and a split along dim 1 (col_offset = tp_rank * local_cols).
// Callers use the typed view (InitNormalViews); InitNormalArgs is the backend contract.
#pragma once

#include <cstdint>

#include "trident/core/exec_context.h"
#include "trident/core/tensor.h"

namespace trident::kernels {

struct InitNormalArgs {
  float* out = nullptr;                // (end - begin) written (=)
  std::int64_t begin = 0, end = 0;     // local element range of the parameter
  std::uint64_t seed = 0, stream = 0;  // stream: the parameter (e.g. a hash of its name)
  double stddev = 1.0;
  std::int64_t base = 0, local_cols = 1, global_cols = 1, col_offset = 0;
};

// init_normal over a typed view: out an f32 view of any shape on ctx.device holding the local
// elements [begin, begin + out's elements) of the parameter. OpenMP over elements; every
// element's value is independent of the thread count.
struct InitNormalViews {
  core::TensorView out{};              // f32, written (=)
  std::int64_t begin = 0;              // local index of out's first element
  std::uint64_t seed = 0, stream = 0;  // stream: the parameter (e.g. a hash of its name)
  double stddev = 1.0;
  std::int64_t base = 0, local_cols = 1, global_cols = 1, col_offset = 0;
};
void init_normal(const core::ExecContext& ctx, const InitNormalViews& v);

namespace ref {
void init_normal(const InitNormalArgs& args);
}  // namespace ref

}  // namespace trident::kernels
