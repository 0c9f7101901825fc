// CPU rotary embeddings on a fused QKV with grouped heads expanded: OpenMP over rows; each row's
// cos/sin are computed once (head_dim / 2 of them) and applied to every head. See rope.h.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <span>

#include "trident/core/error.h"
#include "trident/kernels/cpu/cpu_ops.h"
#include "trident/kernels/cpu_util.h"

namespace trident::kernels::TRIDENT_CPU_ISA {

namespace {

// cos/sin of pos * inv_freq[i], angle and trigonometry in double (both are rounded to FP32 once).
void angles(const RopeQkvShape& s, std::int64_t row, float* cs, float* sn) {
  const std::int64_t half = s.head_dim / 2;
  const double pos =
      static_cast<double>(s.positions ? s.positions[row] : s.position + row % s.seq_len);
  for (std::int64_t i = 0; i < half; ++i) {
    const double a = pos * static_cast<double>(s.inv_freq[i]);
    cs[i] = static_cast<float>(std::cos(a));
    sn[i] = static_cast<float>(std::sin(a));
  }
}

// y = rotate(x) (sign = +1) or its transpose (sign = -1).
inline void rotate(float* y, const float* x, const float* cs, const float* sn, std::int64_t half,
                   float sign) {
#pragma omp simd
  for (std::int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half], s = sign * sn[i];
    y[i] = x1 * cs[i] - x2 * s;
    y[i + half] = x2 * cs[i] + x1 * s;
  }
}

}  // namespace

void rope_qkv_forward(const ExecContext& ctx, const RopeQkvForwardArgs& args) {
  const RopeQkvShape& s = args.shape;
  const std::int64_t HS = s.head_dim, half = HS / 2, hpg = s.heads_per_group;
  const std::size_t bytes = static_cast<std::size_t>(HS) * sizeof(float);
  // Per-thread cos/sin rows from the context's workspace: no allocation once warm.
  const int threads = detail::num_threads(ctx);
  core::Workspace& ws = ctx.scratch();
  ws.prepare(threads, 2);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const std::span<float> cs(ws.floats(t, 0, static_cast<std::size_t>(half)),
                              static_cast<std::size_t>(half));
    const std::span<float> sn(ws.floats(t, 1, static_cast<std::size_t>(half)),
                              static_cast<std::size_t>(half));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < s.rows; ++r) {
      if (s.inv_freq) angles(s, r, cs.data(), sn.data());
      const float* in = args.in + r * s.in_cols();
      float* out = args.out + r * s.out_cols();
      for (std::int64_t g = 0; g < s.groups; ++g) {
        const float* grp = in + g * (hpg + 2) * HS;
        const float* k = grp + hpg * HS;
        const float* v = k + HS;
        for (std::int64_t h = 0; h < hpg; ++h) {
          float* o = out + (g * hpg + h) * 3 * HS;
          if (s.inv_freq) {
            rotate(o, grp + h * HS, cs.data(), sn.data(), half, 1.0f);
            rotate(o + HS, k, cs.data(), sn.data(), half, 1.0f);
          } else {
            std::memcpy(o, grp + h * HS, bytes);
            std::memcpy(o + HS, k, bytes);
          }
          std::memcpy(o + 2 * HS, v, bytes);
        }
      }
    }
  }
}

void rope_qkv_backward(const ExecContext& ctx, const RopeQkvBackwardArgs& args) {
  const RopeQkvShape& s = args.shape;
  const std::int64_t HS = s.head_dim, half = HS / 2, hpg = s.heads_per_group;
  const int threads = detail::num_threads(ctx);
  core::Workspace& ws = ctx.scratch();
  ws.prepare(threads, 3);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const auto n_half = static_cast<std::size_t>(half), n_hs = static_cast<std::size_t>(HS);
    const std::span<float> cs(ws.floats(t, 0, n_half), n_half), sn(ws.floats(t, 1, n_half), n_half),
        dk(ws.floats(t, 2, n_hs), n_hs);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < s.rows; ++r) {
      if (s.inv_freq) angles(s, r, cs.data(), sn.data());
      const float* d_out = args.d_out + r * s.out_cols();
      float* d_in = args.d_in + r * s.in_cols();
      for (std::int64_t g = 0; g < s.groups; ++g) {
        float* grp = d_in + g * (hpg + 2) * HS;
        float* k = grp + hpg * HS;
        float* v = k + HS;
        // The group's key and value gradients: the sums over its query heads (rotated back once).
        for (std::int64_t i = 0; i < HS; ++i) k[i] = v[i] = 0.0f;
        for (std::int64_t h = 0; h < hpg; ++h) {
          const float* o = d_out + (g * hpg + h) * 3 * HS;
#pragma omp simd
          for (std::int64_t i = 0; i < HS; ++i) {
            k[i] += o[HS + i];
            v[i] += o[2 * HS + i];
          }
          if (s.inv_freq) {
            rotate(grp + h * HS, o, cs.data(), sn.data(), half, -1.0f);
          } else {
            std::memcpy(grp + h * HS, o, static_cast<std::size_t>(HS) * sizeof(float));
          }
        }
        if (s.inv_freq) {
          std::memcpy(dk.data(), k, static_cast<std::size_t>(HS) * sizeof(float));
          rotate(k, dk.data(), cs.data(), sn.data(), half, -1.0f);
        }
      }
    }
  }
}

}  // namespace trident::kernels::TRIDENT_CPU_ISA
