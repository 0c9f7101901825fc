// Optimizer-state offload (ZeRO-Offload / ZeRO-Infinity, docs/offload.md): the Adam moments of the
// range a rank updates live in files under --offload-path and are streamed, chunk by chunk,
// through a bounded window of three chunk buffers per array: while the update runs on chunk k in
// one, chunk k + 1 is read into the next (double buffering of the reads) and chunk k - 1 written
// back from the third, with asynchronous I/O (io_uring, or pread/pwrite on a thread pool) on files
// opened with O_DIRECT.
//
// The files are also mapped (MAP_SHARED) for checkpoints: a save writes the checkpoint shard from
// the mapping and a load reads into it, so neither holds a copy of the state in anonymous memory;
// release_pages() drops the mapped pages from the process afterwards.
//
// ZeRO-3 parameter offload (--offload-params nvme) keeps the rank's FP32 weight shard as one more
// array of the same store: the optimizer streams it with the moments, and the gatherer reads the
// pieces of the layers it is about to all-gather with read_async() (random access, same engine).
//
// Files are named <prefix>.<array>.bin and held under an exclusive flock() for the store's life;
// the lock dies with the process, so the files a killed process leaves behind are recognised
// (unlocked) and removed by the next store created in the same directory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trident/core/error.h"

namespace trident::optim {

// --offload-optimizer: none; cpu (host memory: the identity on the CPU backend, where the state is
// in host memory already); nvme (files under --offload-path).
enum class OffloadDevice { kNone, kCpu, kNvme };
OffloadDevice parse_offload_device(std::string_view name);
const char* offload_device_name(OffloadDevice d);

// --offload-io: the asynchronous I/O engine.
enum class OffloadIo { kUring, kThreads };
OffloadIo parse_offload_io(std::string_view name);
const char* offload_io_name(OffloadIo io);

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string path;                        // --offload-path: the directory of the files (nvme)
  std::int64_t window_bytes = 48ll << 20;  // --offload-window-mib: all buffers of all arrays
  OffloadIo io = OffloadIo::kUring;        // --offload-io
  bool direct = true;                      // O_DIRECT (bypass the page cache); --offload-buffered
};

// The offload disk failed: full, removed, an I/O error. The message names the file and the fix.
class OffloadError : public core::Error {
 public:
  using core::Error::Error;
};

struct OffloadStats {
  std::int64_t bytes_read = 0, bytes_written = 0, chunks = 0, passes = 0;
  double wall_s = 0;     // inside stream()
  double wait_s = 0;     // waiting for I/O (what the overlap did not hide)
  double compute_s = 0;  // in the callback
  // read_async(): bytes read, reads, and time waiting for them in wait_read().
  std::int64_t fetch_bytes = 0, fetches = 0;
  double fetch_wait_s = 0;
};

// What an OffloadStore of `arrays` arrays of n elements allocates (trident plan reports it).
struct OffloadFootprint {
  std::int64_t chunk_elements = 0;
  std::int64_t window_bytes = 0;  // resident: the chunk buffers
  std::int64_t file_bytes = 0;    // on disk, all arrays
};
OffloadFootprint offload_footprint(std::int64_t window_bytes, int arrays, std::int64_t n);

namespace detail {
class IoEngine;
}

// Arrays of `n` FP32 elements, one file each, streamed through the window.
class OffloadStore {
 public:
  // Creates <cfg.path>/<prefix>.<array>.bin for each array, reserves their space (a full disk is
  // an error here, not in the middle of a step) and fills them with zeros. First removes the
  // files of stores whose process is gone (remove_stale_files).
  OffloadStore(const OffloadConfig& cfg, const std::string& prefix,
               const std::vector<std::string>& arrays, std::int64_t n);
  ~OffloadStore();  // removes the files
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  std::int64_t size() const { return n_; }
  std::int64_t chunk_elements() const { return chunk_; }
  std::int64_t window_bytes() const;  // the buffers, as allocated
  std::int64_t file_bytes() const;    // on disk, all arrays
  const std::vector<std::string>& paths() const { return paths_; }
  const OffloadStats& stats() const { return stats_; }

  // For every chunk [begin, end) of [0, n) in order: data[k] holds array k's elements of the chunk
  // (read from the files); fn updates them in place and they are written back. Reads of the next
  // chunk and the write of the previous one run while fn runs. Throws OffloadError on I/O failure.
  using ChunkFn = std::function<void(std::int64_t begin, std::int64_t end, float* const* data)>;
  void stream(const ChunkFn& fn);

  // Random access: reads elements [begin, end) of array k into buf (4 KiB aligned, at least
  // read_span_bytes(end - begin) bytes) as read group `tag` (0 <= tag < kReadTags), without
  // waiting; returns where element `begin` will be in buf. wait_read(tag) waits for the group's
  // reads and throws OffloadError for a failed one. Not while stream() runs.
  static constexpr int kReadTags = 4;
  static std::int64_t read_span_bytes(std::int64_t n);
  float* read_async(int k, std::int64_t begin, std::int64_t end, void* buf, int tag);
  void wait_read(int tag);

  // OffloadError when a file was removed or its disk vanished (stream() checks first, too).
  void check_files() const;

  // Array k as a shared mapping of its file (checkpoints read and write through it).
  float* mapped(int k) const { return maps_[static_cast<std::size_t>(k)]; }
  // After a checkpoint touched the mappings: writes dirty pages to the files (when `written`) and
  // drops the mapped pages from this process's memory.
  void release_pages(bool written);

 private:
  void close_all();

  OffloadConfig cfg_;
  std::int64_t n_ = 0, chunk_ = 0, file_bytes_each_ = 0;
  std::vector<std::string> paths_;
  std::vector<int> fds_;  // each holds an exclusive flock() on its file
  std::vector<float*> maps_;
  std::vector<std::vector<float*>> slot_bufs_;  // [slot][array]: the window's chunk buffers
  void* window_ = nullptr;
  std::int64_t window_bytes_ = 0;
  std::unique_ptr<detail::IoEngine> io_;
  OffloadStats stats_;
};

// Removes the files <dir>/trident.*.bin that no live store holds (left by a killed process) and
// returns how many; the files of running stores (locked) are left alone.
int remove_stale_files(const std::string& dir);

// Sequential bandwidth of a directory's disk, for the log and the benchmark: writes then reads a
// file of `bytes` with O_DIRECT in `chunk`-byte requests, `depth` in flight. Bytes per second.
struct DiskBandwidth {
  double write_bps = 0, read_bps = 0;
};
DiskBandwidth measure_disk_bandwidth(const std::string& dir, std::int64_t bytes, std::int64_t chunk,
                                     int depth, OffloadIo io, bool direct);

}  // namespace trident::optim
