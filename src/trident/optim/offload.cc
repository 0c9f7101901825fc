#include "trident/optim/offload.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "trident/core/log.h"

namespace trident::optim {

using core::str;

namespace {

constexpr std::int64_t kAlign = 4096;  // O_DIRECT: buffers, offsets and lengths
constexpr std::int64_t kAlignElems = kAlign / 4;
constexpr int kSlots = 3;  // one chunk read, one updated, one written back
constexpr int kGroups = kSlots + OffloadStore::kReadTags;  // stream slots, then read_async tags

std::int64_t round_up(std::int64_t x, std::int64_t a) { return (x + a - 1) / a * a; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string errno_text(int e) { return str(std::strerror(e), " (errno ", e, ")"); }

std::string disk_hint(int e) {
  if (e == ENOSPC || e == EDQUOT)
    return "; the disk under --offload-path is full: free space or "
           "point --offload-path at a larger disk";
  if (e == EFBIG)
    return "; the file size limit (ulimit -f) is below what the files under --offload-path need: "
           "raise it";
  if (e == EIO || e == ENODEV || e == ENXIO || e == ESTALE)
    return "; the disk under --offload-path failed or vanished: check it and resume from the "
           "last checkpoint";
  return "";
}

}  // namespace

OffloadDevice parse_offload_device(std::string_view name) {
  if (name == "none") return OffloadDevice::kNone;
  if (name == "cpu") return OffloadDevice::kCpu;
  if (name == "nvme") return OffloadDevice::kNvme;
  throw core::InvalidArgument(
      str("--offload-optimizer must be none, cpu or nvme, got '", name, "'"));
}

const char* offload_device_name(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

OffloadIo parse_offload_io(std::string_view name) {
  if (name == "uring" || name == "io_uring") return OffloadIo::kUring;
  if (name == "threads") return OffloadIo::kThreads;
  throw core::InvalidArgument(str("--offload-io must be uring or threads, got '", name, "'"));
}

const char* offload_io_name(OffloadIo io) { return io == OffloadIo::kUring ? "uring" : "threads"; }

namespace detail {

// Asynchronous whole-buffer transfers, in groups: wait(g) returns when every transfer submitted
// to group g has completed, and throws OffloadError for the first that failed.
class IoEngine {
 public:
  struct Req {
    int group = 0;
    bool write = false;
    int fd = -1;
    char* buf = nullptr;
    std::int64_t n = 0, off = 0;
    const std::string* path = nullptr;
  };
  virtual ~IoEngine() = default;
  virtual void submit(const Req& r) = 0;
  virtual void wait(int group) = 0;
};

namespace {

// Finishes a transfer synchronously from `done` bytes on; "" or the error.
std::string finish_sync(const IoEngine::Req& r, std::int64_t done) {
  while (done < r.n) {
    const ssize_t k =
        r.write ? ::pwrite(r.fd, r.buf + done, static_cast<std::size_t>(r.n - done), r.off + done)
                : ::pread(r.fd, r.buf + done, static_cast<std::size_t>(r.n - done), r.off + done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const int e = k < 0 ? errno : 0;
      return str("offload: ", r.write ? "writing " : "reading ", r.n, " bytes at offset ", r.off,
                 " of ", *r.path, " failed: ",
                 k < 0 ? errno_text(e) : std::string("the file is shorter than expected"),
                 disk_hint(e));
    }
    done += k;
  }
  return {};
}

class ThreadEngine final : public IoEngine {
 public:
  ThreadEngine(int groups, int threads)
      : pending_(static_cast<std::size_t>(groups), 0), errors_(static_cast<std::size_t>(groups)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~ThreadEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  void submit(const Req& r) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(r);
      ++pending_[static_cast<std::size_t>(r.group)];
    }
    cv_.notify_one();
  }
  void wait(int group) override {
    const auto g = static_cast<std::size_t>(group);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_[g] == 0; });
    if (!errors_[g].empty()) {
      const std::string e = std::move(errors_[g]);
      errors_[g].clear();
      throw OffloadError(e);
    }
  }

 private:
  void run() {
    for (;;) {
      Req r;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        r = queue_.front();
        queue_.pop_front();
      }
      std::string err = finish_sync(r, 0);
      {
        std::lock_guard<std::mutex> lock(mu_);
        const auto g = static_cast<std::size_t>(r.group);
        if (!err.empty() && errors_[g].empty()) errors_[g] = std::move(err);
        --pending_[g];
      }
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::deque<Req> queue_;
  std::vector<int> pending_;
  std::vector<std::string> errors_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

class UringEngine final : public IoEngine {
 public:
  UringEngine(int groups, unsigned depth)
      : pending_(static_cast<std::size_t>(groups), 0), errors_(static_cast<std::size_t>(groups)) {
    const int rc = io_uring_queue_init(depth, &ring_, 0);
    if (rc < 0) {
      throw OffloadError(str("offload: io_uring is not available (", errno_text(-rc),
                             "); use --offload-io threads"));
    }
  }
  ~UringEngine() override {
    for (std::size_t g = 0; g < pending_.size(); ++g) {
      try {
        wait(static_cast<int>(g));
      } catch (...) {
      }
    }
    io_uring_queue_exit(&ring_);
  }
  void submit(const Req& r) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {  // the ring is full: reap one completion first
      reap_one();
      sqe = io_uring_get_sqe(&ring_);
    }
    auto* req = new Req(r);
    if (r.write) {
      io_uring_prep_write(sqe, r.fd, r.buf, static_cast<unsigned>(r.n),
                          static_cast<std::uint64_t>(r.off));
    } else {
      io_uring_prep_read(sqe, r.fd, r.buf, static_cast<unsigned>(r.n),
                         static_cast<std::uint64_t>(r.off));
    }
    io_uring_sqe_set_data(sqe, req);
    ++pending_[static_cast<std::size_t>(r.group)];
    const int rc = io_uring_submit(&ring_);
    if (rc < 0) {
      throw OffloadError(str("offload: io_uring_submit failed: ", errno_text(-rc)));
    }
  }
  void wait(int group) override {
    const auto g = static_cast<std::size_t>(group);
    while (pending_[g] > 0) reap_one();
    if (!errors_[g].empty()) {
      const std::string e = std::move(errors_[g]);
      errors_[g].clear();
      throw OffloadError(e);
    }
  }

 private:
  void reap_one() {
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) throw OffloadError(str("offload: io_uring_wait_cqe failed: ", errno_text(-rc)));
    std::unique_ptr<Req> req(static_cast<Req*>(io_uring_cqe_get_data(cqe)));
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    const auto g = static_cast<std::size_t>(req->group);
    std::string err;
    if (res < 0) {
      err = str("offload: ", req->write ? "writing " : "reading ", req->n, " bytes at offset ",
                req->off, " of ", *req->path, " failed: ", errno_text(-res), disk_hint(-res));
    } else if (res < req->n) {
      err = finish_sync(*req, res);  // a short transfer: the rest synchronously
    }
    if (!err.empty() && errors_[g].empty()) errors_[g] = std::move(err);
    --pending_[g];
  }

  io_uring ring_{};
  std::vector<int> pending_;
  std::vector<std::string> errors_;
};

}  // namespace

std::unique_ptr<IoEngine> make_engine(OffloadIo io, int groups, int depth) {
  if (io == OffloadIo::kUring) {
    return std::make_unique<UringEngine>(groups, static_cast<unsigned>(std::max(depth, 2)));
  }
  return std::make_unique<ThreadEngine>(groups, 2);
}

}  // namespace detail

