// MPI start-up and shutdown (MpiRuntime, one per process, owned by main) and abort_job, the one
// way a fatal error ends the whole job. Works under mpirun, under srun (with Slurm's PMIx plugin:
// srun --mpi=pmix), and with no launcher at all (Open MPI singleton: a world of one process).
#pragma once

#include <string>

namespace trident::comm {

enum class ThreadLevel { kSingle, kFunneled, kSerialized, kMultiple };

// Initializes MPI in its constructor and finalizes it in its destructor, unless MPI was already
// initialized by someone else (then it does neither). Create it first thing in main and let it
// outlive every MpiCommunicator. Throws CommError if MPI cannot give `required` thread support, or
// if a launcher started several tasks but MPI sees a world of one (srun without an MPI plugin:
// every task would train alone).
class MpiRuntime {
 public:
  MpiRuntime(int& argc, char**& argv, ThreadLevel required = ThreadLevel::kFunneled);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  ThreadLevel thread_level() const { return provided_; }
  bool owns_mpi() const { return owns_; }

 private:
  int world_rank_ = 0;
  int world_size_ = 1;
  ThreadLevel provided_ = ThreadLevel::kSingle;
  bool owns_ = false;
};

// Ends the whole job: prints `msg` once (to stderr, with this process's world rank), then calls
// MPI_Abort(MPI_COMM_WORLD, code) so peers blocked in collectives die too. Without MPI (not
// initialized, or already finalized) it exits the process with `code`. Safe to call from any
// thread; a second concurrent call does not print again. Only main-level error handlers call it.
[[noreturn]] void abort_job(int code, const std::string& msg);

}  // namespace trident::comm
