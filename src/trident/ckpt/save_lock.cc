#include "trident/ckpt/save_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "trident/ckpt/checkpoint.h"
#include "trident/core/log.h"

namespace trident::ckpt {

namespace fs = std::filesystem;
using core::str;

namespace {

std::string read_fd(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n = 0;
  off_t at = 0;
  while ((n = ::pread(fd, buf, sizeof(buf), at)) > 0) {
    out.append(buf, static_cast<std::size_t>(n));
    at += n;
  }
  return out;
}

std::string describe(const std::string& record) {
  try {
    const nlohmann::json j = nlohmann::json::parse(record);
    return str("host ", j.value("host", "?"), ", pid ", j.value("pid", -1), ", job id '",
               j.value("job_id", ""), "', started ", j.value("started", "?"));
  } catch (const nlohmann::json::exception&) {
    return "an unreadable owner record";
  }
}

std::string hostname() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

std::string scheduler_job_id() {
  for (const char* var : {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"}) {
    if (const char* v = std::getenv(var)) return v;
  }
  return {};
}

SaveLock::SaveLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  path_ = (fs::path(dir) / "trident.lock").string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw SaveError(
        str("--save ", dir, ": cannot create the lock file ", path_, ": ", std::strerror(errno)));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string record = read_fd(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw LockError(str("--save ", dir, " is in use by another running job (", describe(record),
                          "; lock file ", path_,
                          "). Two jobs writing one save directory overwrite each other's "
                          "checkpoints: wait for that job to end, stop it, or use another --save"));
    }
    throw SaveError(str("--save ", dir, ": cannot lock ", path_, ": ", std::strerror(err)));
  }
  const std::string old = read_fd(fd_);
  if (!old.empty()) {
    log::warn("ckpt: ", path_, " names a job that is gone (", describe(old),
              "); taking over its save directory");
  }
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string record = nlohmann::json{{"host", hostname()},
                                            {"pid", ::getpid()},
                                            {"job_id", scheduler_job_id()},
                                            {"started", when}}
                                 .dump() +
                             "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size())) {
    log::warn("ckpt: could not write the owner record into ", path_, ": ", std::strerror(errno));
  }
  ::fsync(fd_);
}

SaveLock::~SaveLock() {
  if (fd_ < 0) return;
  // The file stays (removing it would race with a job opening it); an empty record means free.
  if (::ftruncate(fd_, 0) != 0) {
    // Nothing to do: the lock itself is released below, and a stale record is recognised.
  }
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

std::unique_ptr<SaveLock> lock_save_dir(const std::string& dir, comm::Communicator& world) {
  std::unique_ptr<SaveLock> lock;
  std::string error;
  std::int64_t kind = 0;  // 1 locked by another job, 2 cannot create
  if (world.rank() == 0) {
    try {
      lock = std::make_unique<SaveLock>(dir);
    } catch (const LockError& e) {
      error = e.what();
      kind = 1;
    } catch (const std::exception& e) {
      error = e.what();
      kind = 2;
    }
  }
  if (world.size() > 1) world.broadcast(&kind, 1, comm::Datatype::kI64, 0);
  if (kind == 0) return lock;
  if (error.empty()) error = str("--save ", dir, ": rank 0 could not lock it; see its error");
  if (kind == 1) throw LockError(error);
  throw SaveError(error);
}

}  // namespace trident::ckpt
