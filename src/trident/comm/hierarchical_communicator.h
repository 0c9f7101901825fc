// HierarchicalCommunicator: a group whose all_reduce is host-aware. For a group spread over hosts
// with the same number L > 1 of members on each, all_reduce runs as
//   reduce-scatter inside the host (each member ends with 1/L of the sum over its host),
//   all-reduce of that 1/L across hosts (among the members with the same local index),
//   all-gather inside the host,
// so each host sends 1/L of the buffer per member across the link instead of the flat
// algorithm's full share (measured in docs/clusters.md). Every other operation, and all_reduce
// on groups that are not spread evenly, runs on the flat group unchanged. Sums differ from the
// flat group's only in summation order. Enabled for the data-parallel group by
// --hierarchical-dp.
#pragma once

#include <memory>
#include <string>

#include "trident/comm/communicator.h"

namespace trident::comm {

class HierarchicalCommunicator final : public Communicator {
 public:
  // Collective over `flat`: finds each member's host (by host name) and splits `flat` into the
  // host groups ("<name>-host") and the cross-host groups ("<name>-cross"). The new group is
  // named `name` and has flat's members, rank and policy; it takes ownership of `flat`. `host`:
  // this member's host name (empty: this machine's; tests give threads different hosts).
  static std::unique_ptr<HierarchicalCommunicator> create(std::unique_ptr<Communicator> flat,
                                                          const std::string& name,
                                                          const std::string& host = "");

  // True when all_reduce runs in three stages (several hosts, L > 1 members on each).
  bool hierarchical() const { return host_ != nullptr; }
  int members_per_host() const { return host_ ? host_->size() : 1; }
  int hosts() const { return cross_ ? cross_->size() : 1; }

 protected:
  ImplPtr post_all_reduce(void* buf, std::int64_t count, Datatype dtype, ReduceOp op) override;
  ImplPtr post_reduce_scatter(const void* in, void* out, std::int64_t count, Datatype dtype,
                              ReduceOp op) override;
  ImplPtr post_reduce_scatter_v(const void* in, void* out, std::span<const std::int64_t> counts,
                                Datatype dtype, ReduceOp op) override;
  ImplPtr post_all_gather(const void* in, void* out, std::int64_t count, Datatype dtype) override;
  ImplPtr post_all_gather_v(const void* in, void* out, std::span<const std::int64_t> counts,
                            Datatype dtype) override;
  ImplPtr post_all_to_all_v(const void* in, std::span<const std::int64_t> send_counts, void* out,
                            std::span<const std::int64_t> recv_counts, Datatype dtype) override;
  ImplPtr post_broadcast(void* buf, std::int64_t count, Datatype dtype, int root) override;
  ImplPtr post_send(const void* buf, std::int64_t count, Datatype dtype, int peer,
                    int tag) override;
  ImplPtr post_recv(void* buf, std::int64_t count, Datatype dtype, int peer, int tag) override;
  ImplPtr post_barrier() override;
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& new_name) override;

 private:
  HierarchicalCommunicator(std::unique_ptr<Communicator> flat, const std::string& name);

  std::unique_ptr<Communicator> flat_, host_, cross_;
};

}  // namespace trident::comm
