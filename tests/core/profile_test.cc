// core::profile: entries keyed by op name and GEMM shape, exclusive times of nested scopes, no
// recording while disabled or from another thread.
#include "trident/core/profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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

}  // namespace
}  // namespace trident::core::profile
