// The training log's lines about --offload-optimizer: the placement at start-up, and per log
// interval the window, the I/O rates and how much of the streamed update waited for the disk.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trident/optim/offload.h"
#include "trident/train/train_config.h"
#include "trident/train/zero_optimizer.h"

namespace trident::train {

class OffloadReporter {
 public:
  // Logs where the optimizer state lives: the dense optimizer's, and with expert parallelism the
  // experts' (their own optimizer and files, `experts` non-null).
  OffloadReporter(const ZeroOptimizer& optimizer, const ZeroOptimizer* experts,
                  const TrainConfig& cfg);
  // Logs the interval's I/O (nvme) and adds offload_* fields to the metrics record (the experts':
  // offload_experts_*).
  void interval(nlohmann::json& record, std::int64_t iterations);

 private:
  struct Part {
    const ZeroOptimizer* opt;
    std::string label;  // "" or " (experts)", in the log lines
    std::string key;    // "offload_" or "offload_experts_", of the metrics fields
    optim::OffloadStats last{};
  };
  void start(const Part& p, const TrainConfig& cfg) const;
  void interval(Part& p, nlohmann::json& record, std::int64_t iterations) const;
  std::vector<Part> parts_;
};

}  // namespace trident::train
