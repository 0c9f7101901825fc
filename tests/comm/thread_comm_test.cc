// dist-thread tier: every collective on ThreadCommunicator worlds of 1..8 ranks over the count
// sweep, the failure paths (timeouts, mismatches, early exits, exceptions) and argument checks.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "trident/comm/thread_communicator.h"

namespace trident::comm {
namespace {

using namespace trident::comm::testing;
using Clock = std::chrono::steady_clock;

// Generous for real work, short enough that a broken test fails instead of hanging CI.
WaitPolicy test_policy() { return WaitPolicy{.timeout_s = 30.0}; }

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class ThreadCollectives : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCollectives, AllReduce) {
  run_on_threads(
      GetParam(),
      [](Communicator& c) {
        for (std::int64_t n : sweep_counts(c.size())) check_all_reduce(c, n);
      },
      test_policy());
}

TEST_P(ThreadCollectives, ReduceScatter) {
  run_on_threads(
      GetParam(),
      [](Communicator& c) {
        for (std::int64_t n : sweep_counts(c.size())) check_reduce_scatter(c, n);
        for (std::int64_t base : {0, 1, 5, 1000}) check_reduce_scatter_v(c, base);
      },
      test_policy());
}

TEST_P(ThreadCollectives, AllGather) {
  run_on_threads(
      GetParam(),
      [](Communicator& c) {
        for (std::int64_t n : sweep_counts(c.size())) check_all_gather(c, n);
        for (std::int64_t base : {0, 1, 5, 1000}) check_all_gather_v(c, base);
      },
      test_policy());
}

TEST_P(ThreadCollectives, AllToAllV) {
  run_on_threads(
      GetParam(),
      [](Communicator& c) {
        for (std::int64_t base : {0, 1, 5, 1000}) check_all_to_all_v(c, base);
      },
      test_policy());
}

TEST_P(ThreadCollectives, Broadcast) {
  run_on_threads(
      GetParam(),
      [](Communicator& c) {
        for (std::int64_t n : sweep_counts(c.size())) check_broadcast(c, n);
      },
      test_policy());
}

TEST_P(ThreadCollectives, PointToPoint) {
  run_on_threads(
      GetParam(),
      [](Communicator& c) {
        for (std::int64_t n : sweep_counts(c.size())) check_p2p(c, n);
      },
      test_policy());
}

TEST_P(ThreadCollectives, NonBlockingBuckets) {
  run_on_threads(
      GetParam(),
      [](Communicator& c) {
        for (std::int64_t n : sweep_counts(c.size())) check_nonblocking_buckets(c, n);
      },
      test_policy());
}

TEST_P(ThreadCollectives, SplitAndBarrier) {
  run_on_threads(
      GetParam(),
      [](Communicator& c) {
        check_split(c);
        c.barrier();
      },
      test_policy());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadCollectives, ::testing::Range(1, 9),
                         [](const auto& p) { return "world" + std::to_string(p.param); });

TEST(ThreadCommunicator, AllRanksGetBitwiseIdenticalSums) {
  // Values whose f32 sum depends on the order of addition: every rank must still agree.
  std::vector<std::vector<float>> results(5);
  run_on_threads(
      5,
      [&](Communicator& c) {
        std::vector<float> x(1000);
        for (std::size_t j = 0; j < x.size(); ++j) {
          x[j] = 1.0f / static_cast<float>(j + 1) + static_cast<float>(c.rank()) * 1e7f;
        }
        c.all_reduce(std::span<float>(x), ReduceOp::kSum);
        results[static_cast<std::size_t>(c.rank())] = x;
      },
      test_policy());
  for (std::size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r], results[0]) << r;
}

TEST(ThreadCommunicator, TimeoutNamesCollectiveGroupRanksAndStep) {
  std::vector<std::string> errors(3);
  std::vector<double> waited(3);
  run_on_threads(
      3,
      [&](Communicator& world) {
        std::unique_ptr<Communicator> dp = world.split(0, world.rank(), "dp");
        dp->set_timeout(0.3);
        dp->set_step(42);
        std::vector<float> x(8, 1.0f);
        if (world.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(900));
        const Clock::time_point t0 = Clock::now();
        try {
          dp->all_reduce(std::span<float>(x), ReduceOp::kSum);
        } catch (const core::CommError& e) {
          errors[static_cast<std::size_t>(world.rank())] = e.what();
        }
        waited[static_cast<std::size_t>(world.rank())] = seconds_since(t0);
      },
      test_policy());
  // Ranks 0 and 1 wait together: the first to reach its timeout reports it and withdraws, after
  // which the other may see the withdrawal just before its own timeout fires. Both messages
  // carry the full context.
  int timed_out = 0;
  for (int r : {0, 1}) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    EXPECT_NE(e.find("all_reduce(count=8, f32, sum) on group 'dp' (global ranks [0, 1, 2]; this "
                     "rank: " +
                     std::to_string(r)),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("at step 42"), std::string::npos) << e;
    const bool own = e.find("timed out after 0.3 s (--comm-timeout)") != std::string::npos;
    EXPECT_TRUE(own || e.find("gave up on this collective") != std::string::npos) << e;
    timed_out += own ? 1 : 0;
    EXPECT_GE(waited[static_cast<std::size_t>(r)], 0.25);
    EXPECT_LT(waited[static_cast<std::size_t>(r)], 0.85);
  }
  EXPECT_GE(timed_out, 1);
  // The late rank finds the collective abandoned and fails at once instead of waiting for its own
  // timeout (which would say "timed out").
  EXPECT_NE(errors[2].find("gave up on this collective after its timeout"), std::string::npos)
      << errors[2];
}

