// OffloadStore (optim/offload.h): the streamed chunks see exactly what the files hold, every
// element once per pass, with both I/O engines; the mapping sees what the stream wrote; a full
// or removed offload file is an OffloadError that names the file.
#include "trident/optim/offload.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace trident::optim {
namespace {

namespace fs = std::filesystem;

class OffloadStoreTest : public ::testing::TestWithParam<OffloadIo> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("trident_offload_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  OffloadConfig config(std::int64_t window) const {
    return {.device = OffloadDevice::kNvme,
            .path = dir_.string(),
            .window_bytes = window,
            .io = GetParam(),
            .direct = true};
  }
  fs::path dir_;
};

TEST_P(OffloadStoreTest, StreamsEveryElementAndPersists) {
  // 10000 elements in 1024-element chunks (window 3 slots x 2 arrays x 4 KiB): a partial last
  // chunk, more chunks than slots.
  const std::int64_t n = 10000;
  OffloadStore store(config(3 * 2 * 4096), "t", {"a", "b"}, n);
  EXPECT_EQ(store.chunk_elements(), 1024);
  EXPECT_EQ(store.window_bytes(), 3 * 2 * 4096);
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<int> seen(static_cast<std::size_t>(n), 0);
    std::int64_t next = 0;
    store.stream([&](std::int64_t lo, std::int64_t hi, float* const* d) {
      EXPECT_EQ(lo, next);
      next = hi;
      for (std::int64_t i = lo; i < hi; ++i) {
        // The files start as zeros; each pass adds i (a) and 2i (b).
        ASSERT_EQ(d[0][i - lo], static_cast<float>(pass * i)) << "pass " << pass << " i " << i;
        ASSERT_EQ(d[1][i - lo], static_cast<float>(2 * pass * i));
        d[0][i - lo] += static_cast<float>(i);
        d[1][i - lo] += static_cast<float>(2 * i);
        ++seen[static_cast<std::size_t>(i)];
      }
    });
    EXPECT_EQ(next, n);
    for (int s : seen) ASSERT_EQ(s, 1);
  }
  // The mapping sees the files.
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(store.mapped(0)[i], static_cast<float>(3 * i));
    ASSERT_EQ(store.mapped(1)[i], static_cast<float>(6 * i));
  }
  // Writes through the mapping (a checkpoint load) reach the stream after release_pages.
  for (std::int64_t i = 0; i < n; ++i) store.mapped(0)[i] = -1.0f;
  store.release_pages(/*written=*/true);
  store.stream([&](std::int64_t lo, std::int64_t hi, float* const* d) {
    for (std::int64_t i = lo; i < hi; ++i) ASSERT_EQ(d[0][i - lo], -1.0f);
  });
  EXPECT_EQ(store.stats().passes, 4);
  EXPECT_EQ(store.stats().bytes_read, store.stats().bytes_written);
  EXPECT_EQ(store.stats().bytes_read, 4 * 2 * 10240 * 4);
  const std::vector<std::string> paths = store.paths();
  for (const std::string& p : paths) EXPECT_TRUE(fs::exists(p));
}

TEST_P(OffloadStoreTest, FilesAreRemovedWithTheStore) {
  std::vector<std::string> paths;
  {
    OffloadStore store(config(1 << 20), "t", {"a"}, 5000);
    paths = store.paths();
    ASSERT_TRUE(fs::exists(paths[0]));
  }
  EXPECT_FALSE(fs::exists(paths[0]));
}

