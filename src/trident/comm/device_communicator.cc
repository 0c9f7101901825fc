#include "trident/comm/device_communicator.h"

#include <unistd.h>

#include <functional>
#include <vector>

#include "trident/core/error.h"
#ifdef TRIDENT_HAVE_DEVICE_COMM
#include "trident/comm/nccl_communicator.h"
#endif

namespace trident::comm {

DeviceCommunicator make_device_communicator(std::unique_ptr<Communicator> host,
                                            const core::ExecContext& ctx) {
  TRIDENT_CHECK(host != nullptr, "make_device_communicator: null host communicator");
  if (ctx.device.kind != core::DeviceKind::kCuda) return {std::move(host), "host"};
#ifdef TRIDENT_HAVE_DEVICE_COMM
  // Which (host, GPU) each rank of the group runs on.
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  const auto mine = static_cast<std::int64_t>(std::hash<std::string>{}(name)&0x7fffffffffffll);
  std::int64_t me[2] = {mine, ctx.device.index};
  std::vector<std::int64_t> all(static_cast<std::size_t>(2 * host->size()));
  host->all_gather(me, all.data(), 2, Datatype::kI64);
  bool distinct = true;
  for (int i = 0; i < host->size() && distinct; ++i) {
    for (int j = 0; j < i; ++j) {
      if (all[2 * static_cast<std::size_t>(i)] == all[2 * static_cast<std::size_t>(j)] &&
          all[2 * static_cast<std::size_t>(i) + 1] == all[2 * static_cast<std::size_t>(j) + 1]) {
        distinct = false;
        break;
      }
    }
  }
  if (distinct) {
    auto nccl = NcclCommunicator::create(std::move(host), ctx.device.index);
    nccl->set_compute_stream(ctx.stream);
    return {std::move(nccl), "nccl"};
  }
  return {std::make_unique<HostStagedCommunicator>(std::move(host)), "host-staged"};
#else
  throw core::Unavailable(
      "a CUDA device's communicator in a build without the CUDA backend: configure with the CUDA "
      "toolkit (nvcc on PATH), or run with --device cpu");
#endif
}

}  // namespace trident::comm