namespace {

int open_file(const std::string& path, bool direct, bool create) {
  int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  if (direct) flags |= O_DIRECT;
  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0 && direct && errno == EINVAL) {
    // The file system has no O_DIRECT: through the page cache (the same bytes, more memory
    // pressure outside the process).
    log::warn("offload: ", path,
              ": the file system does not support O_DIRECT; using buffered "
              "I/O (--offload-buffered)");
    fd = ::open(path.c_str(), flags & ~O_DIRECT, 0600);
  }
  if (fd < 0) {
    const int e = errno;
    throw OffloadError(str("offload: cannot create ", path, ": ", errno_text(e),
                           e == ENOENT ? "; --offload-path must be an existing directory" : "",
                           disk_hint(e)));
  }
  return fd;
}

void reserve(int fd, const std::string& path, std::int64_t bytes) {
  const int e = ::posix_fallocate(fd, 0, bytes);
  if (e != 0) {
    throw OffloadError(str("offload: cannot reserve ", bytes, " bytes for ", path, ": ",
                           errno_text(e), disk_hint(e)));
  }
}

}  // namespace

OffloadFootprint offload_footprint(std::int64_t window_bytes, int arrays, std::int64_t n) {
  const std::int64_t k = arrays;
  OffloadFootprint f;
  // Chunk: the window split into kSlots buffers per array, a multiple of the O_DIRECT alignment,
  // at most the (aligned) arrays.
  f.chunk_elements = std::max<std::int64_t>(
      kAlignElems, window_bytes / (4 * kSlots * k) / kAlignElems * kAlignElems);
  f.chunk_elements =
      std::min(f.chunk_elements, std::max<std::int64_t>(kAlignElems, round_up(n, kAlignElems)));
  f.window_bytes = kSlots * k * f.chunk_elements * 4;
  f.file_bytes = k * round_up(std::max<std::int64_t>(n, 1) * 4, kAlign);
  return f;
}

