// ParallelContext checks that run on any world communicator (threads or MPI processes): the
// groups match the layout's arithmetic, and a reduction in each group sums exactly its members.
#pragma once

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "trident/parallel/parallel_context.h"

namespace trident::parallel::testing {

// Sums the world ranks over `group` with an all-reduce and compares with the layout's list.
inline void expect_group_sum(comm::Communicator& group, const std::vector<int>& members,
                             int world_rank) {
  std::vector<std::int64_t> v = {world_rank, 1};
  group.all_reduce(std::span<std::int64_t>(v), comm::ReduceOp::kSum);
  EXPECT_EQ(v[0], std::accumulate(members.begin(), members.end(), std::int64_t{0}))
      << "group '" << group.name() << "' on world rank " << world_rank;
  EXPECT_EQ(v[1], static_cast<std::int64_t>(members.size())) << group.name();
}

inline void check_context(comm::Communicator& world, const ParallelLayout& layout) {
  ParallelContext par(world, layout);
  const int r = world.rank();
  const Coord c = layout.coord_of(r);
  EXPECT_EQ(par.coord(), c);
  EXPECT_EQ(par.tp().rank(), c.tp);
  EXPECT_EQ(par.dp().rank(), c.dp);
  EXPECT_EQ(par.pp().rank(), c.pp);
  EXPECT_EQ(par.tp().size(), layout.tp_size);
  EXPECT_EQ(par.dp().size(), layout.dp_size);
  EXPECT_EQ(par.pp().size(), layout.pp_size);
  EXPECT_EQ(par.tp().name(), "tp");
  EXPECT_EQ(par.dp().name(), "dp");
  EXPECT_EQ(par.pp().name(), "pp");
  for (Axis axis : {Axis::kTp, Axis::kDp, Axis::kPp}) {
    EXPECT_EQ(par.group(axis).group().global_ranks, layout.group_of(r, axis)) << axis_name(axis);
  }
  // Order matters: every rank reduces over tp, dp, pp, embedding in this order.
  expect_group_sum(par.tp(), layout.group_of(r, Axis::kTp), r);
  expect_group_sum(par.dp(), layout.group_of(r, Axis::kDp), r);
  expect_group_sum(par.pp(), layout.group_of(r, Axis::kPp), r);
  const std::vector<int> emb = layout.embedding_group_of(r);
  EXPECT_EQ(par.in_embedding_group(), !emb.empty());
  EXPECT_EQ(par.is_first_stage(), c.pp == 0);
  EXPECT_EQ(par.is_last_stage(), c.pp == layout.pp_size - 1);
  if (par.in_embedding_group()) {
    EXPECT_EQ(par.embedding().group().global_ranks, emb);
    expect_group_sum(par.embedding(), emb, r);
  } else {
    EXPECT_THROW(par.embedding(), core::InvalidArgument);
  }

  // A pipeline hand-off: stage s sends its world rank to stage s + 1 over the pp group.
  if (layout.pp_size > 1) {
    std::vector<std::int32_t> token = {r};
    if (!par.is_first_stage()) {
      par.pp().recv(std::span<std::int32_t>(token), c.pp - 1);
      EXPECT_EQ(token[0], layout.rank_of({.tp = c.tp, .dp = c.dp, .pp = c.pp - 1}));
      token[0] = r;
    }
    if (!par.is_last_stage()) par.pp().send(std::span<std::int32_t>(token), c.pp + 1);
  }

  // Expert groups: ep (one rank without expert parallelism) and edp (dp itself then).
  EXPECT_EQ(par.ep().size(), layout.ep_size);
  EXPECT_EQ(par.ep().rank(), layout.ep_rank(c));
  EXPECT_EQ(par.edp().size(), layout.edp_size());
  EXPECT_EQ(par.edp().rank(), layout.edp_rank(c));
  if (layout.ep_size > 1) {
    for (Axis axis : {Axis::kEp, Axis::kEdp}) {
      EXPECT_EQ(par.group(axis).group().global_ranks, layout.group_of(r, axis)) << axis_name(axis);
    }
    expect_group_sum(par.ep(), layout.group_of(r, Axis::kEp), r);
    expect_group_sum(par.edp(), layout.group_of(r, Axis::kEdp), r);
  }

  // Context parallelism: the cp group (one rank without it).
  EXPECT_EQ(par.cp().size(), layout.cp_size);
  EXPECT_EQ(par.cp().rank(), layout.cp_rank(c));
  if (layout.cp_size > 1) {
    EXPECT_EQ(par.group(Axis::kCp).group().global_ranks, layout.group_of(r, Axis::kCp));
    expect_group_sum(par.cp(), layout.group_of(r, Axis::kCp), r);
  }

  par.set_step(77);
  EXPECT_EQ(par.tp().step(), 77);
  EXPECT_EQ(par.pp().step(), 77);
  EXPECT_EQ(world.step(), 77);
  par.world().barrier();
}

// Every layout (tp, pp) whose product divides the world size, with every ep dividing its dp.
inline std::vector<ParallelLayout> layouts_for(int world_size) {
  std::vector<ParallelLayout> out;
  for (int tp = 1; tp <= world_size; ++tp) {
    for (int pp = 1; pp <= world_size; ++pp) {
      if (world_size % (tp * pp) != 0) continue;
      ParallelLayout l = ParallelLayout::from_world_size(world_size, tp, pp);
      // Each expert-parallel size that divides dp.
      for (int ep = 1; ep <= l.dp_size; ++ep) {
        if (l.dp_size % ep != 0) continue;
        l.ep_size = ep;
        out.push_back(l);
      }
      l.ep_size = 1;
      // Each context-parallel size above 1 that divides dp.
      for (int cp = 2; cp <= l.dp_size; ++cp) {
        if (l.dp_size % cp != 0) continue;
        l.cp_size = cp;
        out.push_back(l);
      }
      l.cp_size = 1;
    }
  }
  return out;
}

}  // namespace trident::parallel::testing
