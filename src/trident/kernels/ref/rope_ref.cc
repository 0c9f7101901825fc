// Reference rotary QKV forward and backward (rope.h): each head rotated in double, one thread.
#include <algorithm>
#include <cmath>
#include <vector>

#include "trident/kernels/rope.h"

namespace trident::kernels::ref {

// Rotary QKV: for every query head h of group g, out[h] = (rot(q_h), rot(k_g), v_g); the
// backward is the transpose, summing the key and value gradients of a group's query heads.
namespace {
double angle(const RopeQkvShape& s, std::int64_t r, std::int64_t i) {
  const std::int64_t pos = s.positions ? s.positions[r] : s.position + r % s.seq_len;
  return static_cast<double>(pos) * static_cast<double>(s.inv_freq[i]);
}
// y = R x (transpose: R^T x) for one head; R rotates the pair (i, i + HS/2) by the angle.
void rot(const RopeQkvShape& s, std::int64_t r, const float* x, double* y, bool transpose) {
  const std::int64_t half = s.head_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    double c = 1, sn = 0;
    if (s.inv_freq) {
      c = std::cos(angle(s, r, i));
      sn = std::sin(angle(s, r, i)) * (transpose ? -1.0 : 1.0);
    }
    y[i] = x[i] * c - x[i + half] * sn;
    y[i + half] = x[i + half] * c + x[i] * sn;
  }
}
}  // namespace

void rope_qkv_forward(const RopeQkvForwardArgs& a) {
  const RopeQkvShape& s = a.shape;
  const std::int64_t HS = s.head_dim, hpg = s.heads_per_group;
  std::vector<double> y(static_cast<std::size_t>(HS));
  for (std::int64_t r = 0; r < s.rows; ++r) {
    for (std::int64_t g = 0; g < s.groups; ++g) {
      const float* grp = a.in + r * s.in_cols() + g * (hpg + 2) * HS;
      for (std::int64_t h = 0; h < hpg; ++h) {
        float* o = a.out + r * s.out_cols() + (g * hpg + h) * 3 * HS;
        rot(s, r, grp + h * HS, y.data(), false);
        for (std::int64_t i = 0; i < HS; ++i) o[i] = static_cast<float>(y[i]);
        rot(s, r, grp + hpg * HS, y.data(), false);
        for (std::int64_t i = 0; i < HS; ++i) o[HS + i] = static_cast<float>(y[i]);
        for (std::int64_t i = 0; i < HS; ++i) o[2 * HS + i] = grp[(hpg + 1) * HS + i];
      }
    }
  }
}

void rope_qkv_backward(const RopeQkvBackwardArgs& a) {
  const RopeQkvShape& s = a.shape;
  const std::int64_t HS = s.head_dim, hpg = s.heads_per_group;
  std::vector<double> y(static_cast<std::size_t>(HS)), dk(y.size()), dv(y.size());
  for (std::int64_t r = 0; r < s.rows; ++r) {
    for (std::int64_t g = 0; g < s.groups; ++g) {
      float* grp = a.d_in + r * s.in_cols() + g * (hpg + 2) * HS;
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (std::int64_t h = 0; h < hpg; ++h) {
        const float* o = a.d_out + r * s.out_cols() + (g * hpg + h) * 3 * HS;
        rot(s, r, o, y.data(), true);
        for (std::int64_t i = 0; i < HS; ++i) grp[h * HS + i] = static_cast<float>(y[i]);
        rot(s, r, o + HS, y.data(), true);
        for (std::int64_t i = 0; i < HS; ++i) {
          dk[static_cast<std::size_t>(i)] += y[static_cast<std::size_t>(i)];
          dv[static_cast<std::size_t>(i)] += o[2 * HS + i];
        }
      }
      for (std::int64_t i = 0; i < HS; ++i) {
        grp[hpg * HS + i] = static_cast<float>(dk[static_cast<std::size_t>(i)]);
        grp[(hpg + 1) * HS + i] = static_cast<float>(dv[static_cast<std::size_t>(i)]);
      }
    }
  }
}

}  // namespace trident::kernels::ref
