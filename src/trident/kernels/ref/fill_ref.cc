// Reference fill and copy: plain loops, one thread.
#include "trident/kernels/fill.h"

namespace trident::kernels::ref {

void fill(const FillArgs& a) {
  for (std::int64_t i = 0; i < a.n; ++i) a.out[i] = a.value;
}

void copy(const CopyArgs& a) {
  for (std::int64_t i = 0; i < a.n; ++i) a.out[i] = a.in[i];
}

void copy_columns(const CopyColumnsArgs& a) {
  for (std::int64_t r = 0; r < a.rows; ++r) {
    for (std::int64_t c = 0; c < a.cols; ++c) {
      a.out[r * a.out_width + a.out_col + c] = a.in[r * a.in_width + a.in_col + c];
    }
  }
}

}  // namespace trident::kernels::ref