OffloadStore::OffloadStore(const OffloadConfig& cfg, const std::string& prefix,
                           const std::vector<std::string>& arrays, std::int64_t n)
    : cfg_(cfg), n_(n) {
  TRIDENT_CHECK(!cfg.path.empty(), "--offload-optimizer nvme needs --offload-path DIR");
  TRIDENT_CHECK(std::filesystem::is_directory(cfg.path), "--offload-path ", cfg.path,
                " is not a directory; create it (on the disk that should hold the optimizer "
                "state)");
  TRIDENT_CHECK(!arrays.empty() && n >= 0, "offload store of ", arrays.size(), " arrays of ", n);
  // An exceeded file size limit is an error to report, not a signal that kills the process.
  std::signal(SIGXFSZ, SIG_IGN);
  const auto k = static_cast<std::int64_t>(arrays.size());
  const OffloadFootprint f = offload_footprint(cfg.window_bytes, static_cast<int>(k), n);
  chunk_ = f.chunk_elements;
  file_bytes_each_ = f.file_bytes / k;
  window_bytes_ = f.window_bytes;
  if (::posix_memalign(&window_, kAlign, static_cast<std::size_t>(window_bytes_)) != 0) {
    throw std::bad_alloc();
  }
  std::memset(window_, 0, static_cast<std::size_t>(window_bytes_));
  auto* w = static_cast<float*>(window_);
  slot_bufs_.resize(kSlots);
  for (int s = 0; s < kSlots; ++s) {
    for (std::int64_t a = 0; a < k; ++a) slot_bufs_[s].push_back(w + (s * k + a) * chunk_);
  }
  remove_stale_files(cfg.path);
  try {
    for (const std::string& a : arrays) {
      const std::string path =
          (std::filesystem::path(cfg.path) / (prefix + "." + a + ".bin")).string();
      // Created under a temporary name, locked, then renamed: a file with the final name is
      // always locked while its store lives (remove_stale_files relies on it).
      const std::string tmp = path + ".tmp";
      const int fd = open_file(tmp, cfg.direct, true);
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw OffloadError(str("offload: cannot lock and name ", path, ": ", errno_text(e)));
      }
      paths_.push_back(path);
      fds_.push_back(fd);
      reserve(fds_.back(), path, file_bytes_each_);
      void* m = ::mmap(nullptr, static_cast<std::size_t>(file_bytes_each_), PROT_READ | PROT_WRITE,
                       MAP_SHARED, fds_.back(), 0);
      if (m == MAP_FAILED) {
        throw OffloadError(str("offload: cannot map ", path, ": ", errno_text(errno)));
      }
      maps_.push_back(static_cast<float*>(m));
    }
    io_ = detail::make_engine(cfg.io, kGroups, static_cast<int>(2 * kSlots * k + kReadTags));
  } catch (...) {
    close_all();
    throw;
  }
}

OffloadStore::~OffloadStore() { close_all(); }

