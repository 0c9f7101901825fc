// ParallelLayout: the rank formula, group enumeration and validation, over many layouts.
#include "trident/parallel/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "trident/core/error.h"

namespace trident::parallel {
namespace {

using Groups = std::vector<std::vector<int>>;

// Every layout with tp * dp * pp <= 64.
std::vector<ParallelLayout> many_layouts() {
  std::vector<ParallelLayout> out;
  for (int tp = 1; tp <= 64; ++tp)
    for (int dp = 1; tp * dp <= 64; ++dp)
      for (int pp = 1; tp * dp * pp <= 64; ++pp) out.push_back({tp, dp, pp});
  return out;
}

TEST(ParallelLayout, MegatronExample16RanksTp2Pp4) {
  // megatron.md §4.2: 16 ranks, TP=2, PP=4 -> DP=2.
  const ParallelLayout l = ParallelLayout::from_world_size(16, 2, 4);
  EXPECT_EQ(l, (ParallelLayout{.tp_size = 2, .dp_size = 2, .pp_size = 4}));
  EXPECT_EQ(l.groups(Axis::kTp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(l.groups(Axis::kPp),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(l.groups(Axis::kDp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  for (int r : {0, 1, 2, 3}) EXPECT_EQ(l.embedding_group_of(r), (std::vector<int>{r, r + 12}));
  for (int r : {12, 13, 14, 15}) EXPECT_EQ(l.embedding_group_of(r), (std::vector<int>{r - 12, r}));
  for (int r = 4; r < 12; ++r) EXPECT_TRUE(l.embedding_group_of(r).empty()) << r;
}

TEST(ParallelLayout, FormulaAndCoordinates) {
  const ParallelLayout l{.tp_size = 4, .dp_size = 3, .pp_size = 2};
  // rank = tp + tp_size * (dp + dp_size * pp)
  EXPECT_EQ(l.rank_of({.tp = 1, .dp = 2, .pp = 1}), 1 + 4 * (2 + 3 * 1));
  EXPECT_EQ(l.coord_of(23), (Coord{.tp = 3, .dp = 2, .pp = 1}));
  EXPECT_EQ(l.coord_of(0), (Coord{}));
  std::ostringstream os;
  os << l.coord_of(13) << " / " << l;
  EXPECT_EQ(os.str(), "tp1 dp0 pp1 / tp=4 dp=3 pp=2");
}

TEST(ParallelLayout, RoundTripsAndGroupsPartitionTheWorld) {
  for (const ParallelLayout& l : many_layouts()) {
    SCOPED_TRACE(::testing::Message() << l);
    const int n = l.world_size();
    for (int r = 0; r < n; ++r) {
      const Coord c = l.coord_of(r);
      ASSERT_TRUE(c.tp >= 0 && c.tp < l.tp_size && c.dp >= 0 && c.dp < l.dp_size && c.pp >= 0 &&
                  c.pp < l.pp_size);
      ASSERT_EQ(l.rank_of(c), r);
    }
    for (Axis axis : {Axis::kTp, Axis::kDp, Axis::kPp}) {
      const Groups groups = l.groups(axis);
      ASSERT_EQ(static_cast<int>(groups.size()), n / l.size_of(axis));
      std::vector<int> seen(static_cast<std::size_t>(n), 0);
      for (std::size_t gi = 0; gi < groups.size(); ++gi) {
        const std::vector<int>& g = groups[gi];
        ASSERT_EQ(static_cast<int>(g.size()), l.size_of(axis));
        ASSERT_TRUE(std::is_sorted(g.begin(), g.end()));
        if (gi > 0) {
          ASSERT_LT(groups[gi - 1].front(), g.front());  // ordered by first rank
        }
        for (std::size_t i = 0; i < g.size(); ++i) {
          const int r = g[i];
          ++seen[static_cast<std::size_t>(r)];
          // Position in the group is the coordinate along the axis; other coordinates agree.
          ASSERT_EQ(l.coord_along(l.coord_of(r), axis), static_cast<int>(i));
          ASSERT_EQ(l.group_of(r, axis), g);
          ASSERT_EQ(l.group_index(r, axis), static_cast<int>(gi));
          for (Axis other : {Axis::kTp, Axis::kDp, Axis::kPp}) {
            if (other != axis) {
              ASSERT_EQ(l.coord_along(l.coord_of(r), other),
                        l.coord_along(l.coord_of(g[0]), other));
            }
          }
        }
      }
      ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    }
    // tp groups are blocks of consecutive ranks (one node).
    for (const auto& g : l.groups(Axis::kTp)) ASSERT_EQ(g.back() - g.front(), l.tp_size - 1);
  }
}

TEST(ParallelLayout, ExpertAxesSplitDpAsMegatronCore) {
  // 8 ranks, tp=2, dp=4, ep=2 (Megatron-Core, expert tp = tp: "tp-ep-dp-pp").
  const ParallelLayout l{.tp_size = 2, .dp_size = 4, .pp_size = 1, .ep_size = 2};
  EXPECT_EQ(l.groups(Axis::kEp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(Axis::kEdp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  std::ostringstream os;
  os << l;
  EXPECT_EQ(os.str(), "tp=2 dp=4 pp=1 ep=2");
  // ep=4 over the same 8 ranks with tp=2: one ep group per tp rank, expert-dp of one.
  const ParallelLayout l4{.tp_size = 2, .dp_size = 4, .pp_size = 1, .ep_size = 4};
  EXPECT_EQ(l4.groups(Axis::kEp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l4.groups(Axis::kEdp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));

  for (const ParallelLayout& base : many_layouts()) {
    for (int ep = 2; ep <= base.dp_size; ++ep) {
      if (base.dp_size % ep != 0) continue;
      ParallelLayout l2 = base;
      l2.ep_size = ep;
      SCOPED_TRACE(::testing::Message() << l2);
      for (Axis axis : {Axis::kEp, Axis::kEdp}) {
        const Groups groups = l2.groups(axis);
        ASSERT_EQ(static_cast<int>(groups.size()), l2.world_size() / l2.size_of(axis));
        std::vector<int> seen(static_cast<std::size_t>(l2.world_size()), 0);
        for (std::size_t gi = 0; gi < groups.size(); ++gi) {
          const std::vector<int>& g = groups[gi];
          ASSERT_TRUE(std::is_sorted(g.begin(), g.end()));
          if (gi > 0) ASSERT_LT(groups[gi - 1].front(), g.front());
          for (std::size_t i = 0; i < g.size(); ++i) {
            ++seen[static_cast<std::size_t>(g[i])];
            const Coord c = l2.coord_of(g[i]), c0 = l2.coord_of(g[0]);
            ASSERT_EQ(l2.coord_along(c, axis), static_cast<int>(i));
            ASSERT_EQ(l2.group_index(g[i], axis), static_cast<int>(gi));
            // Same tp, pp and the other expert coordinate: a sub-group of the rank's dp group.
            ASSERT_EQ(c.tp, c0.tp);
            ASSERT_EQ(c.pp, c0.pp);
            const Axis other = axis == Axis::kEp ? Axis::kEdp : Axis::kEp;
            ASSERT_EQ(l2.coord_along(c, other), l2.coord_along(c0, other));
            ASSERT_EQ(c.dp, l2.ep_rank(c) + l2.ep_size * l2.edp_rank(c));
          }
        }
        ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; }));
      }
    }
  }
  try {
    (ParallelLayout{.tp_size = 1, .dp_size = 6, .pp_size = 1, .ep_size = 4}).validate();
    ADD_FAILURE() << "no exception";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "expert-model-parallel size 4 does not divide the data-parallel size 6"),
              std::string::npos)
        << e.what();
  }
}

TEST(ParallelLayout, ContextAxisSplitsDpAsMegatronCore) {
  // 8 ranks, tp=2, dp=4 (2 data-parallel x cp 2): Megatron-Core's "tp-cp-dp-pp".
  const ParallelLayout l{.tp_size = 2, .dp_size = 4, .pp_size = 1, .cp_size = 2};
  EXPECT_EQ(l.groups(Axis::kCp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.data_size(), 2);
  EXPECT_EQ(l.data_rank(l.coord_of(4)), 1);
  EXPECT_EQ(l.cp_rank(l.coord_of(6)), 1);
  std::ostringstream os;
  os << l;
  EXPECT_EQ(os.str(), "tp=2 dp=4 pp=1 cp=2");
  for (const ParallelLayout& base : many_layouts()) {
    for (int cp = 2; cp <= base.dp_size; ++cp) {
      if (base.dp_size % cp != 0) continue;
      ParallelLayout l2 = base;
      l2.cp_size = cp;
      SCOPED_TRACE(::testing::Message() << l2);
      const Groups groups = l2.groups(Axis::kCp);
      ASSERT_EQ(static_cast<int>(groups.size()), l2.world_size() / cp);
      std::vector<int> seen(static_cast<std::size_t>(l2.world_size()), 0);
      for (std::size_t gi = 0; gi < groups.size(); ++gi) {
        const std::vector<int>& g = groups[gi];
        ASSERT_TRUE(std::is_sorted(g.begin(), g.end()));
        if (gi > 0) ASSERT_LT(groups[gi - 1].front(), g.front());
        for (std::size_t i = 0; i < g.size(); ++i) {
          ++seen[static_cast<std::size_t>(g[i])];
          const Coord c = l2.coord_of(g[i]), c0 = l2.coord_of(g[0]);
          ASSERT_EQ(l2.cp_rank(c), static_cast<int>(i));
          ASSERT_EQ(l2.group_index(g[i], Axis::kCp), static_cast<int>(gi));
          // The same tp, pp and data rank: the ranks that read the same samples.
          ASSERT_EQ(c.tp, c0.tp);
          ASSERT_EQ(c.pp, c0.pp);
          ASSERT_EQ(l2.data_rank(c), l2.data_rank(c0));
          ASSERT_EQ(c.dp, l2.cp_rank(c) + cp * l2.data_rank(c));
        }
      }
      ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; }));
    }
  }
  for (const auto& [bad, what] :
       {std::pair{ParallelLayout{.tp_size = 1, .dp_size = 6, .pp_size = 1, .cp_size = 4},
                  std::string("context-parallel size 4 does not divide the 6 ranks")},
        std::pair{
            ParallelLayout{.tp_size = 1, .dp_size = 4, .pp_size = 1, .ep_size = 2, .cp_size = 2},
            std::string("with context parallelism (cp 2) is not supported yet")}}) {
    try {
      bad.validate();
      ADD_FAILURE() << "no exception for " << bad;
    } catch (const core::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

TEST(ParallelLayout, EmbeddingGroups) {
  for (const ParallelLayout& l : many_layouts()) {
    SCOPED_TRACE(::testing::Message() << l);
    int members = 0;
    for (int r = 0; r < l.world_size(); ++r) {
      const Coord c = l.coord_of(r);
      const std::vector<int> g = l.embedding_group_of(r);
      const bool edge = c.pp == 0 || c.pp == l.pp_size - 1;
      ASSERT_EQ(!g.empty(), edge);
      if (!edge) continue;
      ++members;
      ASSERT_EQ(g.size(), l.pp_size == 1 ? 1u : 2u);
      ASSERT_NE(std::find(g.begin(), g.end(), r), g.end());
      ASSERT_EQ(l.coord_of(g.front()).pp, 0);
      ASSERT_EQ(l.coord_of(g.back()).pp, l.pp_size - 1);
      ASSERT_EQ(l.coord_of(g.front()).tp, c.tp);
      ASSERT_EQ(l.coord_of(g.back()).dp, c.dp);
    }
    ASSERT_EQ(members, l.tp_size * l.dp_size * (l.pp_size == 1 ? 1 : 2));
  }
}

TEST(ParallelLayout, FromWorldSizeRejectsLayoutsThatDoNotDivide) {
  try {
    static_cast<void>(ParallelLayout::from_world_size(6, 4, 1));
    ADD_FAILURE() << "no exception";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 is not divisible by tp 4 x pp 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(static_cast<void>(ParallelLayout::from_world_size(8, 2, 3)), core::InvalidArgument);
  EXPECT_THROW(static_cast<void>(ParallelLayout::from_world_size(8, 0, 1)), core::InvalidArgument);
  EXPECT_THROW(static_cast<void>(ParallelLayout::from_world_size(8, 1, -2)), core::InvalidArgument);
  EXPECT_THROW(static_cast<void>(ParallelLayout::from_world_size(0, 1, 1)), core::InvalidArgument);
  EXPECT_THROW((ParallelLayout{.tp_size = 2, .dp_size = 0, .pp_size = 1}).validate(),
               core::InvalidArgument);
  EXPECT_THROW(static_cast<void>(ParallelLayout{}.group_of(1, Axis::kTp)), core::InvalidArgument);
  EXPECT_EQ(ParallelLayout::from_world_size(12, 2, 3).dp_size, 2);
}

}  // namespace
}  // namespace trident::parallel
