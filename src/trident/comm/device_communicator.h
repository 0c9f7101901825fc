// The communicator of a group for tensors on a device: on the CPU the group's host communicator
// itself; on a CUDA device, NCCL when every rank of the group owns a GPU of its own (by host and
// device index), else the host-staged communicator (ranks that share a GPU: NCCL refuses them).
// Collective over the group. The host communicator stays the group's channel for host scalars
// and control (parallel::ParallelContext keeps both).
#pragma once

#include <memory>
#include <string>

#include "trident/comm/communicator.h"
#include "trident/core/exec_context.h"

namespace trident::comm {

struct DeviceCommunicator {
  std::unique_ptr<Communicator> comm;
  std::string kind;  // "nccl" or "host-staged"
};

// `host`: a communicator of the group that the device communicator owns (a duplicate of the
// group's host communicator). Operations of a NCCL communicator order after the work queued on
// ctx.stream. Throws core::Unavailable for a CUDA context in a build without CUDA.
DeviceCommunicator make_device_communicator(std::unique_ptr<Communicator> host,
                                            const core::ExecContext& ctx);

}  // namespace trident::comm