TEST(ThreadCommunicator, RecvTimeoutNamesPeer) {
  std::string error;
  run_on_threads(
      2,
      [&](Communicator& c) {
        c.set_step(7);
        if (c.rank() == 0) {
          c.set_timeout(0.2);
          std::vector<double> x(3);
          try {
            c.recv(std::span<double>(x), 1, 4);
          } catch (const core::CommError& e) {
            error = e.what();
          }
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));  // never sends
        }
      },
      test_policy());
  EXPECT_NE(error.find("recv(count=3, f64, tag 4) from peer 1 (global 1)"), std::string::npos)
      << error;
  EXPECT_NE(error.find("at step 7"), std::string::npos) << error;
  EXPECT_NE(error.find("the peer has not posted the send"), std::string::npos) << error;
}

TEST(ThreadCommunicator, MismatchedCollectivesFailOnEveryRank) {
  std::vector<std::string> errors(2);
  run_on_threads(
      2,
      [&](Communicator& c) {
        std::vector<float> x(4 + static_cast<std::size_t>(c.rank()));
        try {
          c.all_reduce(std::span<float>(x), ReduceOp::kSum);
        } catch (const core::CommError& e) {
          errors[static_cast<std::size_t>(c.rank())] = e.what();
        }
      },
      test_policy());
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("collective mismatch"), std::string::npos) << e;
    EXPECT_NE(e.find("all_reduce(count=4, f32, sum)"), std::string::npos) << e;
    EXPECT_NE(e.find("all_reduce(count=5, f32, sum)"), std::string::npos) << e;
  }
}

TEST(ThreadCommunicator, AllToAllVCountsThatDoNotPairUpFailOnEveryRank) {
  std::vector<std::string> errors(3);
  run_on_threads(
      3,
      [&](Communicator& c) {
        // Rank 2 expects 4 elements from rank 0, which sends it 2.
        std::vector<std::int64_t> send{2, 2, 2}, recv{c.rank() == 2 ? 4 : 2, 2, 2};
        std::vector<float> in(6, 1.0f), out(8);
        try {
          c.all_to_all_v(in.data(), send, out.data(), recv, Datatype::kF32);
        } catch (const core::CommError& e) {
          errors[static_cast<std::size_t>(c.rank())] = e.what();
        }
      },
      test_policy());
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("all_to_all_v count mismatch on group 'world': rank"), std::string::npos) << e;
    EXPECT_NE(e.find("which expects 4"), std::string::npos) << e;
  }
}

TEST(ThreadCommunicator, MismatchedMessageSizesFail) {
  std::vector<std::string> errors(2);
  run_on_threads(
      2,
      [&](Communicator& c) {
        std::vector<std::int32_t> x(c.rank() == 0 ? 3 : 5);
        try {
          if (c.rank() == 0) {
            c.send(std::span<std::int32_t>(x), 1);
          } else {
            c.recv(std::span<std::int32_t>(x), 0);
          }
        } catch (const core::CommError& e) {
          errors[static_cast<std::size_t>(c.rank())] = e.what();
        }
      },
      test_policy());
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("sends 3 i32 but rank 1 (global 1) receives 5 i32"), std::string::npos) << e;
  }
}

