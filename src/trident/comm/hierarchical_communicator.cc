#include "trident/comm/hierarchical_communicator.h"

#include <cstring>
#include <vector>

#include "trident/core/log.h"

namespace trident::comm {

namespace {

constexpr int kHostBytes = 64;

// A posted operation of an inner communicator, as this communicator's pending request.
class Wrapped final : public detail::RequestImpl {
 public:
  explicit Wrapped(Request r) : r_(std::move(r)) {}
  bool test() override { return r_.test(); }

 private:
  Request r_;
};

std::unique_ptr<detail::RequestImpl> wrap(Request r) {
  if (r.done()) return nullptr;
  return std::make_unique<Wrapped>(std::move(r));
}

// The three-stage all_reduce, advanced by test().
class ThreeStage final : public detail::RequestImpl {
 public:
  ThreeStage(Communicator& host, Communicator& cross, void* buf, std::int64_t count, Datatype dtype,
             ReduceOp op)
      : host_(host), cross_(cross), buf_(static_cast<std::byte*>(buf)), dtype_(dtype), op_(op) {
    const int l = host.size();
    counts_.assign(static_cast<std::size_t>(l), count / l);
    for (std::int64_t i = 0; i < count % l; ++i) ++counts_[static_cast<std::size_t>(i)];
    for (int i = 0; i < host.rank(); ++i) offset_ += counts_[static_cast<std::size_t>(i)];
    offset_ *= size_of(dtype);
    stage_ = host_.ireduce_scatter_v(buf_, buf_ + offset_, counts_, dtype_, op_);
  }

  bool test() override {
    for (;;) {
      if (!stage_.test()) return false;
      const std::int64_t mine = counts_[static_cast<std::size_t>(host_.rank())];
      if (step_ == 0) {
        stage_ = cross_.iall_reduce(buf_ + offset_, mine, dtype_, op_);
      } else if (step_ == 1) {
        stage_ = host_.iall_gather_v(buf_ + offset_, buf_, counts_, dtype_);
      } else {
        return true;
      }
      ++step_;
    }
  }

