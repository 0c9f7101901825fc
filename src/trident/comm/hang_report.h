// Hang reports that name the culprit. Every communicator counts the collectives posted on it (a
// per-group sequence number: the k-th collective of group 'dp' is number k on every member) and
// the process remembers its iteration, its last operation and the operation it is waiting in.
// A side channel that does not depend on any communicator (a TCP status server thread per
// process, addresses exchanged once at start-up) lets a rank whose wait timed out ask every rank
// where it is. A rank that does not answer (stopped, dead, cut off) or has not reached the
// collective is named, with its host, in one summary line:
//
//   trident: hang report: all_reduce #17 on group 'dp' (global ranks [1, 5]) timed out on rank 1:
//   reached by [1]; NOT reached by rank 5 (host h1, pid 4242): no answer on the side channel
//   within 2 s (stopped, dead or cut off)
//
// Only the rank whose timeout came first prints the summary (the others see its state on the side
// channel and leave the job to its MPI_Abort). Off with TRIDENT_HANG_REPORT=0. The server binds
// all interfaces on an ephemeral port and answers only "where are you" requests; peers on the
// same host are asked over 127.0.0.1, others at the first non-loopback IPv4 address of their
// host (override with TRIDENT_HANG_REPORT_ADDR=ADDR).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/communicator.h"

namespace trident::comm {

namespace detail {
// One communicator's progress, shared with the status server.
struct GroupProgress {
  std::string name;
  std::vector<int> global_ranks;
  std::int64_t posted = 0;  // collectives posted so far (the last one's sequence number)
  std::string last_op;      // describe() of the last operation posted (any kind)
};
// Registers a communicator's progress with the process board (weakly held).
std::shared_ptr<GroupProgress> track_group(const GroupInfo& group);
// Records an operation posted on `g` by group rank `rank`; a collective gets its sequence number
// (op.seq = 1, 2, ... per group; point-to-point operations keep seq 0).
void note_posted(const std::shared_ptr<GroupProgress>& g, int rank, OpDesc& op);
// The operation this process is blocked in, until note_done_waiting().
void note_waiting(const std::shared_ptr<const GroupInfo>& group, int rank, const OpDesc& op);
void note_done_waiting();
void note_step(std::int64_t step);
// Called when a wait timed out: asks every rank over the side channel and returns the report
// (empty when the side channel is off). Prints the summary line when this rank reports for the
// job; otherwise waits a few seconds for the reporting rank to end the job first.
std::string on_timeout(const GroupInfo& group, int rank, const OpDesc& op);
}  // namespace detail

// Starts the side channel: a status server thread and an all-gather of every rank's address
// over `world` (collective over the world; once per process, later calls do nothing). Called by
// MpiCommunicator::world().
void start_hang_reporter(Communicator& world);
bool hang_reporter_running();

// How long a timed-out rank waits for each peer's answer (seconds).
double hang_probe_timeout_s();

}  // namespace trident::comm
