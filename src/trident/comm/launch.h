// Launch hygiene: where each rank runs (host, local rank, ranks on the host, cores) and the thread
// plan (OpenMP threads per rank) that fits the host's cores. MPI (or Slurm through PMIx) gives the
// world rank; the host comes from gethostname(), so ranks of one host are found by name.
#pragma once

#include <string>

#include "trident/comm/communicator.h"

namespace trident::comm {

struct HostPlacement {
  std::string host;       // short host name
  int local_rank = 0;     // this rank's position among the ranks of its host (by world rank)
  int ranks_on_host = 1;  // ranks of the job on this host
  int host_cores = 1;     // online CPUs of the host
  int allowed_cpus = 1;   // CPUs this process may run on (its affinity mask: srun --cpu-bind)
};

// Collective over `world` (an all-gather of host names).
HostPlacement host_placement(Communicator& world);

struct ThreadPlan {
  int threads = 1;   // OpenMP threads per rank
  std::string text;  // "host h1: 4 ranks x 1 OpenMP thread = 4 threads on 2 cores (...)"
  bool oversubscribed = false;
};

// The OpenMP threads per rank. `requested` > 0 (OMP_NUM_THREADS): used as given, but more
// threads on the host than cores is an InvalidArgument that prints the plan and the fix.
// `requested` <= 0: the host's cores (or this rank's CPUs, if fewer) split over its ranks, at
// least 1. One thread per rank with more ranks than cores is allowed (plan.oversubscribed) and
// only worth a warning: the ranks share cores.
ThreadPlan plan_threads(const HostPlacement& p, int requested);

// OMP_NUM_THREADS as a number (its first entry), or 0 when unset or not a positive number.
int requested_threads();

}  // namespace trident::comm
