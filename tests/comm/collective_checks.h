// Collective checks that run on any Communicator: the thread tests call them on 1..8 thread ranks,
// the MPI tests on real processes. Each rank fills x[j] = j * world + rank, so every expected
// value is a closed form; the values stay below 2^24, so f32 results compare exactly.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "trident/comm/communicator.h"
#include "trident/core/bf16.h"

namespace trident::comm::testing {

// The count sweep for a group of `world` ranks: 0, 1, < world, not divisible by world, large.
inline std::vector<std::int64_t> sweep_counts(int world) {
  std::vector<std::int64_t> c = {0, 1, std::max(world - 1, 1), 2 * world + 1, 10000};
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

// Uneven per-rank counts for the _v collectives, including zeros: base + rank % 3 - (rank == 1).
inline std::vector<std::int64_t> uneven_counts(int world, std::int64_t base) {
  std::vector<std::int64_t> c;
  for (int r = 0; r < world; ++r) c.push_back(std::max<std::int64_t>(0, base + r % 3 - (r == 1)));
  return c;
}

// One failure per call at most: names the check, the rank and the first wrong element.
template <class T, class F>
void expect_values(const std::vector<T>& got, F expected, const std::string& what,
                   const Communicator& c) {
  for (std::size_t j = 0; j < got.size(); ++j) {
    const T want = static_cast<T>(expected(static_cast<std::int64_t>(j)));
    if (!(got[j] == want)) {
      ADD_FAILURE() << what << " on group '" << c.name() << "' (size " << c.size() << ", rank "
                    << c.rank() << "): element " << j << " of " << got.size() << " is " << +got[j]
                    << ", expected " << +want;
      return;
    }
  }
}

template <class T>
std::vector<T> ramp(std::int64_t count, int world, int rank) {
  std::vector<T> v(static_cast<std::size_t>(count));
  for (std::int64_t j = 0; j < count; ++j)
    v[static_cast<std::size_t>(j)] = static_cast<T>(j * world + rank);
  return v;
}

template <class T>
void check_all_reduce_typed(Communicator& c, std::int64_t count) {
  const std::int64_t w = c.size();
  const std::string tag = std::string("all_reduce ") + datatype_name(datatype_of<T>()) + " count " +
                          std::to_string(count);
  std::vector<T> x = ramp<T>(count, c.size(), c.rank());
  c.all_reduce(std::span<T>(x), ReduceOp::kSum);
  expect_values(
      x, [&](std::int64_t j) { return j * w * w + w * (w - 1) / 2; }, tag + " sum", c);
  x = ramp<T>(count, c.size(), c.rank());
  c.all_reduce(std::span<T>(x), ReduceOp::kMax);
  expect_values(
      x, [&](std::int64_t j) { return j * w + w - 1; }, tag + " max", c);
  x = ramp<T>(count, c.size(), c.rank());
  c.all_reduce(x.data(), count, datatype_of<T>(), ReduceOp::kMin);
  expect_values(
      x, [&](std::int64_t j) { return j * w; }, tag + " min", c);
}

inline void check_all_reduce(Communicator& c, std::int64_t count) {
  check_all_reduce_typed<float>(c, count);
  check_all_reduce_typed<double>(c, count);
  check_all_reduce_typed<std::int32_t>(c, count);
  check_all_reduce_typed<std::int64_t>(c, count);
}

// Block r of the reduce-scatter input is elements [r * count, (r + 1) * count) of the ramp.
inline void check_reduce_scatter(Communicator& c, std::int64_t count) {
  const std::int64_t w = c.size(), r = c.rank();
  const std::string tag = "reduce_scatter count " + std::to_string(count);
  const std::vector<float> in = ramp<float>(w * count, c.size(), c.rank());
  std::vector<float> out(static_cast<std::size_t>(count), -1.0f);
  c.reduce_scatter(std::span<const float>(in), std::span<float>(out), ReduceOp::kSum);
  expect_values(
      out, [&](std::int64_t j) { return (r * count + j) * w * w + w * (w - 1) / 2; }, tag, c);
  EXPECT_EQ(in, ramp<float>(w * count, c.size(), c.rank())) << tag << ": input was modified";

  // In place: the output is this rank's own block of the input (the ZeRO gradient shard).
  std::vector<double> buf = ramp<double>(w * count, c.size(), c.rank());
  double* own = buf.data() + r * count;
  c.reduce_scatter(buf.data(), own, count, Datatype::kF64, ReduceOp::kMax);
  std::vector<double> got(own, own + count);
  expect_values(
      got, [&](std::int64_t j) { return (r * count + j) * w + w - 1; }, tag + " in place max", c);
}

inline void check_reduce_scatter_v(Communicator& c, std::int64_t base) {
  const std::int64_t w = c.size();
  const std::vector<std::int64_t> counts = uneven_counts(c.size(), base);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  std::int64_t offset = 0;
  for (int q = 0; q < c.rank(); ++q) offset += counts[static_cast<std::size_t>(q)];
  const std::string tag = "reduce_scatter_v base " + std::to_string(base);
  const std::vector<std::int64_t> in = ramp<std::int64_t>(total, c.size(), c.rank());
  std::vector<std::int64_t> out(
      static_cast<std::size_t>(counts[static_cast<std::size_t>(c.rank())]));
  c.reduce_scatter_v(in.data(), out.data(), counts, Datatype::kI64, ReduceOp::kSum);
  expect_values(
      out, [&](std::int64_t j) { return (offset + j) * w * w + w * (w - 1) / 2; }, tag, c);
  // In place.
  std::vector<std::int64_t> buf = ramp<std::int64_t>(total, c.size(), c.rank());
  std::int64_t* own = buf.data() + offset;
  c.reduce_scatter_v(buf.data(), own, counts, Datatype::kI64, ReduceOp::kMin);
  std::vector<std::int64_t> got(own, own + out.size());
  expect_values(
      got, [&](std::int64_t j) { return (offset + j) * w; }, tag + " in place min", c);
}

inline void check_all_gather(Communicator& c, std::int64_t count) {
  const std::int64_t w = c.size();
  const std::string tag = "all_gather count " + std::to_string(count);
  const std::vector<float> in = ramp<float>(count, c.size(), c.rank());
  std::vector<float> out(static_cast<std::size_t>(w * count), -1.0f);
  c.all_gather(std::span<const float>(in), std::span<float>(out));
  // out[q * count + j] = j * w + q
  expect_values(
      out, [&](std::int64_t i) { return (i % count) * w + i / count; }, tag, c);

  // In place, bf16 (moved bit-exactly; values are small integers, exact in bf16).
  std::vector<core::bf16> buf(static_cast<std::size_t>(w * count), core::bf16::from_float(-1));
  for (std::int64_t j = 0; j < count; ++j) {
    buf[static_cast<std::size_t>(c.rank() * count + j)] =
        core::bf16::from_float(static_cast<float>((j % 16) * w + c.rank()));
  }
  c.all_gather(buf.data() + c.rank() * count, buf.data(), count, Datatype::kBF16);
  std::vector<float> as_float;
  for (core::bf16 b : buf) as_float.push_back(b.to_float());
  expect_values(
      as_float, [&](std::int64_t i) { return ((i % count) % 16) * w + i / count; },
      tag + " in place bf16", c);
}

inline void check_all_gather_v(Communicator& c, std::int64_t base) {
  const std::vector<std::int64_t> counts = uneven_counts(c.size(), base);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  const std::string tag = "all_gather_v base " + std::to_string(base);
  // Rank q contributes counts[q] values 1000 * q + j; expected out is that, block by block.
  std::vector<std::int32_t> expected;
  for (int q = 0; q < c.size(); ++q) {
    for (std::int64_t j = 0; j < counts[static_cast<std::size_t>(q)]; ++j) {
      expected.push_back(static_cast<std::int32_t>(1000 * q + j));
    }
  }
  std::vector<std::int32_t> in;
  for (std::int64_t j = 0; j < counts[static_cast<std::size_t>(c.rank())]; ++j) {
    in.push_back(static_cast<std::int32_t>(1000 * c.rank() + j));
  }
  std::vector<std::int32_t> out(static_cast<std::size_t>(total), -1);
  c.all_gather_v(in.data(), out.data(), counts, Datatype::kI32);
  expect_values(
      out, [&](std::int64_t i) { return expected[static_cast<std::size_t>(i)]; }, tag, c);
  // In place.
  std::vector<std::int32_t> buf(static_cast<std::size_t>(total), -1);
  std::int64_t offset = 0;
  for (int q = 0; q < c.rank(); ++q) offset += counts[static_cast<std::size_t>(q)];
  std::copy(in.begin(), in.end(), buf.begin() + offset);
  c.all_gather_v(buf.data() + offset, buf.data(), counts, Datatype::kI32);
  expect_values(
      buf, [&](std::int64_t i) { return expected[static_cast<std::size_t>(i)]; }, tag + " in place",
      c);
}

// Rank a sends rank b (base + 3a + b) % 7 values (some blocks empty when base is 0), each
// 1e6 a + 1e3 b + j: every rank knows the whole count matrix, so it checks what it receives.
inline void check_all_to_all_v(Communicator& c, std::int64_t base) {
  const int w = c.size(), me = c.rank();
  auto count = [&](int a, int b) { return (base + 3 * a + b) % 7 + (base > 0 ? base : 0); };
  auto value = [](int a, int b, std::int64_t j) {
    return static_cast<double>(1000000 * a + 1000 * b + j);
  };
  std::vector<std::int64_t> send_counts, recv_counts;
  std::vector<double> in, expected;
  for (int b = 0; b < w; ++b) {
    send_counts.push_back(count(me, b));
    for (std::int64_t j = 0; j < count(me, b); ++j) in.push_back(value(me, b, j));
  }
  for (int a = 0; a < w; ++a) {
    recv_counts.push_back(count(a, me));
    for (std::int64_t j = 0; j < count(a, me); ++j) expected.push_back(value(a, me, j));
  }
  std::vector<double> out(expected.size(), -1.0);
  c.all_to_all_v(in.data(), send_counts, out.data(), recv_counts, Datatype::kF64);
  expect_values(
      out, [&](std::int64_t i) { return expected[static_cast<std::size_t>(i)]; },
      "all_to_all_v base " + std::to_string(base), c);
  // Non-blocking, twice in flight.
  std::vector<double> out2(expected.size(), -1.0), out3(expected.size(), -1.0);
  Request r2 = c.iall_to_all_v(in.data(), send_counts, out2.data(), recv_counts, Datatype::kF64);
  Request r3 = c.iall_to_all_v(in.data(), send_counts, out3.data(), recv_counts, Datatype::kF64);
  r3.wait();
  r2.wait();
  EXPECT_EQ(out2, expected) << "iall_to_all_v on rank " << me;
  EXPECT_EQ(out3, expected) << "second iall_to_all_v on rank " << me;
}

inline void check_broadcast(Communicator& c, std::int64_t count) {
  const std::int64_t w = c.size();
  for (int root : {0, c.size() - 1, c.size() / 2}) {
    std::vector<float> x = ramp<float>(count, c.size(), c.rank());
    c.broadcast(std::span<float>(x), root);
    expect_values(
        x, [&](std::int64_t j) { return j * w + root; },
        "broadcast count " + std::to_string(count) + " root " + std::to_string(root), c);
  }
}

// Ring exchange with isend/irecv (every rank sends first), then a blocking ping-pong between
// pairs, then two tags received in the opposite order of sending.
inline void check_p2p(Communicator& c, std::int64_t count) {
  const int w = c.size(), r = c.rank();
  if (w == 1) return;
  const std::string tag = "p2p count " + std::to_string(count);
  const int next = (r + 1) % w, prev = (r + w - 1) % w;
  const std::vector<double> mine = ramp<double>(count, w, r);
  std::vector<double> got(static_cast<std::size_t>(count), -1.0);
  Request rr = c.irecv(got.data(), count, Datatype::kF64, prev, 3);
  Request sr = c.isend(mine.data(), count, Datatype::kF64, next, 3);
  sr.wait();
  rr.wait();
  expect_values(
      got, [&](std::int64_t j) { return j * w + prev; }, tag + " ring", c);

  // Blocking pairs (0,1), (2,3), ...; an odd last rank sits out.
  const int partner = r ^ 1;
  if (partner < w) {
    std::vector<std::int64_t> back(static_cast<std::size_t>(count), -1);
    const std::vector<std::int64_t> v = ramp<std::int64_t>(count, w, r);
    if (r % 2 == 0) {
      c.send(std::span<const std::int64_t>(v), partner, 5);
      c.recv(std::span<std::int64_t>(back), partner, 5);
    } else {
      c.recv(std::span<std::int64_t>(back), partner, 5);
      c.send(std::span<const std::int64_t>(v), partner, 5);
    }
    expect_values(
        back, [&](std::int64_t j) { return j * w + partner; }, tag + " pair", c);

    // Two messages on tags 1 and 2, received 2 first: matching is by tag, not arrival.
    std::vector<float> a(static_cast<std::size_t>(count), -1),
        b(static_cast<std::size_t>(count), -1);
    const std::vector<float> va = ramp<float>(count, w, 100 + r),
                             vb = ramp<float>(count, w, 200 + r);
    Request s1 = c.isend(va.data(), count, Datatype::kF32, partner, 1);
    Request s2 = c.isend(vb.data(), count, Datatype::kF32, partner, 2);
    c.recv(b.data(), count, Datatype::kF32, partner, 2);
    c.recv(a.data(), count, Datatype::kF32, partner, 1);
    s1.wait();
    s2.wait();
    expect_values(
        a, [&](std::int64_t j) { return j * w + 100 + partner; }, tag + " tag 1", c);
    expect_values(
        b, [&](std::int64_t j) { return j * w + 200 + partner; }, tag + " tag 2", c);
  }
}

// Gradient buckets: several non-blocking all-reduces in flight, completed in reverse order.
inline void check_nonblocking_buckets(Communicator& c, std::int64_t count) {
  const std::int64_t w = c.size();
  constexpr int kBuckets = 4;
  std::vector<std::vector<float>> buckets;
  for (int b = 0; b < kBuckets; ++b)
    buckets.push_back(ramp<float>(count + b, c.size(), c.rank() + b));
  std::vector<Request> reqs;
  for (auto& bucket : buckets)
    reqs.push_back(c.iall_reduce(std::span<float>(bucket), ReduceOp::kSum));
  for (int b = kBuckets - 1; b >= 0; --b) {
    while (!reqs[static_cast<std::size_t>(b)].test()) std::this_thread::yield();
    EXPECT_TRUE(reqs[static_cast<std::size_t>(b)].done());
  }
  for (int b = 0; b < kBuckets; ++b) {
    expect_values(
        buckets[static_cast<std::size_t>(b)],
        [&](std::int64_t j) { return j * w * w + w * (w - 1) / 2 + w * b; },
        "bucket " + std::to_string(b), c);
  }
  // Non-blocking reduce-scatter and all-gather (the ZeRO step), waited together.
  std::vector<float> grads = ramp<float>(w * count, c.size(), c.rank());
  std::vector<float> shard(static_cast<std::size_t>(count));
  Request rs = c.ireduce_scatter(grads.data(), shard.data(), count, Datatype::kF32, ReduceOp::kSum);
  rs.wait();
  std::vector<float> params(static_cast<std::size_t>(w * count));
  Request ag = c.iall_gather(shard.data(), params.data(), count, Datatype::kF32);
  Request done[] = {std::move(ag)};
  wait_all(done);
  expect_values(
      params, [&](std::int64_t j) { return j * w * w + w * (w - 1) / 2; },
      "reduce_scatter + all_gather", c);
}

// Splits by rank parity with keys reversing the order, then reduces inside each half.
inline void check_split(Communicator& c) {
  const int w = c.size(), r = c.rank();
  std::unique_ptr<Communicator> half = c.split(r % 2, -r, "half");
  ASSERT_NE(half, nullptr);
  std::vector<int> members;  // parent ranks with my parity, by decreasing rank
  for (int q = w - 1; q >= 0; --q) {
    if (q % 2 == r % 2) members.push_back(q);
  }
  EXPECT_EQ(half->name(), "half");
  ASSERT_EQ(half->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[static_cast<std::size_t>(half->rank())], r);
  for (std::size_t i = 0; i < members.size(); ++i) {
    EXPECT_EQ(half->group().global_ranks[i],
              c.group().global_ranks[static_cast<std::size_t>(members[i])]);
  }
  std::vector<std::int64_t> v = {r};
  half->all_reduce(std::span<std::int64_t>(v), ReduceOp::kSum);
  EXPECT_EQ(v[0], std::accumulate(members.begin(), members.end(), std::int64_t{0}));

  // Only rank 0 joins a group; the others get nullptr.
  std::unique_ptr<Communicator> solo = c.split(r == 0 ? 7 : Communicator::kNoColor, 0, "solo");
  EXPECT_EQ(solo != nullptr, r == 0);
  if (solo) {
    EXPECT_EQ(solo->size(), 1);
  }
  c.barrier();
}

// Every check over the count sweep; what the dist-thread and dist-mpi tiers both run.
inline void check_everything(Communicator& c) {
  for (std::int64_t count : sweep_counts(c.size())) {
    check_all_reduce(c, count);
    check_reduce_scatter(c, count);
    check_all_gather(c, count);
    check_broadcast(c, count);
    check_p2p(c, count);
    check_nonblocking_buckets(c, count);
  }
  for (std::int64_t base : {0, 1, 5, 1000}) {
    check_reduce_scatter_v(c, base);
    check_all_gather_v(c, base);
    check_all_to_all_v(c, base);
  }
  check_split(c);
  c.barrier();
}

}  // namespace trident::comm::testing
