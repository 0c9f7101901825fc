#include "trident/train/offload_report.h"

#include "trident/core/log.h"

namespace trident::train {

namespace {
double mib(double bytes) { return bytes / (1024.0 * 1024.0); }
}  // namespace

OffloadReporter::OffloadReporter(const ZeroOptimizer& optimizer, const ZeroOptimizer* experts,
                                 const TrainConfig& cfg) {
  parts_.push_back({&optimizer, "", "offload_"});
  if (experts != nullptr) parts_.push_back({experts, " (experts)", "offload_experts_"});
  for (const Part& p : parts_) start(p, cfg);
}

void OffloadReporter::start(const Part& p, const TrainConfig& cfg) const {
  const ZeroOptimizer& opt = *p.opt;
  const std::string state = core::str(p.label.empty() ? "" : "the experts' ", "optimizer state (",
                                      optim::optimizer_name(cfg.optimizer.kind), ")");
  if (opt.state_on_host()) {
    log::info(
        "offload", p.label, ": --offload-optimizer ",
        optim::offload_device_name(cfg.offload.device), ": the ", state, " is in ",
        cfg.offload.device == optim::OffloadDevice::kCpu ? "pinned host memory" : "files (below)",
        " and the GPU's weights are updated on the host (ZeRO-Offload): each step the "
        "gradient and weight shards come down and the weights go back up, in chunks");
  } else if (cfg.offload.device == optim::OffloadDevice::kCpu && p.label.empty()) {
    log::info(
        "offload: --offload-optimizer cpu: the optimizer state is in host memory, where the "
        "CPU backend keeps it already (no copies)");
  }
  const optim::OffloadStore* o = opt.offload();
  if (o == nullptr) return;
  const std::string what = opt.params_offloaded()
                               ? (opt.state_offloaded() ? "weight shard and " + state
                                                        : "weight shard (--offload-params nvme)")
                               : state;
  log::info("offload", p.label, ": ", what, " of ", o->size(), " elements in ", o->paths().size(),
            " files under ", cfg.offload.path, " (", mib(static_cast<double>(o->file_bytes())),
            " MiB on disk); window ", mib(static_cast<double>(o->window_bytes())), " MiB = 3 x ",
            o->paths().size(), " buffers of ", o->chunk_elements(), " elements; I/O ",
            optim::offload_io_name(cfg.offload.io),
            cfg.offload.direct ? ", O_DIRECT" : ", buffered");
  if (opt.params_offloaded()) {
    log::info("offload", p.label, ": weights read ahead of each layer's all-gather through ",
              mib(static_cast<double>(opt.param_fetch_bytes())), " MiB of buffers (",
              optim::Zero3ParamGatherer::kFetchBuffers,
              " x the largest layer piece), following "
              "the last iteration's gather order");
  }
}

void OffloadReporter::interval(nlohmann::json& record, std::int64_t iterations) {
  for (Part& p : parts_) interval(p, record, iterations);
}

void OffloadReporter::interval(Part& p, nlohmann::json& record, std::int64_t iterations) const {
  const ZeroOptimizer& opt = *p.opt;
  optim::OffloadStats& last = p.last;
  const std::string& k = p.key;
  const optim::OffloadStore* o = opt.offload();
  if (o == nullptr || iterations <= 0) return;
  const optim::OffloadStats& s = o->stats();
  const double wall = s.wall_s - last.wall_s, wait = s.wait_s - last.wait_s;
  const double rd = static_cast<double>(s.bytes_read - last.bytes_read);
  const double wr = static_cast<double>(s.bytes_written - last.bytes_written);
  const double it = static_cast<double>(iterations);
  const double read_mibs = wall > 0 ? mib(rd) / wall : 0,
               write_mibs = wall > 0 ? mib(wr) / wall : 0;
  log::info("offload", p.label, ": window ", mib(static_cast<double>(o->window_bytes())),
            " MiB; update ", 1e3 * wall / it, " ms/iteration streaming ", mib(rd / it),
            " MiB in + ", mib(wr / it), " MiB out (", read_mibs, " + ", write_mibs,
            " MiB/s), waiting for I/O ", 1e3 * wait / it, " ms/iteration");
  record[k + "update_ms"] = 1e3 * wall / it;
  record[k + "io_wait_ms"] = 1e3 * wait / it;
  record[k + "read_mib_per_s"] = read_mibs;
  record[k + "write_mib_per_s"] = write_mibs;
  record[k + "window_bytes"] = o->window_bytes();
  if (opt.params_offloaded()) {
    const double fetched = static_cast<double>(s.fetch_bytes - last.fetch_bytes);
    const double fwait = s.fetch_wait_s - last.fetch_wait_s;
    log::info("offload", p.label, ": weights read ahead of the gathers ", mib(fetched / it),
              " MiB/iteration, waiting for those reads ", 1e3 * fwait / it, " ms/iteration");
    record[k + "param_read_mib"] = mib(fetched / it);
    record[k + "param_wait_ms"] = 1e3 * fwait / it;
  }
  last = s;
}

}  // namespace trident::train