TEST(ThreadCommunicator, RankThatReturnsEarlyFailsItsPeersAtOnce) {
  std::string error;
  const Clock::time_point t0 = Clock::now();
  run_on_threads(
      3,
      [&](Communicator& c) {
        if (c.rank() == 1) return;  // skips the barrier
        try {
          c.barrier();
        } catch (const core::CommError& e) {
          if (c.rank() == 0) error = e.what();
        }
      },
      test_policy());
  EXPECT_LT(seconds_since(t0), 5.0);  // the policy's timeout is 30 s
  EXPECT_NE(error.find("rank 1 (global 1) returned without joining this collective"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("barrier on group 'world'"), std::string::npos) << error;
}

TEST(ThreadCommunicator, ExceptionOnOneRankIsRethrownAndPeersAreReleased) {
  const Clock::time_point t0 = Clock::now();
  try {
    run_on_threads(
        4,
        [](Communicator& c) {
          if (c.rank() == 2) throw std::runtime_error("boom on rank 2");
          std::vector<float> x(10);
          c.all_reduce(std::span<float>(x), ReduceOp::kSum);  // peers wait for rank 2
        },
        test_policy());
    ADD_FAILURE() << "run_on_threads did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom on rank 2");
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(ThreadCommunicator, DestroyingAPendingRequestWaitsForIt) {
  run_on_threads(
      3,
      [](Communicator& c) {
        std::vector<std::int64_t> x = {c.rank()};
        { Request r = c.iall_reduce(std::span<std::int64_t>(x), ReduceOp::kSum); }
        EXPECT_EQ(x[0], 3);
      },
      test_policy());
}

TEST(ThreadCommunicator, StepAndPolicyAreInheritedBySplit) {
  run_on_threads(
      2,
      [](Communicator& c) {
        c.set_step(11);
        c.set_timeout(12.5);
        std::unique_ptr<Communicator> g = c.split(0, 0, "tp");
        EXPECT_EQ(g->step(), 11);
        EXPECT_EQ(g->wait_policy().timeout_s, 12.5);
      },
      test_policy());
}

TEST(ThreadCommunicator, BadArgumentsThrowInvalidArgument) {
  run_on_threads(
      2,
      [](Communicator& c) {
        std::vector<float> f(8);
        std::vector<core::bf16> h(8);
        std::vector<std::int64_t> two_counts = {4, 4}, one_count = {8};
        EXPECT_THROW(c.all_reduce(h.data(), 8, Datatype::kBF16, ReduceOp::kSum),
                     core::InvalidArgument);
        EXPECT_THROW(c.all_reduce(f.data(), -1, Datatype::kF32, ReduceOp::kSum),
                     core::InvalidArgument);
        EXPECT_THROW(c.all_reduce(nullptr, 3, Datatype::kF32, ReduceOp::kSum),
                     core::InvalidArgument);
        EXPECT_THROW(c.broadcast(f.data(), 8, Datatype::kF32, 2), core::InvalidArgument);
        EXPECT_THROW(c.send(f.data(), 8, Datatype::kF32, c.rank()), core::InvalidArgument);
        EXPECT_THROW(c.send(f.data(), 8, Datatype::kF32, 5), core::InvalidArgument);
        EXPECT_THROW(c.recv(f.data(), 8, Datatype::kF32, 1 - c.rank(), -1), core::InvalidArgument);
        EXPECT_THROW(
            c.reduce_scatter_v(f.data(), f.data(), one_count, Datatype::kF32, ReduceOp::kSum),
            core::InvalidArgument);
        // Overlap other than "out is my own block" is rejected.
        EXPECT_THROW(c.reduce_scatter(f.data(), f.data() + 1, 4, Datatype::kF32, ReduceOp::kSum),
                     core::InvalidArgument);
        EXPECT_THROW(c.all_gather(f.data() + 1, f.data(), 4, Datatype::kF32),
                     core::InvalidArgument);
        EXPECT_THROW(c.reduce_scatter(std::span<const float>(f.data(), 8),
                                      std::span<float>(f.data(), 3), ReduceOp::kSum),
                     core::InvalidArgument);
        EXPECT_THROW(c.split(-5, 0, "x"), core::InvalidArgument);
        EXPECT_THROW(c.set_timeout(0), core::InvalidArgument);
        core::TensorView a{
            .data = f.data(), .dtype = core::DType::kF32, .device = {}, .shape = {8}};
        core::TensorView b{
            .data = h.data(), .dtype = core::DType::kBF16, .device = {}, .shape = {4}};
        EXPECT_THROW(c.reduce_scatter(a, b, ReduceOp::kSum), core::InvalidArgument);
        // Nothing was posted: the group still works.
        c.all_reduce(std::span<float>(f), ReduceOp::kSum);
      },
      test_policy());
}

TEST(ThreadCommunicator, TensorViewOverloads) {
  run_on_threads(
      4,
      [](Communicator& c) {
        const std::int64_t w = c.size();
        std::vector<float> in = ramp<float>(4 * 6, c.size(), c.rank());
        std::vector<float> out(6);
        core::TensorView tin{
            .data = in.data(), .dtype = core::DType::kF32, .device = {}, .shape = {4, 6}};
        core::TensorView tout{
            .data = out.data(), .dtype = core::DType::kF32, .device = {}, .shape = {6}};
        c.reduce_scatter(tin, tout, ReduceOp::kSum);
        expect_values(
            out, [&](std::int64_t j) { return (c.rank() * 6 + j) * w * w + w * (w - 1) / 2; },
            "reduce_scatter(TensorView)", c);
        c.all_gather(tout, tin);
        expect_values(
            in, [&](std::int64_t j) { return j * w * w + w * (w - 1) / 2; },
            "all_gather(TensorView)", c);
      },
      test_policy());
}

}  // namespace
}  // namespace trident::comm
