// main() of the MPI test binaries (dist-mpi tier): every rank runs every test; rank 0 prints
// gtest's usual progress, the other ranks print only their failures, tagged "[rank r]"; all ranks
// exit with the same code (non-zero if any rank failed any test).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "trident/comm/runtime.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestStart(const ::testing::TestInfo& test) override {
    current_ = std::string(test.test_suite_name()) + "." + test.name();
  }

  // Must not call UnitTest::current_test_info() here: gtest holds its mutex while reporting.
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s %s:%d: Failure\n%s\n", rank_, current_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string current_;
};

}  // namespace

int main(int argc, char** argv) {
  trident::comm::MpiRuntime runtime(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = runtime.world_rank();
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !local_failed) {
    std::fprintf(stderr, "rank 0 passed, but another rank failed (see its [rank r] lines)\n");
  }
  return any_failed;
}
