// ParallelContext: four splits of the world communicator, in a fixed order on every rank.
#include "trident/parallel/parallel_context.h"

#include "trident/comm/device_communicator.h"
#include "trident/comm/hierarchical_communicator.h"
#include "trident/core/error.h"

namespace trident::parallel {

namespace {

// The split puts ranks of a group in world-rank order (key = world rank), so the communicator's
// rank is the coordinate along the axis; check that against the layout.
void check_group(const comm::Communicator& c, const std::vector<int>& expected, int my_index) {
  TRIDENT_ASSERT(c.group().global_ranks == expected && c.rank() == my_index, "group '", c.name(),
                 "' does not match the layout (rank ", c.rank(), ", expected ", my_index, ")");
}

}  // namespace

ParallelContext::ParallelContext(comm::Communicator& world, const ParallelLayout& layout,
                                 bool hierarchical_dp)
    : world_(&world), layout_(layout) {
  layout_.validate();
  TRIDENT_CHECK(world.size() == layout_.world_size(), "layout ", layout_, " needs ",
                layout_.world_size(), " ranks but the world has ", world.size());
  const int r = world.rank();
  coord_ = layout_.coord_of(r);
  tp_ = world.split(layout_.group_index(r, Axis::kTp), r, "tp");
  if (hierarchical_dp) {
    dp_ = comm::HierarchicalCommunicator::create(
        world.split(layout_.group_index(r, Axis::kDp), r, "dp-flat"), "dp");
  } else {
    dp_ = world.split(layout_.group_index(r, Axis::kDp), r, "dp");
  }
  pp_ = world.split(layout_.group_index(r, Axis::kPp), r, "pp");
  const bool in_embedding = !layout_.embedding_group_of(r).empty();
  embedding_ =
      world.split(in_embedding ? layout_.group_index(r, Axis::kPp) : comm::Communicator::kNoColor,
                  r, "embedding");
  // ep: a group of one rank without expert parallelism; edp is then the dp group itself.
  ep_ = world.split(layout_.ep_size > 1 ? layout_.group_index(r, Axis::kEp) : r, r, "ep");
  if (layout_.ep_size > 1) edp_ = world.split(layout_.group_index(r, Axis::kEdp), r, "edp");
  // cp: a group of one rank without context parallelism.
  cp_ = world.split(layout_.cp_size > 1 ? layout_.group_index(r, Axis::kCp) : r, r, "cp");

  // Group ranks are world-communicator ranks mapped through the world's global ranks.
  auto to_global = [&](const std::vector<int>& ranks) {
    std::vector<int> g;
    for (int x : ranks) g.push_back(world.group().global_ranks[static_cast<std::size_t>(x)]);
    return g;
  };
  check_group(*tp_, to_global(layout_.group_of(r, Axis::kTp)), coord_.tp);
  check_group(*dp_, to_global(layout_.group_of(r, Axis::kDp)), coord_.dp);
  check_group(*pp_, to_global(layout_.group_of(r, Axis::kPp)), coord_.pp);
  if (embedding_) {
    check_group(*embedding_, to_global(layout_.embedding_group_of(r)), coord_.pp == 0 ? 0 : 1);
  }
  if (edp_) {
    check_group(*ep_, to_global(layout_.group_of(r, Axis::kEp)), layout_.ep_rank(coord_));
    check_group(*edp_, to_global(layout_.group_of(r, Axis::kEdp)), layout_.edp_rank(coord_));
  }
  if (layout_.cp_size > 1) {
    check_group(*cp_, to_global(layout_.group_of(r, Axis::kCp)), layout_.cp_rank(coord_));
  }
}

comm::Communicator& ParallelContext::edp() const {
  if (!edp_) return dp();
  return edp_dev_ ? *edp_dev_ : *edp_;
}

comm::Communicator& ParallelContext::group(Axis axis) const {
  switch (axis) {
    case Axis::kTp:
      return tp();
    case Axis::kDp:
      return dp();
    case Axis::kPp:
      return pp();
    case Axis::kEp:
      return ep();
    case Axis::kEdp:
      return edp();
    case Axis::kCp:
      return cp();
  }
  TRIDENT_ASSERT(false, "unhandled axis ", static_cast<int>(axis));
  return tp();
}

comm::Communicator& ParallelContext::embedding() const {
  TRIDENT_CHECK(embedding_ != nullptr, "rank ", rank(), " (", coord_,
                ") is a middle pipeline stage and has no embedding group; only the first and "
                "last stage do (check in_embedding_group())");
  return embedding_dev_ ? *embedding_dev_ : *embedding_;
}

std::string ParallelContext::use_device(const core::ExecContext& ctx) {
  if (ctx.device.kind != core::DeviceKind::kCuda) return "host";
  // In the same order on every rank: tp, dp, pp, then the embedding group's members (the split
  // that makes it is collective over the world).
  std::string kinds;
  auto make = [&](const std::unique_ptr<comm::Communicator>& host, const char* name,
                  std::unique_ptr<comm::Communicator>& out) {
    comm::DeviceCommunicator d =
        comm::make_device_communicator(host->split(0, host->rank(), host->name()), ctx);
    out = std::move(d.comm);
    kinds += core::str(kinds.empty() ? "" : ", ", name, " ", d.kind);
  };
  make(tp_, "tp", tp_dev_);
  make(dp_, "dp", dp_dev_);
  make(pp_, "pp", pp_dev_);
  if (embedding_) make(embedding_, "embedding", embedding_dev_);
  if (edp_) {
    make(ep_, "ep", ep_dev_);
    make(edp_, "edp", edp_dev_);
  }
  if (layout_.cp_size > 1) make(cp_, "cp", cp_dev_);
  return kinds;
}

void ParallelContext::set_step(std::int64_t step) {
  world_->set_step(step);
  for (auto* c : {&tp_, &dp_, &pp_, &embedding_, &ep_, &edp_, &cp_, &tp_dev_, &dp_dev_, &pp_dev_,
                  &embedding_dev_, &ep_dev_, &edp_dev_, &cp_dev_}) {
    if (*c) (*c)->set_step(step);
  }
}

void ParallelContext::set_timeout(double seconds) {
  world_->set_timeout(seconds);
  for (auto* c : {&tp_, &dp_, &pp_, &embedding_, &ep_, &edp_, &cp_, &tp_dev_, &dp_dev_, &pp_dev_,
                  &embedding_dev_, &ep_dev_, &edp_dev_, &cp_dev_}) {
    if (*c) (*c)->set_timeout(seconds);
  }
}

std::string ParallelContext::coords_string() const {
  std::string s = core::str("r", rank(), " tp", coord_.tp, " dp", coord_.dp, " pp", coord_.pp);
  if (layout_.ep_size > 1) s += core::str(" ep", layout_.ep_rank(coord_));
  if (layout_.cp_size > 1) s += core::str(" cp", layout_.cp_rank(coord_));
  return s;
}

}  // namespace trident::parallel
