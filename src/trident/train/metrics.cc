#include "trident/train/metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/exec_context.h"
#include "trident/core/log.h"
#include "trident/core/profile.h"
#include "trident/core/timer.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/memory.h"

namespace trident::train {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) {
    throw core::Error(core::str("--metrics-jsonl: cannot open ", path, ": ", std::strerror(errno)));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!file_) return;
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw core::Error(
        core::str("--metrics-jsonl: writing ", path_, " failed: ", std::strerror(errno)));
  }
}

namespace {

template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), f, a...);
  return buf;
}

}  // namespace

std::string moe_log(const MoeRouting& m) {
  const double calls = static_cast<double>(std::max<std::int64_t>(1, m.calls));
  double max = 0, sum = 0;
  for (double t : m.tokens_per_expert) {
    max = std::max(max, t);
    sum += t;
  }
  const double mean =
      m.tokens_per_expert.empty() ? 0.0 : sum / static_cast<double>(m.tokens_per_expert.size());
  std::string s;
  s += fmt(" load_balancing_loss: %.6E |", m.aux_loss / calls);
  s += fmt(" z_loss: %.6E |", m.z_loss / calls);
  s += fmt(" dropped tokens: %.2f%% |",
           m.choices > 0 ? 100.0 * static_cast<double>(m.dropped) / static_cast<double>(m.choices)
                         : 0.0);
  s += fmt(" expert load max/mean: %.2f |", mean > 0 ? max / mean : 0.0);
  return s;
}

std::string iteration_log_line(const IterationLog& l) {
  std::string s;
  const auto ll = [](std::int64_t x) { return static_cast<long long>(x); };
  if (l.megatron_deepspeed) {
    s += fmt(" iteration %8lld/%8lld |", ll(l.iteration), ll(l.train_iters));
    s += fmt(" consumed samples: %12lld |", ll(l.consumed_samples));
    s += fmt(" consumed tokens: %12lld |", ll(l.consumed_tokens));
    s += fmt(" elapsed time per iteration (s): %.2f |", l.iter_ms / 1e3);
    s += fmt(" learning rate: %.3E |", l.lr);
    s += fmt(" global batch size: %5lld |", ll(l.global_batch_size));
    if (l.lm_loss > 0) s += fmt(" lm loss: %.6E |", l.lm_loss);
    s += fmt(" loss scale: %.1f |", l.loss_scale);
    if (l.grad_norm) s += fmt(" grad norm: %.3f |", *l.grad_norm);
    s += fmt(" number of skipped iterations: %3lld |", ll(l.skipped));
    s += fmt(" number of nan iterations: %3lld |", ll(l.nan));
    s += fmt(" samples per second: %.3f |", l.samples_per_s);
    s += fmt(" TFLOPs: %.2f |", l.tflops_per_rank);
    return s;
  }
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &tm);
  s += fmt(" [%s.%06lld]", date, static_cast<long long>(us));
  s += fmt(" iteration %8lld/%8lld |", ll(l.iteration), ll(l.train_iters));
  s += fmt(" consumed samples: %12lld |", ll(l.consumed_samples));
  s += fmt(" elapsed time per iteration (ms): %.1f |", l.iter_ms);
  if (l.log_throughput) s += fmt(" throughput per GPU (TFLOP/s/GPU): %.1f |", l.tflops_per_rank);
  s += fmt(" learning rate: %.6E |", l.lr);
  s += fmt(" global batch size: %5lld |", ll(l.global_batch_size));
  if (l.lm_loss >= 0) s += fmt(" lm loss: %.6E |", l.lm_loss);
  s += fmt(" loss scale: %.1f |", l.loss_scale);
  if (l.grad_norm) s += fmt(" grad norm: %.3f |", *l.grad_norm);
  s += fmt(" number of skipped iterations: %3lld |", ll(l.skipped));
  s += fmt(" number of nan iterations: %3lld |", ll(l.nan));
  if (l.moe && l.moe->calls > 0) s += moe_log(*l.moe);
  return s;
}