void OffloadStore::close_all() {
  io_.reset();
  for (float* m : maps_) ::munmap(m, static_cast<std::size_t>(file_bytes_each_));
  maps_.clear();
  // Unlinked before the descriptors (and so their locks) go: no other store sees them unlocked.
  for (const std::string& p : paths_) ::unlink(p.c_str());
  for (int fd : fds_) ::close(fd);
  fds_.clear();
  paths_.clear();
  std::free(window_);
  window_ = nullptr;
}

std::int64_t OffloadStore::window_bytes() const { return window_bytes_; }
std::int64_t OffloadStore::file_bytes() const {
  return file_bytes_each_ * static_cast<std::int64_t>(fds_.size());
}

void OffloadStore::check_files() const {
  for (std::size_t a = 0; a < fds_.size(); ++a) {
    struct stat st {};
    if (::fstat(fds_[a], &st) != 0) {
      throw OffloadError(str("offload: ", paths_[a], ": ", errno_text(errno), disk_hint(errno)));
    }
    if (st.st_nlink == 0) {
      throw OffloadError(str("offload: ", paths_[a],
                             " was removed while training (the disk under --offload-path was "
                             "unmounted or the file deleted); the optimizer state on it is "
                             "lost: resume from the last checkpoint"));
    }
  }
}

void OffloadStore::stream(const ChunkFn& fn) {
  check_files();
  const double t0 = now_s();
  const std::int64_t chunks = (n_ + chunk_ - 1) / chunk_;
  const auto k = fds_.size();
  const auto bytes_of = [&](std::int64_t c) {
    return round_up((std::min(n_, (c + 1) * chunk_) - c * chunk_) * 4, kAlign);
  };
  const auto transfer = [&](std::int64_t c, bool write) {
    const int s = static_cast<int>(c % kSlots);
    for (std::size_t a = 0; a < k; ++a) {
      io_->submit({.group = s,
                   .write = write,
                   .fd = fds_[a],
                   .buf = reinterpret_cast<char*>(slot_bufs_[s][a]),
                   .n = bytes_of(c),
                   .off = c * chunk_ * 4,
                   .path = &paths_[a]});
      (write ? stats_.bytes_written : stats_.bytes_read) += bytes_of(c);
    }
  };
  const auto wait = [&](std::int64_t c) {
    const double w0 = now_s();
    io_->wait(static_cast<int>(c % kSlots));
    stats_.wait_s += now_s() - w0;
  };
  try {
    if (chunks > 0) transfer(0, false);
    for (std::int64_t c = 0; c < chunks; ++c) {
      if (c + 1 < chunks) {
        if (c + 1 >= kSlots) wait(c + 1 - kSlots);  // the write that last used the slot
        transfer(c + 1, false);
      }
      wait(c);
      const double c0 = now_s();
      const std::int64_t begin = c * chunk_, end = std::min(n_, begin + chunk_);
      fn(begin, end, slot_bufs_[static_cast<std::size_t>(c % kSlots)].data());
      stats_.compute_s += now_s() - c0;
      transfer(c, true);
    }
    for (std::int64_t c = std::max<std::int64_t>(0, chunks - kSlots); c < chunks; ++c) wait(c);
  } catch (...) {
    for (int s = 0; s < kSlots; ++s) {
      try {
        io_->wait(s);
      } catch (...) {
      }
    }
    throw;
  }
  stats_.chunks += chunks;
  stats_.passes += 1;
  stats_.wall_s += now_s() - t0;
}

std::int64_t OffloadStore::read_span_bytes(std::int64_t n) {
  return round_up(n * 4, kAlign) + kAlign;
}

float* OffloadStore::read_async(int k, std::int64_t begin, std::int64_t end, void* buf, int tag) {
  if (end == begin) return static_cast<float*>(buf);  // nothing to read (wherever it is)
  TRIDENT_ASSERT(k >= 0 && k < static_cast<int>(fds_.size()) && tag >= 0 && tag < kReadTags &&
                     begin >= 0 && begin <= end && end <= n_,
                 "read_async(", k, ", ", begin, ", ", end, ", tag ", tag, ")");
  TRIDENT_ASSERT(reinterpret_cast<std::uintptr_t>(buf) % kAlign == 0, "unaligned read buffer");
  const std::int64_t lo = begin * 4 / kAlign * kAlign, hi = round_up(end * 4, kAlign);
  auto* out = reinterpret_cast<float*>(static_cast<char*>(buf) + (begin * 4 - lo));
  io_->submit({.group = kSlots + tag,
               .write = false,
               .fd = fds_[static_cast<std::size_t>(k)],
               .buf = static_cast<char*>(buf),
               .n = hi - lo,
               .off = lo,
               .path = &paths_[static_cast<std::size_t>(k)]});
  stats_.fetch_bytes += hi - lo;
  stats_.fetches += 1;
  return out;
}

