// Sequential write and read bandwidth of a directory's disk with the offload's I/O engines
// (optim/offload.h): io_uring and a pread/pwrite thread pool, O_DIRECT, several request sizes
// and depths. The ceiling for --offload-optimizer nvme (docs/offload.md).
// Usage: trident_disk_bandwidth --dir DIR [--mib 1024]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "trident/optim/offload.h"

int main(int argc, char** argv) {
  CLI::App app("offload disk bandwidth");
  std::string dir = "/tmp";
  double mib = 1024;
  bool buffered = false;
  app.add_option("--dir", dir, "directory on the disk to measure");
  app.add_option("--mib", mib, "file size, MiB");
  app.add_flag("--buffered", buffered, "through the page cache instead of O_DIRECT");
  CLI11_PARSE(app, argc, argv);
  using trident::optim::OffloadIo;
  std::printf(
      "| engine | request | in flight | write MiB/s | read MiB/s |\n|---|---|---|---|---|\n");
  for (const OffloadIo io : {OffloadIo::kUring, OffloadIo::kThreads}) {
    for (const std::int64_t req_mib : {1, 4, 16}) {
      for (const int depth : {2, 4}) {
        const auto bw = trident::optim::measure_disk_bandwidth(
            dir, static_cast<std::int64_t>(mib * (1 << 20)), req_mib << 20, depth, io, !buffered);
        std::printf("| %s | %lld MiB | %d | %.0f | %.0f |\n", trident::optim::offload_io_name(io),
                    static_cast<long long>(req_mib), depth, bw.write_bps / (1 << 20),
                    bw.read_bps / (1 << 20));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