double measure_peak_tflops() {
  const std::int64_t n = 1024;
  std::vector<float> a(static_cast<std::size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
  const core::ExecContext ctx;
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    core::Timer t;
    kernels::gemm(ctx, {.m = n,
                        .n = n,
                        .k = n,
                        .a = a.data(),
                        .lda = n,
                        .b = b.data(),
                        .ldb = n,
                        .c = c.data(),
                        .ldc = n});
    if (rep > 0) best = std::min(best, t.elapsed_s());
  }
  return 2.0 * static_cast<double>(n * n * n) / best / 1e12;
}

// CPU time (user + system, every thread) this process has used, in milliseconds.
double process_cpu_ms() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return (static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
          static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3);
}

// Each rank's peak resident memory (getrusage), logged by rank 0 for comparison with the memory
// report above and `trident plan`.
void log_peak_rss(comm::Communicator& world) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double mine = static_cast<double>(usage.ru_maxrss) * 1024.0;
  std::vector<double> all(static_cast<std::size_t>(world.size()));
  world.all_gather(&mine, all.data(), 1, comm::Datatype::kF64);
  std::string text;
  for (double b : all) text += core::str(text.empty() ? "" : " ", static_cast<std::int64_t>(b));
  log::info("memory: peak RSS per rank [", text, "] B");
}

// On a device: each rank's peak device memory, the arenas and buffers (parameters, gradients,
// optimizer state, activation slots, staging) and the kernels' stream pool, logged by rank 0.
void log_peak_device_memory(comm::Communicator& world, const core::ExecContext& ctx) {
  if (ctx.device.kind != core::DeviceKind::kCuda) return;
  const double mine[2] = {static_cast<double>(kernels::peak_device_bytes(ctx)),
                          static_cast<double>(kernels::peak_device_pool_bytes(ctx))};
  std::vector<double> all(static_cast<std::size_t>(2 * world.size()));
  world.all_gather(mine, all.data(), 2, comm::Datatype::kF64);
  std::string arenas, pool;
  for (std::size_t r = 0; r < all.size() / 2; ++r) {
    arenas += core::str(r == 0 ? "" : " ", static_cast<std::int64_t>(all[2 * r]));
    pool += core::str(r == 0 ? "" : " ", static_cast<std::int64_t>(all[2 * r + 1]));
  }
  log::info("memory: peak device memory per rank [", arenas, "] B in arenas and buffers + [", pool,
            "] B in the kernels' stream pool (each its own high-water)");
}

TrainingLog::TrainingLog(const Sources& s, double peak_tflops,
                         parallel::PipelineScheduleKind schedule)
    : src_(s), T_(s.cfg.model.seq_length), peak_tflops_(peak_tflops), schedule_kind_(schedule) {
  metrics_.emplace(src_.world.rank() == 0 ? src_.cfg.metrics_jsonl : std::string());
  // Megatron's TensorBoard scalars (training.py: training_log, evaluate_and_print_results).
  tb_.emplace(src_.world.rank() == 0 ? src_.cfg.tensorboard_dir : std::string());
  if (tb_->enabled()) log::info("tensorboard: writing ", tb_->path());
}

void TrainingLog::log_tensorboard(const IterationResult& r) {
  const std::int64_t it = src_.progress.iteration;
  auto both = [&](const char* name, double v) {
    tb_->add_scalar(name, v, it);
    tb_->add_scalar(std::string(name) + " vs samples", v, src_.progress.consumed);
  };
  if (!src_.cfg.no_log_learning_rate_to_tensorboard) both("learning-rate", r.lr);
  both("batch-size", static_cast<double>(r.batch.running_global_batch_size));
  if (std::isfinite(r.lm_loss) && !r.step.skipped) both("lm loss", r.lm_loss);
  if (!src_.cfg.no_log_loss_scale_to_tensorboard) both("loss-scale", r.used_scale);
  if (src_.cfg.log_world_size_to_tensorboard) both("world-size", src_.world.size());
  if (src_.cfg.optimizer.clip_grad > 0) both("grad-norm", r.step.grad_norm);
  if (src_.cfg.log_memory_to_tensorboard) {
    tb_->add_scalar("mem-allocated-bytes",
                    static_cast<double>(src_.mem.param_bytes + src_.mem.grad_bytes +
                                        src_.mem.optimizer_bytes + src_.mem.staging_bytes),
                    it);
  }
}

