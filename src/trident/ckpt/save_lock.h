// SaveLock: a save directory belongs to one job at a time. The job's rank 0 holds an exclusive
// flock(2) on <save>/trident.lock for the job's lifetime and writes its owner into the file (host,
// pid, job id, start time). The kernel drops the lock when the process dies, however it dies, so a
// lock file whose lock nobody holds is the stale record of a dead job and is taken over (with a
// warning naming it); a held lock means a live job and the second job is refused with LockError.
#pragma once

#include <memory>
#include <string>

#include "trident/comm/communicator.h"
#include "trident/core/error.h"

namespace trident::ckpt {

// Another live job holds the save directory (`trident train` exits with ExitCode::kLocked).
class LockError : public core::Error {
 public:
  using core::Error::Error;
};

class SaveLock {
 public:
  // Takes <dir>/trident.lock (creating <dir>). Throws LockError naming the holder when another
  // live process holds it, SaveError when the file cannot be created.
  explicit SaveLock(const std::string& dir);
  ~SaveLock();  // empties the record and releases the lock
  SaveLock(const SaveLock&) = delete;
  SaveLock& operator=(const SaveLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Collective over `world`: rank 0 takes the lock of `dir`; every rank throws LockError (or
// SaveError) when it could not. Returns the lock on rank 0, null elsewhere.
std::unique_ptr<SaveLock> lock_save_dir(const std::string& dir, comm::Communicator& world);

// The job id the scheduler gave this process (SLURM_JOB_ID, PBS_JOBID, LSB_JOBID), or "".
std::string scheduler_job_id();

}  // namespace trident::ckpt
