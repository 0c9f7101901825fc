// The training log's lines about --offload-optimizer: the placement at start-up, and per log
// interval the window, the I/O rates and how much of the streamed update waited for the disk.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "trident/optim/offload.h"
#include "trident/train/train_config.h"
#include "trident/train/zero_optimizer.h"

namespace trident::train {

class OffloadReporter {
 public:
  // Logs where the optimizer state lives.
  OffloadReporter(const ZeroOptimizer& optimizer, const TrainConfig& cfg);
  // Logs the interval's I/O (nvme) and adds offload_* fields to the metrics record.
  void interval(nlohmann::json& record, std::int64_t iterations);

 private:
  const ZeroOptimizer& opt_;
  optim::OffloadStats last_;
};

}  // namespace trident::train
