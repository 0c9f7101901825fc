#include "trident/train/launch_env.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "trident/core/error.h"

namespace trident::train {

namespace fs = std::filesystem;
using core::str;

std::string launcher_mismatch(int mpi_world_size, const char* (*getenv_fn)(const char*)) {
  const char* ws = getenv_fn("WORLD_SIZE");
  if (ws == nullptr || mpi_world_size > 1) return {};
  long n = 0;
  try {
    n = std::stol(ws);
  } catch (const std::exception&) {
    return {};
  }
  if (n <= 1) return {};
  const char* rank = getenv_fn("RANK");
  const bool deepspeed = getenv_fn("DS_ACCELERATOR") != nullptr ||
                         getenv_fn("CROSS_RANK") != nullptr ||
                         getenv_fn("DEEPSPEED_ENV") != nullptr;
  const char* who = getenv_fn("TORCHELASTIC_RUN_ID") != nullptr ? "torchrun"
                    : deepspeed                                 ? "the deepspeed launcher"
                                                                : "a PyTorch launcher";
  return str("this process was started by ", who, " (WORLD_SIZE=", ws,
             rank ? str(", RANK=", rank) : std::string(),
             "), but trident takes its ranks from MPI and sees a world of 1: each of the ", n,
             " processes would train alone. Start trident with the MPI launcher instead: "
             "mpirun -np ",
             n, " trident train ... (or srun -n ", n,
             " under Slurm; one node: mpirun -np N; several nodes: mpirun -np N --hostfile "
             "HOSTS). See docs/training.md");
}

std::string describe_foreign_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  const fs::path d(dir);
  if (fs::exists(d / "latest_checkpointed_iteration.txt", ec)) {
    std::ifstream in(d / "latest_checkpointed_iteration.txt");
    std::string it;
    std::getline(in, it);
    // trident writes the same tracker file; its iteration directories hold manifest.json.
    try {
      char name[32];
      std::snprintf(name, sizeof(name), "iter_%07lld", std::stoll(it));
      if (fs::exists(d / name / "manifest.json", ec)) return {};
    } catch (const std::exception&) {
      // "release" (Megatron's converted checkpoints) or junk: not trident's
    }
    bool deepspeed = false;
    for (const auto& e : fs::recursive_directory_iterator(d, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("layer_", 0) == 0 || name.find("model_states.pt") != std::string::npos ||
          name.find("optim_states.pt") != std::string::npos) {
        deepspeed = true;
        break;
      }
    }
    return str("this is a ", deepspeed ? "Megatron-DeepSpeed" : "Megatron-LM",
               " checkpoint (latest_checkpointed_iteration.txt: ", it,
               "); trident cannot read it (PyTorch pickles). Start from scratch with another "
               "--load directory, or drop --load");
  }
  if (fs::exists(d / "latest", ec) || fs::exists(d / "latest_universal", ec)) {
    return "this is a DeepSpeed checkpoint (a 'latest' tag file); trident cannot read it "
           "(PyTorch pickles). Start from scratch with another --load directory, or drop --load";
  }
  return {};
}

}  // namespace trident::train
