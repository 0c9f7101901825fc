// cuemu's own API, for tests of the emulator and for test code that must know it runs emulated.
// Only the emulated build (TRIDENT_CUDA_EMU) has it; its presence is TRIDENT_CUDA_EMULATED.
#pragma once

#include <cstdint>
#include <string>

namespace cuemu {

bool emulated();
// Waits for every stream, then clears every device's sticky error and this thread's last error
// (a GPU cannot recover from a kernel fault; the emulator's tests provoke several per process).
void reset_errors();
// Faults found since the process started (each also printed to stderr unless CUEMU_QUIET=1).
std::uint64_t fault_count();
// The message of the device's sticky fault, or "".
std::string last_fault(int device = 0);
std::int64_t device_bytes_in_use(int device = 0);
std::int64_t device_bytes_peak(int device = 0);

}  // namespace cuemu
