// Reference hidden dropout: double, one thread.
#include "trident/kernels/dropout.h"
#include "trident/kernels/flash_attention.h"

namespace trident::kernels::ref {

void hidden_dropout(const HiddenDropoutArgs& a) {
  const double scale = 1.0 / (1.0 - static_cast<double>(a.p));
  for (std::int64_t r = 0; r < a.rows; ++r) {
    for (std::int64_t c = 0; c < a.cols; ++c) {
      const auto index = static_cast<std::uint64_t>((a.first_row + r) * a.cols + c);
      const bool keep = dropout_keep(a.seed, a.stream, index, a.p);
      const std::int64_t i = r * a.cols + c;
      a.out[i] = keep ? static_cast<float>(static_cast<double>(a.in[i]) * scale) : 0.0f;
    }
  }
}

}  // namespace trident::kernels::ref
