// core::profile: entries keyed by op name and GEMM shape, exclusive times of nested scopes, no
// recording while disabled or from another thread.
#include "trident/core/profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace trident::core::profile {
namespace {

void busy_ms(int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
  }
}

const Entry* find(const std::vector<Entry>& es, const std::string& name) {
  for (const Entry& e : es) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

TEST(ProfileTest, DisabledRecordsNothing) {
  set_enabled(false);
  reset();
  { const Scope s(Kind::kMemory, "off"); }
  EXPECT_TRUE(entries().empty());
}

TEST(ProfileTest, KeysSumsAndNesting) {
  set_enabled(true);
  for (int i = 0; i < 3; ++i) {
    const Scope outer(Kind::kAttention, "outer", 10.0, 0);
    busy_ms(2);
    const Scope inner(Kind::kGemm, "gemm", 2.0 * 4 * 5 * 6, 0, 4, 5, 6);
    busy_ms(20);
  }
  { const Scope other_shape(Kind::kGemm, "gemm", 1.0, 0, 4, 5, 7); }
  { const Scope mem(Kind::kMemory, "copy", 0, 64.0); }
  std::thread([] { const Scope foreign(Kind::kMemory, "foreign"); }).join();
  set_enabled(false);
  { const Scope after(Kind::kMemory, "after"); }
  const std::vector<Entry> es = entries();
  ASSERT_EQ(es.size(), 4u);  // outer, gemm 4x5x6, gemm 4x5x7, copy
  const Entry* outer = find(es, "outer");
  const Entry* gemm = find(es, "gemm 4x5x6");
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(gemm, nullptr);
  ASSERT_NE(find(es, "gemm 4x5x7"), nullptr);
  ASSERT_NE(find(es, "copy"), nullptr);
  EXPECT_EQ(find(es, "foreign"), nullptr);
  EXPECT_EQ(outer->calls, 3);
  EXPECT_EQ(gemm->calls, 3);
  EXPECT_EQ(outer->kind, Kind::kAttention);
  EXPECT_DOUBLE_EQ(outer->flops, 30.0);
  EXPECT_DOUBLE_EQ(gemm->flops, 3 * 240.0);
  EXPECT_DOUBLE_EQ(find(es, "copy")->bytes, 64.0);
  // Exclusive: the outer scope's 3 x 20 ms inside the inner one count for the inner only.
  EXPECT_GE(gemm->seconds, 0.060);
  EXPECT_GE(outer->seconds, 0.006);
  EXPECT_LT(outer->seconds, gemm->seconds);
  EXPECT_EQ(es.front().name, "gemm 4x5x6");  // sorted by time
  set_enabled(true);                         // restarting clears
  set_enabled(false);
  EXPECT_TRUE(entries().empty());
}

// A device clock whose marks are at given times (the device's timeline, not the host's): mark i
// is at times[i] seconds; counts the reads.
class FakeClock final : public DeviceTimer {
 public:
  explicit FakeClock(std::vector<double> times) : times_(std::move(times)) {}
  std::int64_t mark() override { return next_++; }
  double seconds_between(std::int64_t a, std::int64_t b) override {
    ++reads;
    EXPECT_LT(a, b);
    EXPECT_LT(b, next_) << "a mark read before it was queued";
    return times_.at(static_cast<std::size_t>(b)) - times_.at(static_cast<std::size_t>(a));
  }
  void clear() override {
    ++clears;
    next_ = 0;
  }
  int reads = 0, clears = 0;

 private:
  std::vector<double> times_;
  std::int64_t next_ = 0;
};

TEST(ProfileTest, DeviceTimerGivesTheDevicesExclusiveTimes) {
  set_enabled(true);
  // Marks in order: outer start 0, gemm start 1, gemm stop 2, outer stop 3, copy start 4, copy
  // stop 5 (seconds on the device).
  auto clock = std::make_shared<FakeClock>(std::vector<double>{0.0, 1.0, 3.5, 4.0, 10.0, 10.25});
  set_device_timer(clock);
  {
    const Scope outer(Kind::kAttention, "outer");
    const Scope inner(Kind::kGemm, "gemm", 8.0, 0, 1, 2, 4);
    busy_ms(5);  // host time: none of it counts
  }
  { const Scope copy(Kind::kMemory, "copy", 0, 32.0); }
  EXPECT_EQ(clock->reads, 0) << "the marks are read only when the entries are";
  set_enabled(false);
  set_device_timer(nullptr);  // reads the window's marks
  EXPECT_EQ(clock->reads, 3);
  const std::vector<Entry> es = entries();
  ASSERT_EQ(es.size(), 3u);
  EXPECT_DOUBLE_EQ(find(es, "gemm 1x2x4")->seconds, 2.5);
  EXPECT_DOUBLE_EQ(find(es, "outer")->seconds, 1.5);  // 4 - 0 less the gemm's 2.5
  EXPECT_DOUBLE_EQ(find(es, "copy")->seconds, 0.25);
  EXPECT_DOUBLE_EQ(find(es, "gemm 1x2x4")->flops, 8.0);
  EXPECT_EQ(find(es, "copy")->calls, 1);
  // Without a timer the scopes are the host's again.
  set_enabled(true);
  {
    const Scope host(Kind::kMemory, "host");
    busy_ms(2);
  }
  set_enabled(false);
  ASSERT_NE(find(entries(), "host"), nullptr);
  EXPECT_GE(find(entries(), "host")->seconds, 0.002);
}

}  // namespace
}  // namespace trident::core::profile
