// MpiRuntime and abort_job.
#include "trident/comm/runtime.h"

#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "trident/core/error.h"

namespace trident::comm {

namespace {

int to_mpi_level(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::kSingle:
      return MPI_THREAD_SINGLE;
    case ThreadLevel::kFunneled:
      return MPI_THREAD_FUNNELED;
    case ThreadLevel::kSerialized:
      return MPI_THREAD_SERIALIZED;
    case ThreadLevel::kMultiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_SINGLE;
}

ThreadLevel from_mpi_level(int level) {
  if (level >= MPI_THREAD_MULTIPLE) return ThreadLevel::kMultiple;
  if (level >= MPI_THREAD_SERIALIZED) return ThreadLevel::kSerialized;
  if (level >= MPI_THREAD_FUNNELED) return ThreadLevel::kFunneled;
  return ThreadLevel::kSingle;
}

// How many tasks the launcher says it started, from its environment; 0 when unknown.
int launcher_tasks(std::string* source) {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "PMI_SIZE"}) {
    if (const char* v = std::getenv(var)) {
      *source = var;
      return std::atoi(v);
    }
  }
  return 0;
}

}  // namespace

MpiRuntime::MpiRuntime(int& argc, char**& argv, ThreadLevel required) {
#ifdef TRIDENT_CUDA_EMULATED
  // The emulated build's NCCL (tests/cuda_emu/nccl.cc) runs MPI on the emulated streams' threads.
  required = ThreadLevel::kMultiple;
#endif
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    if (MPI_Init_thread(&argc, &argv, to_mpi_level(required), &provided) != MPI_SUCCESS) {
      throw core::CommError("MPI_Init_thread failed");
    }
    owns_ = true;
  }
  provided_ = from_mpi_level(provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  if (provided < to_mpi_level(required)) {
    throw core::CommError(core::str("MPI provides thread level ", provided, ", below the ",
                                    to_mpi_level(required), " trident needs"));
  }
  std::string source;
  const int tasks = launcher_tasks(&source);
  if (tasks > 1 && world_size_ != tasks) {
    throw core::CommError(
        core::str("the launcher started ", tasks, " tasks (", source, "=", tasks,
                  ") but MPI sees a world of ", world_size_,
                  ": the launcher and this MPI library do not talk to each other (with srun, "
                  "use --mpi=pmix; or start with this MPI's mpirun)"));
  }
}

MpiRuntime::~MpiRuntime() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void abort_job(int code, const std::string& msg) {
  static std::atomic<bool> aborting{false};
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool have_mpi = initialized && !finalized;
  if (!aborting.exchange(true)) {
    int rank = 0, size = 1;
    if (have_mpi) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    std::fflush(stdout);
    std::fprintf(
        stderr,
        "trident: fatal error on rank %d of %d: %s\ntrident: ending the job (exit code %d)\n", rank,
        size, msg.c_str(), code);
    std::fflush(stderr);
  }
  if (have_mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace trident::comm
