// A complete `--gpu cpu` calibration with round numbers (every kernel 1 us, copy 10 GB/s), for
// tests that need a valid calibration without timing anything.
#pragma once

#include "trident/plan/calibration.h"

namespace trident::plan::testing {

inline Calibration flat_kernels(int cores) {
  Calibration c;
  c.cores = cores;
  c.grid = {1, 1 << 20};
  c.linear_fwd_s.assign(8, 1e-6);
  c.linear_bwd_s.assign(8, 1e-6);
  c.attn_seq = {1, 1 << 20};
  c.attn_head_dim = {1, 1 << 20};
  for (auto* v : {&c.attn_fwd_s, &c.attn_bwd_s, &c.flash_fwd_s, &c.flash_bwd_s}) v->assign(4, 1e-6);
  c.memory_bw = 1e10;
  c.peak_tflops = 0.1;
  return c;
}

}  // namespace trident::plan::testing
