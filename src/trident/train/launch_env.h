// What a Megatron / DeepSpeed launch leaves behind that trident must not silently ignore: the
// torchrun / deepspeed launcher's environment (WORLD_SIZE, RANK) around a one-process MPI world,
// and Megatron or DeepSpeed checkpoint directories given to --load.
#pragma once

#include <string>

namespace trident::train {

// Empty when fine; otherwise the error text for a process that torchrun / deepspeed / the
// PyTorch launcher started (WORLD_SIZE > 1) while MPI sees a world of `mpi_world_size`.
// `getenv` is injectable for tests.
std::string launcher_mismatch(int mpi_world_size, const char* (*getenv_fn)(const char*));

// Empty when `dir` holds no Megatron-LM / Megatron-DeepSpeed / DeepSpeed checkpoint; otherwise a
// sentence saying which it is and that trident cannot read it.
std::string describe_foreign_checkpoint(const std::string& dir);

}  // namespace trident::train
