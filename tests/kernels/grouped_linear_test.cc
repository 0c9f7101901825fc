// The grouped linear layer (kernels/grouped_linear.h) against its double-precision reference on
// every backend: FP32 and BF16 weights, groups of uneven sizes (empty ones, one row, whole and
// partial blocks of the CPU's BF16 body, more than its largest block), gaps between groups that
// must stay untouched, the backward's accumulation; and its refusals.
#include "trident/kernels/grouped_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernel_test_util.h"
#include "trident/core/bf16.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/matmul_bf16.h"

namespace trident::kernels {
namespace {

using testing::all_close;
using testing::all_equal;
using testing::randn;
using testing::Tol;
using testing::view_of;

constexpr std::int64_t kIn = 24, kOut = 40;
// The weight gradient sums up to 301 products of unit-sized terms in FP32.
constexpr Tol kTol{1e-4, 1e-5};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Six experts: none, one row, a whole 32-row block, 256 + 32 + 13 padded, 37, a gap of 3 rows
// before the last (64 + 5 padded). 403 rows in all, 3 of them in no group.
const std::vector<RowGroup> kGroups = {{0, 0}, {0, 1}, {1, 32}, {33, 301}, {334, 37}, {374, 69}};
constexpr std::int64_t kRows = 443;

std::vector<core::bf16> to_bf16(const std::vector<float>& x) {
  std::vector<core::bf16> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = core::bf16::from_float(x[i]);
  return y;
}

// Rows outside every group must keep their contents: 7 there, NaN in the groups' rows.
std::vector<float> sentinel_rows(std::int64_t cols) {
  std::vector<float> v(static_cast<std::size_t>(kRows * cols), 7.0f);
  for (const RowGroup& g : kGroups) {
    std::fill(v.begin() + g.first * cols, v.begin() + (g.first + g.rows) * cols, kNaN);
  }
  return v;
}

std::vector<std::byte> scratch_for(bool bf16) {
  if (!bf16) return {};
  return std::vector<std::byte>(static_cast<std::size_t>(
      grouped_linear_bf16_scratch_bytes(testing::backend_ctx(), kIn, kOut)));
}

template <class T>
void check_against_reference(const std::vector<T>& in, const std::vector<T>& w,
                             const std::vector<T>& d_out, Tol tol) {
  constexpr bool bf16 = std::is_same_v<T, core::bf16>;
  const core::ExecContext ctx = testing::backend_ctx();
  std::vector<std::byte> scratch = scratch_for(bf16);
  const std::int64_t G = static_cast<std::int64_t>(kGroups.size());

  std::vector<float> out = sentinel_rows(kOut), want = sentinel_rows(kOut);
  grouped_linear(ctx, {.out = view_of(out, {kRows, kOut}),
                       .in = view_of(in, {kRows, kIn}),
                       .weight = view_of(w, {G, kOut, kIn}),
                       .groups = kGroups,
                       .scratch = testing::dev_span(scratch)});
  ref::grouped_linear_forward<T>({.out = want.data(),
                                  .in = in.data(),
                                  .weight = w.data(),
                                  .groups = kGroups.data(),
                                  .num_groups = G,
                                  .in_features = kIn,
                                  .out_features = kOut});
  EXPECT_TRUE(all_close("out", out, want, tol));

  std::vector<float> d_in = sentinel_rows(kIn), want_in = sentinel_rows(kIn);
  std::vector<float> d_w = randn(G * kOut * kIn, 30), want_w = d_w;  // accumulated onto
  grouped_linear_backward(ctx, {.d_in = view_of(d_in, {kRows, kIn}),
                                .d_weight = view_of(d_w, {G, kOut, kIn}),
                                .d_out = view_of(d_out, {kRows, kOut}),
                                .in = view_of(in, {kRows, kIn}),
                                .weight = view_of(w, {G, kOut, kIn}),
                                .groups = kGroups,
                                .scratch = testing::dev_span(scratch)});
  ref::grouped_linear_backward<T>({.d_in = want_in.data(),
                                   .d_weight = want_w.data(),
                                   .d_out = d_out.data(),
                                   .in = in.data(),
                                   .weight = w.data(),
                                   .groups = kGroups.data(),
                                   .num_groups = G,
                                   .in_features = kIn,
                                   .out_features = kOut});
  EXPECT_TRUE(all_close("d_in", d_in, want_in, tol));
  EXPECT_TRUE(all_close("d_weight", d_w, want_w, tol));

  // Without d_in: the weight's gradient alone, added again.
  grouped_linear_backward(ctx, {.d_weight = view_of(d_w, {G, kOut, kIn}),
                                .d_out = view_of(d_out, {kRows, kOut}),
                                .in = view_of(in, {kRows, kIn}),
                                .weight = view_of(w, {G, kOut, kIn}),
                                .groups = kGroups,
                                .scratch = testing::dev_span(scratch)});
  ref::grouped_linear_backward<T>({.d_weight = want_w.data(),
                                   .d_out = d_out.data(),
                                   .in = in.data(),
                                   .weight = w.data(),
                                   .groups = kGroups.data(),
                                   .num_groups = G,
                                   .in_features = kIn,
                                   .out_features = kOut});
  EXPECT_TRUE(all_close("d_weight twice", d_w, want_w, tol));
}

TEST(GroupedLinear, Fp32MatchesTheReferenceOnEveryGroupAndLeavesTheGapsAlone) {
  const std::int64_t G = static_cast<std::int64_t>(kGroups.size());
  check_against_reference(randn(kRows * kIn, 1), randn(G * kOut * kIn, 2, 0.2),
                          randn(kRows * kOut, 3), kTol);
}

TEST(GroupedLinear, Bf16MatchesTheReferenceOnEveryGroupAndLeavesTheGapsAlone) {
  // bf16 products are exact in FP32: only the FP32 accumulation differs from the double one.
  const std::int64_t G = static_cast<std::int64_t>(kGroups.size());
  check_against_reference(to_bf16(randn(kRows * kIn, 4)), to_bf16(randn(G * kOut * kIn, 5, 0.2)),
                          to_bf16(randn(kRows * kOut, 6)), kTol);
}

// Each group's rows equal the linear layer's own product on them alone: the padding of a partial
// block adds nothing, and no group reads another's weight.
TEST(GroupedLinear, Bf16GroupsEqualTheLinearLayerOnTheirRows) {
  const std::int64_t G = static_cast<std::int64_t>(kGroups.size());
  const auto in = to_bf16(randn(kRows * kIn, 7)), w = to_bf16(randn(G * kOut * kIn, 8, 0.2));
  const core::ExecContext ctx = testing::backend_ctx();
  std::vector<std::byte> scratch = scratch_for(true);
  std::vector<float> out = sentinel_rows(kOut);
  grouped_linear(ctx, {.out = view_of(out, {kRows, kOut}),
                       .in = view_of(in, {kRows, kIn}),
                       .weight = view_of(w, {G, kOut, kIn}),
                       .groups = kGroups,
                       .scratch = testing::dev_span(scratch)});
  testing::fetch(out);
  std::vector<float> want;
  for (std::int64_t g = 0; g < G; ++g) {
    const RowGroup r = kGroups[static_cast<std::size_t>(g)];
    if (r.rows == 0) continue;
    const std::vector<core::bf16> rows(in.begin() + r.first * kIn,
                                       in.begin() + (r.first + r.rows) * kIn);
    const std::vector<core::bf16> wg(w.begin() + g * kOut * kIn, w.begin() + (g + 1) * kOut * kIn);
    std::vector<float> y(static_cast<std::size_t>(r.rows * kOut), kNaN);
    ref::linear_forward_bf16({.out = y.data(),
                              .in = rows.data(),
                              .weight = wg.data(),
                              .rows = r.rows,
                              .in_features = kIn,
                              .out_features = kOut});
    const std::vector<float> got(out.begin() + r.first * kOut,
                                 out.begin() + (r.first + r.rows) * kOut);
    EXPECT_TRUE(all_close("group rows", got, y, kTol)) << "group " << g;
  }
}

TEST(GroupedLinear, BadGroupsAndViewsAreClearErrors) {
  const std::int64_t G = static_cast<std::int64_t>(kGroups.size());
  std::vector<float> in(kRows * kIn), w(G * kOut * kIn), out(kRows * kOut);
  const core::ExecContext ctx = testing::backend_ctx();
  auto error_with = [&](std::vector<RowGroup> groups, core::TensorView weight) {
    return testing::invalid_argument_of([&] {
      grouped_linear(ctx, {.out = view_of(out, {kRows, kOut}),
                           .in = view_of(in, {kRows, kIn}),
                           .weight = weight,
                           .groups = groups});
    });
  };
  const core::TensorView weight = view_of(w, {G, kOut, kIn});
  std::vector<RowGroup> fewer(kGroups.begin(), kGroups.end() - 1);
  EXPECT_NE(error_with(fewer, weight).find("5 row groups for a weight of 6 matrices"),
            std::string::npos)
      << error_with(fewer, weight);
  std::vector<RowGroup> overlap = kGroups;
  overlap[4].first = 300;
  EXPECT_NE(error_with(overlap, weight).find("group 4 (rows 300 to 337) is not within"),
            std::string::npos)
      << error_with(overlap, weight);
  std::vector<RowGroup> past = kGroups;
  past[5].rows = 70;
  EXPECT_NE(error_with(past, weight).find("groups must be disjoint, in order, inside the buffers"),
            std::string::npos)
      << error_with(past, weight);
  EXPECT_NE(error_with(kGroups, testing::view_claiming(w, {G, kOut, kIn + 1})).find("view `in`"),
            std::string::npos);
}

TEST(GroupedLinearCpuOnly, Bf16BlocksNeedNoNewPrimitiveWhateverTheRouting) {
  TRIDENT_CPU_ONLY("oneDNN's primitive cache");
  const core::ExecContext ctx = testing::backend_ctx();
  std::vector<std::byte> scratch(
      static_cast<std::size_t>(grouped_linear_bf16_scratch_bytes(ctx, kIn, kOut)));
  const auto in = to_bf16(randn(kRows * kIn, 9)), w = to_bf16(randn(2 * kOut * kIn, 10, 0.2));
  const auto d_out = to_bf16(randn(kRows * kOut, 11));
  std::vector<float> out(kRows * kOut), d_in(kRows * kIn), d_w(2 * kOut * kIn);
  const std::int64_t before = gemm_bf16_primitives_created();
  for (std::int64_t split :
       std::vector<std::int64_t>{0, 1, 31, 32, 33, 100, 255, 256, 257, 300, kRows}) {
    const std::vector<RowGroup> groups = {{0, split}, {split, kRows - split}};
    grouped_linear(ctx, {.out = view_of(out, {kRows, kOut}),
                         .in = view_of(in, {kRows, kIn}),
                         .weight = view_of(w, {2, kOut, kIn}),
                         .groups = groups,
                         .scratch = scratch});
    grouped_linear_backward(ctx, {.d_in = view_of(d_in, {kRows, kIn}),
                                  .d_weight = view_of(d_w, {2, kOut, kIn}),
                                  .d_out = view_of(d_out, {kRows, kOut}),
                                  .in = view_of(in, {kRows, kIn}),
                                  .weight = view_of(w, {2, kOut, kIn}),
                                  .groups = groups,
                                  .scratch = scratch});
  }
  EXPECT_EQ(gemm_bf16_primitives_created(), before);
  // Too little scratch is refused by name.
  const std::string e = testing::invalid_argument_of([&] {
    grouped_linear(ctx, {.out = view_of(out, {kRows, kOut}),
                         .in = view_of(in, {kRows, kIn}),
                         .weight = view_of(w, {2, kOut, kIn}),
                         .groups = std::vector<RowGroup>{{0, 5}, {5, 5}},
                         .scratch = std::span(scratch).first(16)});
  });
  EXPECT_NE(e.find("ask grouped_linear_bf16_scratch_bytes"), std::string::npos) << e;
}

}  // namespace
}  // namespace trident::kernels
