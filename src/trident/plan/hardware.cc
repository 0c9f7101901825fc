#include "trident/plan/hardware.h"

#include <algorithm>
#include <cctype>

#include "trident/core/error.h"

namespace trident::plan {

namespace {

constexpr double kGB = 1e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Hardware gpu(std::string name, double tflops, double mem_gb, double bw_tbs, double nvlink_gbs,
             double ib_gbits_per_gpu, double gemm_eff, std::string source) {
  Hardware h;
  h.name = std::move(name);
  h.peak_tflops = tflops;
  h.memory_bytes = mem_gb * kGB;
  h.memory_bw = bw_tbs * 1e12;
  h.gpus_per_node = 8;
  h.intra_bw = nvlink_gbs / 2 * kGB;  // datasheets quote both directions together
  h.intra_latency = 5e-6;
  h.inter_bw = ib_gbits_per_gpu / 8 * kGB;
  h.inter_latency = 10e-6;
  h.gemm_efficiency = gemm_eff;
  h.gemm_half_size = 96;
  h.attention_efficiency = 0.5;
  h.bandwidth_efficiency = 0.8;
  h.reserved_bytes = 2 * kGiB;
  h.source = std::move(source);
  return h;
}

}  // namespace

const std::vector<Hardware>& known_hardware() {
  static const std::vector<Hardware> table = {
      gpu("A100-40GB", 312, 40, 1.555, 600, 200, 0.80,
          "NVIDIA A100 Tensor Core GPU datasheet (SXM4); DGX A100: 8x HDR 200 Gb/s per node"),
      gpu("A100-80GB", 312, 80, 2.039, 600, 200, 0.80,
          "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); DGX A100: 8x HDR 200 Gb/s"),
      gpu("H100-SXM", 989, 80, 3.35, 900, 400, 0.72,
          "NVIDIA H100 Tensor Core GPU datasheet (SXM5); DGX H100: 8x NDR 400 Gb/s"),
      gpu("H200", 989, 141, 4.8, 900, 400, 0.72,
          "NVIDIA H200 Tensor Core GPU datasheet (SXM); DGX H200: 8x NDR 400 Gb/s"),
      gpu("B200", 2250, 180, 8.0, 1800, 400, 0.70,
          "NVIDIA DGX B200 datasheet (per GPU: 1/8 of the system); 8x ConnectX-7 400 Gb/s"),
  };
  return table;
}

Hardware find_hardware(const std::string& name) {
  auto norm = [](std::string s) {
    std::string out;
    for (char c : s)
      if (std::isalnum(static_cast<unsigned char>(c)))
        out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  std::string n = norm(name);
  if (n == "a100") n = "a10080gb";
  if (n == "a10040") n = "a10040gb";
  if (n == "a10080") n = "a10080gb";
  if (n == "h100" || n == "h100sxm5" || n == "h10080gb") n = "h100sxm";
  if (n == "h200sxm") n = "h200";
  std::string names;
  for (const Hardware& h : known_hardware()) {
    if (norm(h.name) == n) return h;
    names += (names.empty() ? "" : ", ") + h.name;
  }
  TRIDENT_CHECK(false, "--gpu: unknown accelerator '", name, "' (known: ", names, ", cpu)");
  return {};
}

}  // namespace trident::plan