void OffloadStore::wait_read(int tag) {
  const double w0 = now_s();
  io_->wait(kSlots + tag);
  stats_.fetch_wait_s += now_s() - w0;
}

int remove_stale_files(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool tmp = name.ends_with(".bin.tmp");
    if (!name.starts_with("trident.") || name.find(".rank") == std::string::npos ||
        !(name.ends_with(".bin") || tmp)) {
      continue;
    }
    if (tmp) {
      // Between its creation and its lock a temporary file is unlocked: only old ones are stale.
      std::error_code tec;
      const auto age = std::filesystem::file_time_type::clock::now() -
                       std::filesystem::last_write_time(e.path(), tec);
      if (tec || age < std::chrono::minutes(1)) continue;
    }
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      // Nobody holds it: its process is gone (killed, or crashed before its destructors).
      std::error_code sec;
      const auto bytes = std::filesystem::file_size(e.path(), sec);
      if (::unlink(e.path().c_str()) == 0) {
        ++removed;
        log::warn("offload: removed ", e.path().string(), " (", sec ? 0 : bytes >> 20,
                  " MiB), left behind by a run that ended without cleaning up (killed?)");
      }
    }
    ::close(fd);
  }
  return removed;
}

void OffloadStore::release_pages(bool written) {
  for (std::size_t a = 0; a < maps_.size(); ++a) {
    const auto len = static_cast<std::size_t>(file_bytes_each_);
    if (written && ::msync(maps_[a], len, MS_SYNC) != 0) {
      const int e = errno;
      throw OffloadError(
          str("offload: writing ", paths_[a], " failed: ", errno_text(e), disk_hint(e)));
    }
    ::madvise(maps_[a], len, MADV_DONTNEED);
  }
  check_files();
}

DiskBandwidth measure_disk_bandwidth(const std::string& dir, std::int64_t bytes, std::int64_t chunk,
                                     int depth, OffloadIo io, bool direct) {
  chunk = round_up(chunk, kAlign);
  bytes = round_up(bytes, chunk);
  const std::string path = (std::filesystem::path(dir) / "trident_disk_bandwidth.bin").string();
  const int fd = open_file(path, direct, true);
  ::unlink(path.c_str());
  void* mem = nullptr;
  if (::posix_memalign(&mem, kAlign, static_cast<std::size_t>(chunk * depth)) != 0) {
    ::close(fd);
    throw std::bad_alloc();
  }
  std::memset(mem, 0x5a, static_cast<std::size_t>(chunk * depth));
  DiskBandwidth out;
  try {
    reserve(fd, path, bytes);
    auto engine = detail::make_engine(io, depth, 2 * depth);
    for (int pass = 0; pass < 2; ++pass) {
      const bool write = pass == 0;
      const double t0 = now_s();
      const std::int64_t n = bytes / chunk;
      for (std::int64_t i = 0; i < n; ++i) {
        const int g = static_cast<int>(i % depth);
        if (i >= depth) engine->wait(g);
        engine->submit({.group = g,
                        .write = write,
                        .fd = fd,
                        .buf = static_cast<char*>(mem) + g * chunk,
                        .n = chunk,
                        .off = i * chunk,
                        .path = &path});
      }
      for (int g = 0; g < depth; ++g) engine->wait(g);
      if (write) ::fdatasync(fd);
      const double bps = static_cast<double>(bytes) / (now_s() - t0);
      (write ? out.write_bps : out.read_bps) = bps;
    }
  } catch (...) {
    std::free(mem);
    ::close(fd);
    throw;
  }
  std::free(mem);
  ::close(fd);
  return out;
}

}  // namespace trident::optim