 private:
  Communicator& host_;
  Communicator& cross_;
  std::byte* buf_;
  Datatype dtype_;
  ReduceOp op_;
  std::vector<std::int64_t> counts_;
  std::int64_t offset_ = 0;
  int step_ = 0;
  Request stage_;
};

}  // namespace

HierarchicalCommunicator::HierarchicalCommunicator(std::unique_ptr<Communicator> flat,
                                                   const std::string& name)
    : Communicator(GroupInfo{.name = name, .global_ranks = flat->group().global_ranks},
                   flat->rank(), flat->wait_policy()),
      flat_(std::move(flat)) {
  set_step(flat_->step());
}

std::unique_ptr<HierarchicalCommunicator> HierarchicalCommunicator::create(
    std::unique_ptr<Communicator> flat, const std::string& name, const std::string& host) {
  TRIDENT_CHECK(flat != nullptr, "HierarchicalCommunicator: no group");
  const int n = flat->size(), me = flat->rank();
  char mine[kHostBytes] = {};
  std::snprintf(mine, sizeof(mine), "%s",
                host.empty() ? log::short_hostname().c_str() : host.c_str());
  std::vector<char> all(static_cast<std::size_t>(kHostBytes * n));
  flat->all_gather(mine, all.data(), kHostBytes, Datatype::kU8);
  auto host_of = [&](int r) {
    return std::string(all.data() + static_cast<std::size_t>(r) * kHostBytes);
  };
  // Host index = first member on that host; local index = position among the host's members.
  std::vector<int> host_index(static_cast<std::size_t>(n)), local(static_cast<std::size_t>(n));
  std::vector<int> per_host(static_cast<std::size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    int first = r;
    for (int q = 0; q < r; ++q) {
      if (host_of(q) == host_of(r)) {
        first = q;
        break;
      }
    }
    host_index[static_cast<std::size_t>(r)] = first;
    local[static_cast<std::size_t>(r)] = per_host[static_cast<std::size_t>(first)]++;
  }
  int hosts = 0, l = -1;
  bool even = true;
  for (int r = 0; r < n; ++r) {
    const int c = per_host[static_cast<std::size_t>(r)];
    if (c == 0) continue;
    ++hosts;
    if (l < 0) l = c;
    even = even && c == l;
  }
  std::unique_ptr<HierarchicalCommunicator> h(new HierarchicalCommunicator(std::move(flat), name));
  const bool use = even && hosts > 1 && l > 1;
  // Collective either way (every member computed the same `use`).
  if (use) {
    h->host_ = h->flat_->split(host_index[static_cast<std::size_t>(me)], me, name + "-host");
    h->cross_ = h->flat_->split(local[static_cast<std::size_t>(me)], me, name + "-cross");
  }
  if (me == 0) {
    if (use) {
      log::info("comm: group '", name, "' all-reduces hierarchically: ", hosts, " hosts x ", l,
                " members (reduce-scatter in the host, all-reduce across, all-gather in the host)");
    } else {
      log::info("comm: group '", name, "' (", n, " members on ", hosts,
                " hosts) all-reduces flat: a hierarchy needs several hosts with the same number "
                "(> 1) of members each");
    }
  }
  return h;
}

Communicator::ImplPtr HierarchicalCommunicator::post_all_reduce(void* buf, std::int64_t count,
                                                                Datatype dtype, ReduceOp op) {
  if (!host_ || count < host_->size()) return wrap(flat_->iall_reduce(buf, count, dtype, op));
  return std::make_unique<ThreeStage>(*host_, *cross_, buf, count, dtype, op);
}

Communicator::ImplPtr HierarchicalCommunicator::post_reduce_scatter(const void* in, void* out,
                                                                    std::int64_t count,
                                                                    Datatype dtype, ReduceOp op) {
  return wrap(flat_->ireduce_scatter(in, out, count, dtype, op));
}

Communicator::ImplPtr HierarchicalCommunicator::post_reduce_scatter_v(
    const void* in, void* out, std::span<const std::int64_t> counts, Datatype dtype, ReduceOp op) {
  return wrap(flat_->ireduce_scatter_v(in, out, counts, dtype, op));
}

Communicator::ImplPtr HierarchicalCommunicator::post_all_gather(const void* in, void* out,
                                                                std::int64_t count,
                                                                Datatype dtype) {
  return wrap(flat_->iall_gather(in, out, count, dtype));
}

Communicator::ImplPtr HierarchicalCommunicator::post_all_gather_v(
    const void* in, void* out, std::span<const std::int64_t> counts, Datatype dtype) {
  return wrap(flat_->iall_gather_v(in, out, counts, dtype));
}

Communicator::ImplPtr HierarchicalCommunicator::post_all_to_all_v(
    const void* in, std::span<const std::int64_t> send_counts, void* out,
    std::span<const std::int64_t> recv_counts, Datatype dtype) {
  return wrap(flat_->iall_to_all_v(in, send_counts, out, recv_counts, dtype));
}

Communicator::ImplPtr HierarchicalCommunicator::post_broadcast(void* buf, std::int64_t count,
                                                               Datatype dtype, int root) {
  return wrap(flat_->ibroadcast(buf, count, dtype, root));
}

Communicator::ImplPtr HierarchicalCommunicator::post_send(const void* buf, std::int64_t count,
                                                          Datatype dtype, int peer, int tag) {
  return wrap(flat_->isend(buf, count, dtype, peer, tag));
}

Communicator::ImplPtr HierarchicalCommunicator::post_recv(void* buf, std::int64_t count,
                                                          Datatype dtype, int peer, int tag) {
  return wrap(flat_->irecv(buf, count, dtype, peer, tag));
}

namespace {
// A barrier as a one-element all_reduce on the flat group (the only public non-blocking form).
class Barrier final : public detail::RequestImpl {
 public:
  explicit Barrier(Communicator& flat)
      : r_(flat.iall_reduce(&x_, 1, Datatype::kF32, ReduceOp::kSum)) {}
  bool test() override { return r_.test(); }

 private:
  float x_ = 0;
  Request r_;
};
}  // namespace

Communicator::ImplPtr HierarchicalCommunicator::post_barrier() {
  return std::make_unique<Barrier>(*flat_);
}

std::unique_ptr<Communicator> HierarchicalCommunicator::do_split(int color, int key,
                                                                 const std::string& new_name) {
  return flat_->split(color, key, new_name);
}

}  // namespace trident::comm
