// Fuzz target: `trident plan --gpu cpu`'s calibration cache (~/.cache/trident/plan-cpu.json or
// $TRIDENT_PLAN_CACHE, plan/calibration.h). The first byte picks the thread count asked for
// (1 to 4), the rest is the file. A cache that loads must give a time for every GEMM and attention
// shape the time model may ask (inside, between and beyond the grid points, and its exact shapes)
// that is a number >= 0, never NaN; and saving it and loading it back must give the same values.
// TRIDENT_FUZZ_DUMP_SEED=<file> writes a valid cache (two thread counts, written by
// save_calibration with plausible timings) as a seed and exits.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fuzz_util.h"
#include "trident/plan/calibration.h"

namespace {

using namespace trident;

// A calibration as calibrate() lays it out (grid 8..2048, attention 16..1024 x {8, 32, 128}), with
// times from a simple rate model instead of a 30 s measurement.
plan::Calibration synthetic(int threads) {
  plan::Calibration c;
  c.threads = threads;
  c.cores = 2;
  c.grid = {8, 32, 128, 512, 2048};
  for (const std::int64_t r : c.grid)
    for (const std::int64_t i : c.grid)
      for (const std::int64_t o : c.grid) {
        const double flops = 2.0 * static_cast<double>(r * i * o);
        c.linear_fwd_s.push_back(2e-6 + flops / (50e9 * threads));
        c.linear_bwd_s.push_back(4e-6 + 2 * flops / (45e9 * threads));
      }
  c.attn_seq = {16, 64, 256, 1024};
  c.attn_head_dim = {8, 32, 128};
  for (const std::int64_t t : c.attn_seq)
    for (const std::int64_t d : c.attn_head_dim) {
      const double flops = 4.0 * static_cast<double>(t * t * d);
      c.attn_fwd_s.push_back(1e-6 + flops / 20e9);
      c.attn_bwd_s.push_back(2e-6 + 2.5 * flops / 20e9);
      c.flash_fwd_s.push_back(1e-6 + flops / 25e9);
      c.flash_bwd_s.push_back(2e-6 + 2.5 * flops / 22e9);
    }
  c.layernorm_fwd = {2e-6, 1.1e-9};
  c.layernorm_bwd = {3e-6, 2.3e-9};
  c.bias_gelu_fwd = {1e-6, 0.9e-9};
  c.bias_gelu_bwd = {1e-6, 1.4e-9};
  c.add = {0.5e-6, 0.4e-9};
  c.cross_entropy = {2e-6, 3e-9};
  c.adamw = {1e-6, 2e-9};
  c.embedding = c.add;
  c.linear_exact["1024,768,2304"] = {0.0061, 0.0125};
  c.linear_exact["1024,3072,768"] = {0.0081, 0.0166};
  c.attention_exact["1,48,256,64"] = {0.0021, 0.0063};
  c.attention_exact["0,48,256,64"] = {0.0034, 0.0090};
  c.memory_bw = 9.5e9;
  c.peak_tflops = 0.11 * threads;
  return c;
}

void check_time(double t) {
  if (std::isnan(t) || t < 0) __builtin_trap();
}

bool same(const plan::Calibration& a, const plan::Calibration& b) {
  auto cost = [](const plan::LinearCost& x, const plan::LinearCost& y) {
    return x.overhead_s == y.overhead_s && x.per_element_s == y.per_element_s;
  };
  return a.threads == b.threads && a.cores == b.cores && a.grid == b.grid &&
         a.linear_fwd_s == b.linear_fwd_s && a.linear_bwd_s == b.linear_bwd_s &&
         a.attn_seq == b.attn_seq && a.attn_head_dim == b.attn_head_dim &&
         a.attn_fwd_s == b.attn_fwd_s && a.attn_bwd_s == b.attn_bwd_s &&
         a.flash_fwd_s == b.flash_fwd_s && a.flash_bwd_s == b.flash_bwd_s &&
         cost(a.layernorm_fwd, b.layernorm_fwd) && cost(a.layernorm_bwd, b.layernorm_bwd) &&
         cost(a.bias_gelu_fwd, b.bias_gelu_fwd) && cost(a.bias_gelu_bwd, b.bias_gelu_bwd) &&
         cost(a.add, b.add) && cost(a.cross_entropy, b.cross_entropy) && cost(a.adamw, b.adamw) &&
         cost(a.embedding, b.embedding) && a.linear_exact == b.linear_exact &&
         a.attention_exact == b.attention_exact && a.memory_bw == b.memory_bw &&
         a.peak_tflops == b.peak_tflops;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* seed = std::getenv("TRIDENT_FUZZ_DUMP_SEED");
  if (seed == nullptr) return 0;
  const std::string path = fuzz::scratch_path("plan-cpu.json");
  plan::save_calibration(path, synthetic(1));
  plan::save_calibration(path, synthetic(2));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  std::ofstream out(seed, std::ios::binary);
  out << '\x01' << os.str();  // asks for 2 threads
  out.close();
  std::error_code ec;
  std::filesystem::remove_all(fuzz::scratch_dir(), ec);
  std::_Exit(out ? 0 : 1);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int threads = size > 0 ? 1 + data[0] % 4 : 1;
  const std::string path = fuzz::scratch_path("plan-cpu.json");
  const std::string copy = fuzz::scratch_path("plan-cpu-saved.json");
  fuzz::write_file(path, size > 0
                             ? std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1)
                             : std::string_view());
  fuzz::expect_clean_errors("fuzz_plan_cache", [&] {
    plan::Calibration c;
    if (!plan::load_calibration(path, threads, c)) return;
    if (c.threads != threads) __builtin_trap();
    // Below, between and beyond the grid; the exact shapes the file has.
    for (const std::int64_t r : {1, 100, 4096, 1 << 20})
      for (const std::int64_t i : {3, 768, 50304}) {
        check_time(c.linear_forward_s(r, i, 2 * i));
        check_time(c.linear_backward_s(r, i, 2 * i));
      }
    for (const auto& [key, t] : c.linear_exact) {
      check_time(t.first);
      check_time(t.second);
    }
    for (const bool flash : {false, true})
      for (const std::int64_t seq : {1, 100, 2048, 1 << 16})
        for (const std::int64_t hd : {4, 64, 256}) {
          check_time(c.attention_forward_s(flash, 12, seq, hd));
          check_time(c.attention_backward_s(flash, 12, seq, hd));
        }
    check_time(c.layernorm_fwd.at(1e6));
    // What save_calibration writes, load_calibration reads back unchanged.
    std::filesystem::remove(copy);
    plan::save_calibration(copy, c);
    plan::Calibration back;
    if (!plan::load_calibration(copy, threads, back) || !same(c, back)) __builtin_trap();
  });
  return 0;
}