TEST_P(OffloadStoreTest, RemovedFileIsAClearError) {
  OffloadStore store(config(1 << 20), "t", {"a", "b"}, 5000);
  fs::remove(store.paths()[1]);
  try {
    store.stream([](std::int64_t, std::int64_t, float* const*) {});
    FAIL() << "no error for a removed offload file";
  } catch (const OffloadError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(store.paths()[1]), std::string::npos) << msg;
    EXPECT_NE(msg.find("was removed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("resume from the last checkpoint"), std::string::npos) << msg;
  }
}

TEST_P(OffloadStoreTest, FullDiskIsAClearErrorAtStart) {
  // The file size limit stands in for a full disk: reserving the files fails up front.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 1 << 16;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    OffloadStore store(config(1 << 20), "t", {"a", "b"}, 1 << 20);
  } catch (const OffloadError& e) {
    msg = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_NE(msg.find("cannot reserve 4194304 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ulimit -f"), std::string::npos) << msg;
  // Nothing is left behind.
  EXPECT_TRUE(fs::is_empty(dir_));
}

// read_async (the ZeRO-3 weight prefetch): any element range, unaligned at both ends, several
// groups in flight, sees what the stream wrote.
TEST_P(OffloadStoreTest, ReadsAnyRangeAsynchronously) {
  const std::int64_t n = 10000;
  OffloadStore store(config(3 * 4096), "t", {"p"}, n);
  store.stream([](std::int64_t lo, std::int64_t hi, float* const* d) {
    for (std::int64_t i = lo; i < hi; ++i) d[0][i - lo] = static_cast<float>(i) + 0.5f;
  });
  const std::vector<std::pair<std::int64_t, std::int64_t>> ranges = {
      {0, 1}, {3, 1029}, {1023, 1025}, {5000, 5000}, {7777, 10000}, {0, 10000}};
  std::vector<void*> bufs;
  std::vector<float*> at;
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const auto [b, e] = ranges[r];
    void* m = nullptr;
    ASSERT_EQ(::posix_memalign(&m, 4096, OffloadStore::read_span_bytes(e - b)), 0);
    bufs.push_back(m);
    at.push_back(store.read_async(0, b, e, m, static_cast<int>(r % OffloadStore::kReadTags)));
  }
  for (int t = 0; t < OffloadStore::kReadTags; ++t) store.wait_read(t);
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    for (std::int64_t i = ranges[r].first; i < ranges[r].second; ++i) {
      ASSERT_EQ(at[r][i - ranges[r].first], static_cast<float>(i) + 0.5f) << "range " << r;
    }
    std::free(bufs[r]);
  }
  EXPECT_EQ(store.stats().fetches, 5);  // the empty range reads nothing
}

// The files of a store whose process died (kill -9: no destructor ran, but its flock() died
// with it) are removed by the next store in the directory; those of live stores are kept.
TEST_P(OffloadStoreTest, StaleFilesOfAKilledRunAreRemoved) {
  OffloadStore live(config(1 << 20), "trident.11.rank0", {"params"}, 5000);
  const fs::path stale = dir_ / "trident.99999.rank3.exp_avg.bin";
  const fs::path fresh_tmp = dir_ / "trident.99999.rank4.params.bin.tmp";
  const fs::path other = dir_ / "notes.bin";
  for (const fs::path& p : {stale, fresh_tmp, other}) {
    std::FILE* f = std::fopen(p.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("left behind", f);
    std::fclose(f);
  }
  {
    OffloadStore next(config(1 << 20), "trident.12.rank0", {"params"}, 5000);
    EXPECT_FALSE(fs::exists(stale)) << "a stale file was not removed";
    EXPECT_TRUE(fs::exists(live.paths()[0])) << "a live store's file was removed";
    EXPECT_TRUE(fs::exists(fresh_tmp)) << "a file being created (under a minute old) was removed";
    EXPECT_TRUE(fs::exists(other)) << "a file that is not trident's was removed";
  }
  EXPECT_EQ(remove_stale_files(dir_.string()), 0);  // the live store's file is locked
  EXPECT_TRUE(fs::exists(live.paths()[0]));
}

INSTANTIATE_TEST_SUITE_P(Engines, OffloadStoreTest,
                         ::testing::Values(OffloadIo::kUring, OffloadIo::kThreads),
                         [](const auto& info) { return std::string(offload_io_name(info.param)); });

TEST(Offload, MissingDirectoryIsAClearError) {
  const OffloadConfig cfg{.device = OffloadDevice::kNvme, .path = "/nonexistent/offload"};
  try {
    OffloadStore store(cfg, "t", {"a"}, 10);
    FAIL() << "no error";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--offload-path /nonexistent/offload is not a directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_offload_device("disk"), core::InvalidArgument);
  EXPECT_EQ(parse_offload_device("nvme"), OffloadDevice::kNvme);
}

}  // namespace
}  // namespace trident::optim