// The log line (Megatron's), the metrics record and the pipeline's idle fractions of the
// interval that `r` ends; then a new interval.
void TrainingLog::log_interval(const IterationResult& r) {
  const IntervalStats& s = interval_;
  const double iters = static_cast<double>(s.iters);
  const double avg_loss = s.advanced > 0 ? s.loss / static_cast<double>(s.advanced) : 0.0;
  const double avg_ms = s.ms / iters;
  const double tokens_per_s = s.tokens / (s.ms / 1e3);
  const double tflops = s.flops / (s.ms / 1e3) / 1e12 / src_.world.size();
  // Pipeline bubble: the share of the schedule this stage spent waiting, per stage.
  std::vector<double> idle(static_cast<std::size_t>(src_.par.layout().pp_size), 0.0);
  const double my_idle = s.pipe_ms > 0 ? 1.0 - s.busy_ms / s.pipe_ms : 0.0;
  src_.par.pp_host().all_gather(&my_idle, idle.data(), 1, comm::Datatype::kF64);
  const std::int64_t it = src_.progress.iteration;
  if (src_.cfg.log_timers_to_tensorboard) {
    tb_->add_scalar("iteration-time", avg_ms / 1e3, it);
    if (src_.cfg.log_throughput) tb_->add_scalar("throughput", tflops, it);
  }
  log::info(iteration_log_line(
      {.megatron_deepspeed = src_.cfg.megatron_deepspeed_log,
       .log_throughput = src_.cfg.log_throughput,
       .iteration = it,
       .train_iters = src_.cfg.train_iters,
       .consumed_samples = src_.progress.consumed,
       .consumed_tokens = src_.progress.consumed * T_,
       .iter_ms = avg_ms,
       .tflops_per_rank = tflops,
       .lr = r.lr,
       .global_batch_size = r.batch.running_global_batch_size,
       .lm_loss = avg_loss,
       .loss_scale = r.used_scale,
       .grad_norm = src_.cfg.optimizer.clip_grad > 0 ? std::optional<double>(r.step.grad_norm)
                                                     : std::nullopt,
       .skipped = s.skipped,
       .nan = s.nan,
       .samples_per_s = s.tokens / static_cast<double>(T_) / (s.ms / 1e3),
       .seq_length = T_,
       .moe = s.moe.calls > 0 ? std::optional<MoeRouting>(s.moe) : std::nullopt}));
  nlohmann::json record = {{"iteration", it},
                           {"consumed_samples", src_.progress.consumed},
                           {"lm_loss", s.loss_all / iters},
                           {"lr", r.lr},
                           {"grad_norm", r.step.grad_norm},
                           {"iter_ms", avg_ms},
                           {"iter_cpu_ms", (process_cpu_ms() - s.cpu0) / iters},
                           {"tokens_per_s", tokens_per_s},
                           {"tflops", tflops},
                           {"mfu", tflops / peak_tflops_},
                           {"skipped_iterations", src_.progress.skipped_iters},
                           {"nan_iterations", src_.progress.nan_iters},
                           {"global_batch_size", r.batch.running_global_batch_size},
                           {"loss_scale", r.used_scale}};
  if (s.moe.calls > 0) {
    const double calls = static_cast<double>(s.moe.calls);
    record["moe_load_balancing_loss"] = s.moe.aux_loss / calls;
    record["moe_z_loss"] = s.moe.z_loss / calls;
    record["moe_dropped_fraction"] = static_cast<double>(s.moe.dropped) /
                                     static_cast<double>(std::max<std::int64_t>(1, s.moe.choices));
    record["moe_tokens_per_expert"] = s.moe.tokens_per_expert;
  }
  // On a device: rank 0's peak device memory so far, arenas and buffers plus the stream pool.
  if (src_.ctx.device.kind == core::DeviceKind::kCuda) {
    record["peak_device_bytes"] =
        kernels::peak_device_bytes(src_.ctx) + kernels::peak_device_pool_bytes(src_.ctx);
  }
  // Data-parallel traffic this rank sent per iteration (ring-algorithm bytes).
  record["dp_comm_bytes_per_iteration"] = src_.optimizer.comm().dp_bytes / iters;
  src_.optimizer.reset_comm();
  if (src_.expert_optimizer != nullptr) {  // the experts' reductions over the expert-dp group
    record["expert_dp_comm_bytes_per_iteration"] = src_.expert_optimizer->comm().dp_bytes / iters;
    src_.expert_optimizer->reset_comm();
  }
  src_.offload.interval(record, s.iters);
  if (src_.par.layout().tp_size > 1) {
    record["tp_comm_bytes_per_iteration"] = src_.tp_traffic.bytes / iters;
    record["tp_all_reduces_per_iteration"] =
        static_cast<double>(src_.tp_traffic.all_reduces) / iters;
    record["tp_all_gathers_per_iteration"] =
        static_cast<double>(src_.tp_traffic.all_gathers) / iters;
    record["tp_reduce_scatters_per_iteration"] =
        static_cast<double>(src_.tp_traffic.reduce_scatters) / iters;
    src_.tp_traffic = {};
  }
  if (src_.par.layout().pp_size > 1) {
    record["pipeline_idle_fraction"] = idle;
    std::string text;
    for (double f : idle) text += core::str(text.empty() ? "" : " ", f);
    log::info("pipeline: idle fraction per stage [", text, "] (",
              pipeline_schedule_name(schedule_kind_), ", ", src_.micro_batches, " micro-batches)");
  }
  metrics_->write(record);
  interval_ = IntervalStats{};
}

