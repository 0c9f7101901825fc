// Data-parallel traffic of the optimizer's collectives, counted as the ring algorithm moves them:
// all-reduce 2 (dp-1)/dp x bytes, reduce-scatter and all-gather (dp-1)/dp x, per rank.
#pragma once

#include <cstdint>

#include "trident/comm/communicator.h"

namespace trident::optim {

struct CommCounters {
  double dp_bytes = 0;

  // Counts one FP32 collective over `elements` on a dp group of `dp` ranks.
  void account(comm::OpKind kind, std::int64_t elements, int dp) {
    if (dp == 1) return;
    const double share = static_cast<double>(dp - 1) / dp * static_cast<double>(elements) * 4.0;
    dp_bytes += kind == comm::OpKind::kAllReduce ? 2.0 * share : share;
  }
};

}  // namespace trident::optim
