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

}  // namespace trident::plan