// --profile: rank 0's kernels and collectives over iterations profile_step_start + 1 ..
// profile_step_end (Megatron's window), timed by core/profile.h.
void TrainingLog::before_iteration() {
  if (!src_.cfg.profile || profiling_ || src_.progress.iteration != src_.cfg.profile_step_start)
    return;
  if (src_.world.rank() != 0) return;
  core::profile::set_enabled(true);
  // On a device each op's time is its kernels': CUDA events around each scope, read at the end.
  core::profile::set_device_timer(kernels::make_device_timer(src_.ctx));
  profiling_ = true;
}

void TrainingLog::after_iteration(const IterationResult& r) {
  if (profiling_) {
    ++profile_iters_;
    profile_ms_ += r.ms;
    if (src_.progress.iteration >= src_.cfg.profile_step_end) finish_profile();
  }
  const std::int64_t it = src_.progress.iteration;
  interval_.add(r, src_.cfg.model.flops_per_iteration(r.tokens));
  if (tb_->enabled() && it % src_.cfg.tensorboard_log_interval == 0) log_tensorboard(r);
  if (it % src_.cfg.log_interval == 0 || it == src_.cfg.train_iters) log_interval(r);
}

// The table in the log and one record in --metrics-jsonl (ms per iteration by kind, and what no
// kernel or collective accounts for).
void TrainingLog::finish_profile() {
  if (!profiling_) return;
  profiling_ = false;
  core::profile::set_enabled(false);
  core::profile::set_device_timer(nullptr);  // times the window's scopes first
  const std::vector<core::profile::Entry> entries = core::profile::entries();
  const double iters = static_cast<double>(std::max<std::int64_t>(profile_iters_, 1));
  const double iter_ms = profile_ms_ / iters;
  const std::int64_t first = src_.progress.iteration - profile_iters_ + 1;
  log::info("profile: rank 0, iterations ", first, "-", src_.progress.iteration, ", ", iter_ms,
            " ms per iteration (trident's timers, exclusive times):\n",
            core::profile::format_table(entries, iters, iter_ms / 1e3, 40));
  nlohmann::json kinds = nlohmann::json::object();
  double tracked = 0;
  for (const core::profile::Entry& k : core::profile::by_kind(entries)) {
    kinds[k.name] = k.seconds * 1e3 / iters;
    tracked += k.seconds * 1e3 / iters;
  }
  kinds["outside"] = iter_ms - tracked;
  metrics_->write({{"profile",
                    {{"first_iteration", first},
                     {"last_iteration", src_.progress.iteration},
                     {"iter_ms", iter_ms},
                     {"ms_per_iteration", kinds}}}});
  core::profile::reset();
}
}  // namespace trident::train
