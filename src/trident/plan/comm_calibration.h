// `--gpu cpu` collectives: `mpirun -np W trident plan --gpu cpu --calibrate-comm` times trident's
// own collectives (the Communicator trident train uses, with its polling wait) on this machine,
// for every group size n >= 2 that divides W, the W ranks split into W/n groups of consecutive
// ranks that communicate at the same time (as the TP groups of a layout do). The time model
// (time_model.cc) then prices a layout's collectives from these times instead of from the copy
// bandwidth: Open MPI's non-blocking collectives, which trident calls so that a dead rank is
// detected, run well below a memory copy, and ranks that share cores wait for each other.
#pragma once

#include <map>
#include <string>

#include "trident/comm/communicator.h"
#include "trident/plan/calibration.h"

namespace trident::plan {

// Message sizes timed: 4 KiB to 16 MiB in steps of 4x.
std::vector<std::int64_t> comm_calibration_sizes();

// Collective over `world` (every rank calls it). Returns, on every rank, the costs by
// comm_key(world.size(), n); the time of a call is the slowest rank's mean over a timed batch,
// median of `passes` batches.
std::map<std::string, CommCosts> calibrate_comm(comm::Communicator& world, int passes = 3,
                                                double target_s = 0.05);

// The ranks' interference inside a step (CommCosts::corun_gemm, sync_wait_s, sync_wait_fraction)
// for every entry of `costs` (as calibrate_comm returned them, on every rank), with `threads`
// threads per rank on a machine of `cores` hardware threads. Collective over `world`, identical
// results on every rank. Each rank runs GEMMs (linear 256 x 256 -> 512):
// - alone (world rank 0, the others asleep) and all at once: corun_gemm is the ratio, beyond the
//   share of a core each rank gets when the ranks' threads outnumber the cores;
// - in loops of 1 and of 8 GEMMs, each closed by an all-reduce of 4 KiB inside the group: the
//   loop's wall time beyond those GEMMs' time (the ranks' mean, by the thread's CPU time with one
//   thread, over their share of a core) and the all-reduce's own is the wait;
//   sync_wait_s + sync_wait_fraction x compute fits the two loops (medians of `passes`).
// About 6 s for 2 ranks on 2 cores; proportionally longer with shared cores.
void calibrate_interference(comm::Communicator& world, int threads, int cores,
                            std::map<std::string, CommCosts>& costs, int passes = 5,
                            double target_s = 0.25);

}  // namespace trident::plan
