#include "trident/comm/launch.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "trident/core/log.h"

namespace trident::comm {

namespace {
constexpr int kHostBytes = 64;
}

HostPlacement host_placement(Communicator& world) {
  HostPlacement p;
  p.host = log::short_hostname();
  char mine[kHostBytes] = {};
  std::snprintf(mine, sizeof(mine), "%s", p.host.c_str());
  std::vector<char> all(static_cast<std::size_t>(kHostBytes * world.size()));
  world.all_gather(mine, all.data(), kHostBytes, Datatype::kU8);
  p.ranks_on_host = 0;
  for (int r = 0; r < world.size(); ++r) {
    if (std::strncmp(all.data() + static_cast<std::size_t>(r) * kHostBytes, mine, kHostBytes) ==
        0) {
      if (r < world.rank()) ++p.local_rank;
      ++p.ranks_on_host;
    }
  }
  p.host_cores = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  cpu_set_t set;
  CPU_ZERO(&set);
  p.allowed_cpus =
      sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : p.host_cores;
  return p;
}

int requested_threads() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v) return 0;
  const int n = std::atoi(v);  // "4,2" (nested levels): the first level
  return n > 0 ? n : 0;
}

ThreadPlan plan_threads(const HostPlacement& p, int requested) {
  ThreadPlan plan;
  const int cores = p.host_cores;
  if (requested > 0) {
    plan.threads = requested;
  } else {
    plan.threads = std::max(1, std::min(cores / std::max(1, p.ranks_on_host), p.allowed_cpus));
  }
  const int total = plan.threads * p.ranks_on_host;
  plan.text = core::str(
      "host ", p.host, ": ", p.ranks_on_host, " rank", p.ranks_on_host == 1 ? "" : "s", " x ",
      plan.threads, " OpenMP thread", plan.threads == 1 ? "" : "s", " = ", total, " threads on ",
      cores, " cores (this rank: local rank ", p.local_rank, ", may run on ", p.allowed_cpus,
      " CPUs; ", requested > 0 ? "OMP_NUM_THREADS" : "planned: cores / ranks", ")");
  if (plan.threads > 1 && (total > cores || plan.threads > p.allowed_cpus)) {
    const int fit = std::max(1, std::min(cores / std::max(1, p.ranks_on_host), p.allowed_cpus));
    TRIDENT_CHECK(false, "CPU threads oversubscribed: ", plan.text, ". Set OMP_NUM_THREADS=", fit,
                  " (or leave it unset and trident plans it), or "
                  "start fewer ranks per host");
  }
  plan.oversubscribed = total > cores;
  return plan;
}

}  // namespace trident::comm
