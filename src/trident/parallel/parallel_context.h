// ParallelContext: the communicators of one rank for a ParallelLayout (world, tp, dp, pp, the
// embedding group and, for experts, ep and edp), built once by train/ and passed down by const
// reference. No globals: every call site names its group, par.tp().all_reduce(...),
// par.dp().reduce_scatter(...).
//
// Each group has a host communicator (MPI) for scalars and control, and, once use_device() has
// run on a CUDA context, a device communicator for tensors (NCCL, or host-staged where ranks share
// a GPU: comm/device_communicator.h). tp(), dp(), pp() and embedding() are the groups' tensor
// channels (the host communicators on the CPU); *_host() and world() carry host scalars.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "trident/comm/communicator.h"
#include "trident/core/exec_context.h"
#include "trident/parallel/layout.h"

namespace trident::parallel {

class ParallelContext {
 public:
  // Collective over `world`: every rank calls it with the same layout. Splits `world` into this
  // rank's tp, dp, pp and embedding groups (named "tp", "dp", "pp", "embedding"); the rank of
  // this process in each group equals its coordinate along that axis. `world` must have
  // layout.world_size() ranks (else InvalidArgument) and must outlive the context.
  // hierarchical_dp: the dp group is a comm::HierarchicalCommunicator (host-aware all_reduce).
  ParallelContext(comm::Communicator& world, const ParallelLayout& layout,
                  bool hierarchical_dp = false);

  const ParallelLayout& layout() const { return layout_; }
  const Coord& coord() const { return coord_; }
  int rank() const { return world_->rank(); }

  // Communicators are handed out non-const from a const context: communicating changes a
  // group's sequence state, not the layout.
  comm::Communicator& world() const { return *world_; }
  comm::Communicator& tp() const { return tp_dev_ ? *tp_dev_ : *tp_; }
  comm::Communicator& dp() const { return dp_dev_ ? *dp_dev_ : *dp_; }
  comm::Communicator& pp() const { return pp_dev_ ? *pp_dev_ : *pp_; }
  // Expert parallelism (layout.h): the ranks that exchange tokens and hold different experts
  // ("ep", one rank when ep_size is 1), and the ranks holding the same experts ("edp", the dp
  // group itself when ep_size is 1).
  comm::Communicator& ep() const { return ep_dev_ ? *ep_dev_ : *ep_; }
  comm::Communicator& edp() const;
  // Context parallelism (layout.h): the ranks that hold chunks of the same samples and pass
  // key/value blocks around their ring ("cp", one rank when cp_size is 1).
  comm::Communicator& cp() const { return cp_dev_ ? *cp_dev_ : *cp_; }
  comm::Communicator& group(Axis axis) const;
  // The groups' host communicators (for host scalars); the same objects on the CPU.
  comm::Communicator& tp_host() const { return *tp_; }
  comm::Communicator& dp_host() const { return *dp_; }
  comm::Communicator& pp_host() const { return *pp_; }
  comm::Communicator& ep_host() const { return *ep_; }
  comm::Communicator& cp_host() const { return *cp_; }

  // Collective over the world: gives every group a device communicator for tensors on ctx's
  // device (a no-op on the CPU). Returns what each group got, e.g. "tp nccl, dp nccl, pp nccl".
  std::string use_device(const core::ExecContext& ctx);

  // The first and last pipeline stage of each (tp, dp) pair form an embedding group (just the
  // first when pp_size == 1): the tied input and output embeddings sum their gradients over it.
  // Middle stages have none; embedding() throws InvalidArgument there.
  bool in_embedding_group() const { return embedding_ != nullptr; }
  comm::Communicator& embedding() const;

  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == layout_.pp_size - 1; }

  // Sets the step named in CommErrors on every group; call at the top of each iteration.
  void set_step(std::int64_t step);
  // Sets --comm-timeout on every group.
  void set_timeout(double seconds);

  // "r5 tp1 dp0 pp1": the log prefix of this rank (log::Settings::coords).
  std::string coords_string() const;

 private:
  comm::Communicator* world_;
  ParallelLayout layout_;
  Coord coord_;
  std::unique_ptr<comm::Communicator> tp_, dp_, pp_, embedding_, ep_, edp_, cp_;
  std::unique_ptr<comm::Communicator> tp_dev_, dp_dev_, pp_dev_, embedding_dev_, ep_dev_, edp_dev_,
      cp_dev_;
};

}  // namespace trident::parallel
