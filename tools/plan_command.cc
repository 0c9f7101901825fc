// `trident plan`: memory per rank, time per iteration and (--search) the best layouts for a model
// on a cluster, from the same flags as `trident train`. See docs/plan.md.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "trident/comm/mpi_communicator.h"
#include "trident/comm/runtime.h"
#include "trident/core/error.h"
#include "trident/data/tokenizer.h"
#include "trident/plan/comm_calibration.h"
#include "trident/plan/plan.h"

namespace trident::tools {

namespace {

struct PlanOptions {
  std::string gpu = "A100-80GB";
  int num_gpus = 0, num_nodes = 0, gpus_per_node = 0;
  double intra_bw_gbs = 0, intra_latency_us = -1, inter_bw_gbs = 0, inter_latency_us = -1;
  double offload_disk_gbs = 0;
  double memory_gib = 0;
  bool calibrate = false, recalibrate = false, calibrate_comm = false;
  std::string calibration_file;
  int threads_per_rank = 0;
  bool search = false;
  int top = 5;
  std::string format = "text";
  double train_tokens = 0;
  bool ep_given = false;  // the search keeps --expert-model-parallel-size
  bool cp_given = false;  // and --context-parallel-size
};

int env_threads() {
  if (const char* e = std::getenv("OMP_NUM_THREADS"); e && *e) return std::max(1, std::atoi(e));
  return 0;
}

// The vocabulary, as `trident train` gets it from the tokenizer.
void set_vocab(train::TrainConfig& cfg) {
  const bool has_files = !cfg.vocab_file.empty() || !cfg.tokenizer_model.empty();
  if (cfg.tokenizer_type == "NullTokenizer" || has_files) {
    auto tok = data::make_tokenizer({.type = cfg.tokenizer_type,
                                     .vocab_file = cfg.vocab_file,
                                     .merge_file = cfg.merge_file,
                                     .model_file = cfg.tokenizer_model,
                                     .vocab_size = cfg.null_tokenizer_vocab_size});
    cfg.model.vocab_size = tok->vocab_size();
  } else {
    cfg.model.vocab_size =
        cfg.null_tokenizer_vocab_size > 0 ? cfg.null_tokenizer_vocab_size : 50257;  // GPT-2's BPE
  }
  cfg.resolve_loss_chunk_rows();
}

// `mpirun -np W trident plan --gpu cpu --calibrate-comm`: every rank times the collectives, rank 0
// adds them to this thread count's calibration and prints them.
void run_calibrate_comm(const PlanOptions& o, const std::string& path) {
  int argc = 0;
  char** argv = nullptr;
  comm::MpiRuntime mpi(argc, argv);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.threads_per_rank > 0 ? o.threads_per_rank
                      : env_threads() > 0    ? env_threads()
                                             : std::max(1, cores / mpi.world_size());
  TRIDENT_CHECK(mpi.world_size() >= 2,
                "--calibrate-comm times collectives between ranks: run it under mpirun with the "
                "job's rank count, e.g. mpirun -np 4 trident plan --gpu cpu --calibrate-comm");
  TRIDENT_CHECK(!o.calibrate,
                "--calibrate-comm and --calibrate: time the kernels first, in one "
                "process (trident plan --gpu cpu --calibrate), then the collectives "
                "under mpirun");
  auto world = comm::MpiCommunicator::world(mpi);
  plan::Calibration cal;
  // Every rank reads the cache, so that all of them stop together when it lacks this entry.
  const bool have = plan::load_calibration(path, threads, cal);
  TRIDENT_CHECK(have, "--calibrate-comm: no kernel calibration for ", threads,
                " thread(s) per rank in ", path,
                "; run trident plan --gpu cpu --calibrate "
                "--threads-per-rank ",
                threads, " first (one process)");
  if (world->rank() == 0) {
    std::cerr << "trident plan: timing trident's collectives over " << world->size()
              << " ranks...\n";
    // The collectives are timed by the wall clock: other jobs on the cores show up in them.
    double load = 0;
    if (getloadavg(&load, 1) == 1 && load > cores + 0.5) {
      std::cerr << "trident plan: warning: the machine is busy (load " << load << " on " << cores
                << " cores); the times will include waiting for a core. Calibrate on an idle "
                   "machine for a plan of a dedicated one\n";
    }
  }
  std::map<std::string, plan::CommCosts> measured = plan::calibrate_comm(*world);
  // How the ranks slow each other inside a step (sharing caches, memory, and the cores when they
  // outnumber them; waiting for each other at every collective).
  plan::calibrate_interference(*world, threads, cores, measured);
  if (world->rank() != 0) return;
  for (const auto& [key, c] : measured) cal.comm[key] = c;
  plan::save_calibration(path, cal);
  std::cout << "| ranks,group | bytes | all-reduce us | reduce-scatter us | all-gather us | "
               "p2p us |\n|---|---:|---:|---:|---:|---:|\n";
  for (const auto& [key, c] : measured) {
    for (std::size_t i = 0; i < c.bytes.size(); ++i) {
      std::cout << "| " << key << " | " << c.bytes[i] << " | " << c.all_reduce_s[i] * 1e6 << " | "
                << c.reduce_scatter_s[i] * 1e6 << " | " << c.all_gather_s[i] * 1e6 << " | "
                << c.p2p_s[i] * 1e6 << " |\n";
    }
  }
  std::cout << "\n| ranks,group | GEMM with all ranks computing / alone"
            << (static_cast<std::int64_t>(world->size()) * threads > cores
                    ? " / their share of a core"
                    : "")
            << " | wait per synchronising call us | + fraction of the compute before it |\n"
               "|---|---:|---:|---:|\n";
  for (const auto& [key, c] : measured) {
    std::cout << "| " << key << " | " << c.corun_gemm << " | " << c.sync_wait_s * 1e6 << " | "
              << c.sync_wait_fraction << " |\n";
  }
  std::cerr << "trident plan: collectives saved to " << path << "\n";
}

void run_plan(train::TrainConfig cfg, const PlanOptions& o) {
  TRIDENT_CHECK(o.format == "text" || o.format == "json", "--format: unknown format '", o.format,
                "' (use text or json)");
  plan::Cluster cl;
  const bool cpu = o.gpu == "cpu" || o.gpu == "CPU";
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (cpu) {
    cl.hw.name = "cpu";
    cl.hw.is_cpu = true;
    cl.hw.gpus_per_node = o.gpus_per_node > 0 ? o.gpus_per_node : 1 << 20;  // one machine
  } else {
    cl.hw = plan::find_hardware(o.gpu);
    if (o.gpus_per_node > 0) cl.hw.gpus_per_node = o.gpus_per_node;
  }
  TRIDENT_CHECK(o.num_gpus >= 0 && o.num_nodes >= 0, "--num-gpus and --num-nodes must be >= 0");
  cl.num_gpus = o.num_gpus > 0    ? o.num_gpus
                : o.num_nodes > 0 ? o.num_nodes * cl.hw.gpus_per_node
                                  : (cpu ? 1 : cl.hw.gpus_per_node);
  TRIDENT_CHECK(
      o.num_nodes == 0 || o.num_gpus == 0 || o.num_gpus == o.num_nodes * cl.hw.gpus_per_node,
      "--num-gpus ", o.num_gpus, " disagrees with --num-nodes ", o.num_nodes, " x ",
      cl.hw.gpus_per_node, " GPUs per node; give one of them");
  if (cpu) {
    const int threads = o.threads_per_rank > 0 ? o.threads_per_rank
                        : env_threads() > 0    ? env_threads()
                                               : std::max(1, cores / cl.num_gpus);
    cl.threads_per_rank = threads;
    const std::string path =
        o.calibration_file.empty() ? plan::default_calibration_path() : o.calibration_file;
    if (o.calibrate_comm) {
      run_calibrate_comm(o, path);
      return;
    }
    plan::Calibration cal;
    if (o.calibrate) {
      std::cerr << "trident plan: calibrating trident's kernels with " << threads
                << " thread(s) per rank...\n";
      // The grid once per thread count (kept in the cache), then this configuration's shapes.
      plan::Calibration cached;
      bool have = false;
      try {
        have = !o.recalibrate && plan::load_calibration(path, threads, cached);
      } catch (const core::DataError& e) {
        // A damaged cache is what --calibrate fixes: measure this thread count afresh.
        std::cerr << "trident plan: warning: " << e.what() << "; measuring it afresh\n";
      }
      plan::KernelShapes shapes;
      if (!o.search) {
        train::TrainConfig shaped = cfg;
        set_vocab(shaped);
        if (shaped.data_path.empty() && shaped.train_data_path.empty())
          shaped.data_path = {"(plan)"};
        shaped.finalize(cl.num_gpus);
        shapes = plan::kernel_shapes(shaped, cl);
      }
      cal = plan::calibrate(threads, shapes, have ? &cached : nullptr);

      plan::save_calibration(path, cal);
      std::cerr << "trident plan: calibration saved to " << path << " (best FP32 GEMM "
                << cal.peak_tflops * 1e3 << " GFLOP/s, copy " << cal.memory_bw / 1e9 << " GB/s)\n";
    } else {
      TRIDENT_CHECK(plan::load_calibration(path, threads, cal), "--gpu cpu: no calibration for ",
                    threads, " thread(s) per rank in ", path,
                    "; run trident plan --gpu cpu --calibrate (with the same thread count)");
    }
    cl.calibration = cal;
    cl.hw.peak_tflops = cal.peak_tflops;
    cl.hw.memory_bw = cal.memory_bw;
    cl.hw.intra_bw = cal.memory_bw / 2;  // shared-memory MPI copies in and out
    cl.hw.intra_latency = 10e-6;
    cl.hw.inter_bw = cl.hw.intra_bw;
    cl.hw.inter_latency = cl.hw.intra_latency;
    const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
    cl.hw.memory_bytes = pages * static_cast<double>(sysconf(_SC_PAGESIZE));
  }
  if (o.intra_bw_gbs > 0) cl.hw.intra_bw = o.intra_bw_gbs * 1e9;
  if (o.offload_disk_gbs > 0) cl.hw.offload_disk_bw = o.offload_disk_gbs * 1e9;
  if (o.inter_bw_gbs > 0) cl.hw.inter_bw = o.inter_bw_gbs * 1e9;
  if (o.intra_latency_us >= 0) cl.hw.intra_latency = o.intra_latency_us * 1e-6;
  if (o.inter_latency_us >= 0) cl.hw.inter_latency = o.inter_latency_us * 1e-6;
  if (o.memory_gib > 0) cl.hw.memory_bytes = o.memory_gib * 1024.0 * 1024.0 * 1024.0;

  set_vocab(cfg);
  if (cfg.data_path.empty() && cfg.train_data_path.empty()) cfg.data_path = {"(plan)"};
  cfg.finalize(cl.num_gpus);
  cfg.model.validate();

  if (o.search) {
    // --expert-model-parallel-size (or Megatron-DeepSpeed's --moe-expert-parallel-size) given:
    // the search keeps it; otherwise it tries every ep the model and dp allow.
    // --context-parallel-size given (also 1: no context parallelism): kept the same way.
    const plan::SearchConstraints fixed{
        .expert_model_parallel_size = o.ep_given ? cfg.expert_model_parallel_size : 0,
        .context_parallel_size = o.cp_given ? cfg.context_parallel_size : 0};
    const plan::SearchResult r =
        plan::search_layouts(cfg, cl, static_cast<std::size_t>(o.top), fixed);
    if (o.format == "json") {
      std::cout << plan::search_json(cl, r, static_cast<std::size_t>(o.top)).dump(1) << "\n";
    } else {
      std::cout << plan::format_search(cl, r, static_cast<std::size_t>(o.top));
    }
    return;
  }
  const plan::Plan p = plan::make_plan(cfg, cl);
  if (o.format == "json") {
    std::cout << plan::plan_json(cfg, cl, p, o.train_tokens).dump(1) << "\n";
  } else {
    std::cout << plan::format_plan(cfg, cl, p, o.train_tokens);
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto cfg = std::make_shared<train::TrainConfig>();
  auto opt = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Predict memory per rank and time per iteration, or search layouts (docs/plan.md)");
  train::add_train_options(*sub, *cfg);
  sub->add_option("--gpu", opt->gpu,
                  "Accelerator: A100-40GB, A100-80GB, H100-SXM, H200, B200, or cpu (this machine)");
  sub->add_option("--num-gpus", opt->num_gpus, "Ranks in the job (default: one node)");
  sub->add_option("--num-nodes", opt->num_nodes, "Nodes (x --gpus-per-node ranks)");
  sub->add_option("--gpus-per-node", opt->gpus_per_node, "GPUs per node (default 8)");
  sub->add_option("--intra-node-bandwidth", opt->intra_bw_gbs,
                  "GB/s per GPU and direction inside a node (default: NVLink of --gpu)");
  sub->add_option("--intra-node-latency", opt->intra_latency_us, "Microseconds per message step");
  sub->add_option("--inter-node-bandwidth", opt->inter_bw_gbs,
                  "GB/s per GPU and direction between nodes (default: the DGX InfiniBand)");
  sub->add_option("--inter-node-latency", opt->inter_latency_us, "Microseconds per message step");
  sub->add_option("--offload-disk-bandwidth", opt->offload_disk_gbs,
                  "--offload-optimizer nvme: GB/s of the offload disk, reads and writes together "
                  "(default 2; measure with bench/offload/trident_disk_bandwidth)");
  sub->add_option("--memory-gib", opt->memory_gib, "Memory per GPU (default: the datasheet's)");
  sub->add_flag("--calibrate", opt->calibrate,
                "--gpu cpu: time trident's kernels on this machine and cache the result");
  sub->add_flag("--calibrate-comm", opt->calibrate_comm,
                "--gpu cpu, under mpirun -np N: time trident's collectives between N ranks and "
                "add them to the cache (after --calibrate)");
  sub->add_option(
      "--calibration-file", opt->calibration_file,
      "Calibration cache (default $TRIDENT_PLAN_CACHE or ~/.cache/trident/plan-cpu.json)");
  sub->add_option(
      "--threads-per-rank", opt->threads_per_rank,
      "--gpu cpu: OpenMP threads per rank (default $OMP_NUM_THREADS, else cores/ranks)");
  sub->add_flag("--search", opt->search, "Rank the layouts that fit by predicted throughput");
  sub->add_option("--top", opt->top, "Layouts --search prints (default 5)");
  sub->add_option("--format", opt->format, "text or json");
  // --train-tokens (registered by add_train_options, Megatron-DeepSpeed's flag): also estimate the
  // days and GPU-hours to train this many tokens.
  sub->callback([cfg, opt, sub] {
    opt->train_tokens = static_cast<double>(cfg->train_tokens);
    // Given as --expert-model-parallel-size (also 1: no expert parallelism), or any size above 1
    // however it was set (Megatron-DeepSpeed's --moe-expert-parallel-size, the DeepSpeed JSON).
    const CLI::Option* ep = sub->get_option_no_throw("--expert-model-parallel-size");
    opt->ep_given = (ep != nullptr && ep->count() > 0) || cfg->expert_model_parallel_size > 1;
    const CLI::Option* cp = sub->get_option_no_throw("--context-parallel-size");
    opt->cp_given = (cp != nullptr && cp->count() > 0) || cfg->context_parallel_size > 1;
    run_plan(*cfg, *opt);
  });
}

}  // namespace trident::tools
