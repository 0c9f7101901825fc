// Accelerators and clusters the planner knows: dense peak, memory capacity and bandwidth, and the
// default interconnect of the usual 8-GPU system (NVLink inside a node, InfiniBand between nodes).
// Sources are cited in docs/plan.md; `cpu` stands for this kind of machine and takes its numbers
// from a calibration run instead (plan/calibration.h).
#pragma once

#include <string>
#include <vector>

namespace trident::plan {

struct Hardware {
  std::string name;
  bool is_cpu = false;
  double peak_tflops = 0;    // dense BF16 (GPUs); FP32 GEMM, measured (cpu)
  double memory_bytes = 0;   // HBM capacity (GPUs); installed memory (cpu)
  double memory_bw = 0;      // bytes/s
  int gpus_per_node = 8;     // ranks per node
  double intra_bw = 0;       // bytes/s per GPU and direction inside a node (NVLink)
  double intra_latency = 0;  // seconds per message step
  double inter_bw = 0;       // bytes/s per GPU and direction between nodes (InfiniBand)
  double inter_latency = 0;  // seconds
  // Model constants (documented in docs/plan.md): best achieved fraction of the peak on large
  // GEMMs, the size at which a GEMM dimension reaches half of it, the attention kernel's fraction
  // of the peak, and the fraction of the memory bandwidth element-wise kernels reach.
  double gemm_efficiency = 0.8;
  double gemm_half_size = 64;
  double attention_efficiency = 0.5;
  double bandwidth_efficiency = 0.8;
  double comm_efficiency = 0.8;  // achieved fraction of the link rate in ring collectives
  double reserved_bytes = 0;     // runtime context, library workspaces (not trident's tables)
  // --offload-optimizer nvme: the offload disk's bytes/s, reads and writes together (a PCIe 3
  // NVMe's order; plan --offload-disk-bandwidth).
  double offload_disk_bw = 2e9;
  std::string source;
};

// The known accelerators: A100-40GB, A100-80GB, H100-SXM, H200, B200 (and their aliases).
const std::vector<Hardware>& known_hardware();
// Looks `name` up (case-insensitive); throws InvalidArgument listing the known names.
Hardware find_hardware(const std::string& name);

}  // namespace trident::plan
