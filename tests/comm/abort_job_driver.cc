// Test driver: rank 1 calls abort_job while rank 0 waits in a barrier with a long timeout. The
// whole job must end at once with rank 1's message printed once (checked by expect_abort.cmake).
#include <chrono>
#include <cstdio>
#include <thread>

#include "trident/comm/mpi_communicator.h"
#include "trident/comm/runtime.h"

int main(int argc, char** argv) {
  using namespace trident::comm;
  MpiRuntime runtime(argc, argv);
  std::unique_ptr<MpiCommunicator> world =
      MpiCommunicator::world(runtime, WaitPolicy{.timeout_s = 60.0});
  if (world->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    abort_job(3, "deliberate failure on rank 1 (abort_job test)");
  }
  world->barrier();  // never completes: rank 1 does not join; MPI_Abort must end this rank
  std::printf("rank %d: NOT ABORTED\n", world->rank());
  return 0;
}
