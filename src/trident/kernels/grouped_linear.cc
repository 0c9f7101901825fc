// The grouped linear layer (grouped_linear.h): view checks, the device dispatch and the CPU bodies,
// which run the linear layer's products (matmul.h, matmul_bf16.h) on each group's rows.
#include "trident/kernels/grouped_linear.h"

#include <algorithm>
#include <cstring>

#include "trident/core/error.h"
#include "trident/core/profile.h"
#include "trident/kernels/backend.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/kernels/view_check.h"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/cuda_ops.h"
#endif

namespace trident::kernels {

namespace {

constexpr std::int64_t kBlocks[] = {kGroupedBf16MaxBlock, 128, 64, kGroupedBf16MinBlock};
constexpr std::int64_t kAlign = 64;

std::int64_t aligned(std::int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The CPU BF16 body's scratch: oneDNN's workspace, then one padded block (up to the largest block
// size) of bf16 rows for each operand read (in, d_out) and one of f32 rows for each written (out,
// d_in), each wide enough for either feature count.
struct PadScratch {
  std::span<std::byte> onednn;
  core::bf16* rows_a = nullptr;  // in (forward), d_out (backward)
  core::bf16* rows_b = nullptr;  // in (backward)
  float* result = nullptr;       // out (forward), d_in (backward)
};

std::int64_t pad_bytes(std::int64_t in, std::int64_t out) {
  const std::int64_t wide = kGroupedBf16MaxBlock * std::max(in, out);
  return 2 * aligned(wide * 2) + aligned(wide * 4);
}

std::int64_t onednn_bytes(const core::ExecContext& ctx, std::int64_t in, std::int64_t out) {
  std::int64_t bytes = 0;
  for (std::int64_t b : kBlocks)
    bytes = std::max(bytes, linear_bf16_scratch_bytes(ctx, b, in, out));
  return aligned(bytes);
}

PadScratch split_scratch(const core::ExecContext& ctx, std::span<std::byte> s, std::int64_t in,
                         std::int64_t out) {
  const std::int64_t need = onednn_bytes(ctx, in, out),
                     wide = kGroupedBf16MaxBlock * std::max(in, out);
  TRIDENT_CHECK(static_cast<std::int64_t>(s.size()) >= need + pad_bytes(in, out),
                "grouped_linear (bf16): scratch of ", s.size(), " bytes, needs ",
                need + pad_bytes(in, out), " for in_features=", in, " out_features=", out,
                "; ask grouped_linear_bf16_scratch_bytes");
  std::byte* p = s.data() + need;
  PadScratch r{.onednn = s.first(static_cast<std::size_t>(need))};
  r.rows_a = reinterpret_cast<core::bf16*>(p);
  r.rows_b = reinterpret_cast<core::bf16*>(p + aligned(wide * 2));
  r.result = reinterpret_cast<float*>(p + 2 * aligned(wide * 2));
  return r;
}

// The next block of a group's `left` rows: the largest block size within `left` rounded up to
// kGroupedBf16MinBlock rows. Only a group's last block is partial (fewer than
// kGroupedBf16MinBlock rows of padding), so a group of 250 rows is one block of 256.
std::int64_t block_rows(std::int64_t left) {
  const std::int64_t rounded =
      (left + kGroupedBf16MinBlock - 1) / kGroupedBf16MinBlock * kGroupedBf16MinBlock;
  for (std::int64_t b : kBlocks) {
    if (rounded >= b) return b;
  }
  return kGroupedBf16MinBlock;
}

// n rows of `cols` into a zero-padded block of b rows.
const core::bf16* pad(core::bf16* to, const core::bf16* from, std::int64_t n, std::int64_t b,
                      std::int64_t cols) {
  std::memcpy(to, from, static_cast<std::size_t>(n * cols) * sizeof(core::bf16));
  std::memset(static_cast<void*>(to + n * cols), 0,
              static_cast<std::size_t>((b - n) * cols) * sizeof(core::bf16));
  return to;
}

void cpu_forward(const core::ExecContext& ctx, const GroupedLinearForwardArgs& a) {
  const std::int64_t in = a.in_features, out = a.out_features;
  for (std::int64_t g = 0; g < a.num_groups; ++g) {
    const RowGroup r = a.groups[g];
    if (r.rows == 0) continue;
    linear_forward(ctx, {.out = a.out + r.first * out,
                         .in = a.in + r.first * in,
                         .weight = a.weight + g * out * in,
                         .rows = r.rows,
                         .in_features = in,
                         .out_features = out});
  }
}

void cpu_backward(const core::ExecContext& ctx, const GroupedLinearBackwardArgs& a) {
  const std::int64_t in = a.in_features, out = a.out_features;
  for (std::int64_t g = 0; g < a.num_groups; ++g) {
    const RowGroup r = a.groups[g];
    if (r.rows == 0) continue;
    linear_backward(ctx,
                    LinearBackwardArgs{.d_in = a.d_in != nullptr ? a.d_in + r.first * in : nullptr,
                                       .d_weight = a.d_weight + g * out * in,
                                       .d_out = a.d_out + r.first * out,
                                       .in = a.in + r.first * in,
                                       .weight = a.weight + g * out * in,
                                       .rows = r.rows,
                                       .in_features = in,
                                       .out_features = out});
  }
}

void cpu_forward(const core::ExecContext& ctx, const GroupedLinearForwardBf16Args& a) {
  const std::int64_t in = a.in_features, out = a.out_features;
  const PadScratch s = split_scratch(ctx, a.scratch, in, out);
  for (std::int64_t g = 0; g < a.num_groups; ++g) {
    const RowGroup grp = a.groups[g];
    for (std::int64_t r = grp.first, end = grp.first + grp.rows; r < end;) {
      const std::int64_t b = block_rows(end - r), n = std::min(b, end - r);
      const bool padded = n < b;
      linear_forward_bf16(ctx,
                          {.out = padded ? s.result : a.out + r * out,
                           .in = padded ? pad(s.rows_a, a.in + r * in, n, b, in) : a.in + r * in,
                           .weight = a.weight + g * out * in,
                           .rows = b,
                           .in_features = in,
                           .out_features = out,
                           .scratch = s.onednn});
      if (padded) {
        std::memcpy(a.out + r * out, s.result, static_cast<std::size_t>(n * out) * sizeof(float));
      }
      r += n;
    }
  }
}

// Padded rows have zero gradients and inputs: they add nothing to the weight's gradient.
void cpu_backward(const core::ExecContext& ctx, const GroupedLinearBackwardBf16Args& a) {
  const std::int64_t in = a.in_features, out = a.out_features;
  const PadScratch s = split_scratch(ctx, a.scratch, in, out);
  for (std::int64_t g = 0; g < a.num_groups; ++g) {
    const RowGroup grp = a.groups[g];
    for (std::int64_t r = grp.first, end = grp.first + grp.rows; r < end;) {
      const std::int64_t b = block_rows(end - r), n = std::min(b, end - r);
      const bool padded = n < b;
      float* d_in = a.d_in != nullptr ? (padded ? s.result : a.d_in + r * in) : nullptr;
      linear_backward_bf16(
          ctx,
          {.d_in = d_in,
           .d_weight = a.d_weight + g * out * in,
           .d_out_bf16 = padded ? pad(s.rows_a, a.d_out + r * out, n, b, out) : a.d_out + r * out,
           .in = padded ? pad(s.rows_b, a.in + r * in, n, b, in) : a.in + r * in,
           .weight = a.weight + g * out * in,
           .rows = b,
           .in_features = in,
           .out_features = out,
           .scratch = s.onednn});
      if (padded && a.d_in != nullptr) {
        std::memcpy(a.d_in + r * in, s.result, static_cast<std::size_t>(n * in) * sizeof(float));
      }
      r += n;
    }
  }
}

struct Sizes {
  std::int64_t rows = 0, groups = 0, in_features = 0, out_features = 0, grouped_rows = 0;
};

// The sizes from `in` and the weight, and the groups' checks.
Sizes sizes_of(const char* op, const core::TensorView& in, const core::TensorView& weight,
               std::span<const RowGroup> groups) {
  detail::check_rank(op, "in", in, 2);
  detail::check_rank(op, "weight", weight, 3);
  TRIDENT_CHECK(weight.dtype == core::DType::kF32 || weight.dtype == core::DType::kBF16, op,
                ": the weight must be f32 or bf16, got ", core::dtype_name(weight.dtype));
  Sizes s{in.shape[0], weight.shape[0], weight.shape[2], weight.shape[1], 0};
  TRIDENT_CHECK(static_cast<std::int64_t>(groups.size()) == s.groups, op, ": ", groups.size(),
                " row groups for a weight of ", s.groups, " matrices (one group per matrix)");
  std::int64_t end = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const RowGroup r = groups[g];
    TRIDENT_CHECK(r.rows >= 0 && r.first >= end && r.first + r.rows <= s.rows, op, ": group ", g,
                  " (rows ", r.first, " to ", r.first + r.rows, ") is not within the ", s.rows,
                  " rows after the previous group's end (", end,
                  "): groups must be disjoint, in order, inside the buffers");
    end = r.first + r.rows;
    s.grouped_rows += r.rows;
  }
  return s;
}

void check_view(const char* op, const char* name, const core::TensorView& v, core::DType dtype,
                const core::Shape& shape, const core::ExecContext& ctx) {
  detail::check_view(op, name, v, dtype, shape, ctx,
                     dtype == core::DType::kBF16 ? " (the weight is BF16)" : "");
}

// The body for ctx.device: the CUDA one, or the CPU's (cpu_forward / cpu_backward by the args).
template <class Args>
void dispatch([[maybe_unused]] const char* op, const core::ExecContext& ctx, const Args& a) {
  constexpr bool forward = requires { a.out; };
  if (ctx.device.kind == core::DeviceKind::kCuda) {
#ifdef TRIDENT_HAVE_CUDA
    if constexpr (forward) {
      return cuda::grouped_linear_forward(ctx, a);
    } else {
      return cuda::grouped_linear_backward(ctx, a);
    }
#else
    no_cuda_backend(op);
#endif
  }
  if constexpr (forward) {
    cpu_forward(ctx, a);
  } else {
    cpu_backward(ctx, a);
  }
}

}  // namespace

void grouped_linear(const core::ExecContext& ctx, const GroupedLinearViews& v) {
  constexpr const char* op = "grouped_linear";
  const Sizes s = sizes_of(op, v.in, v.weight, v.groups);
  const core::DType wt = v.weight.dtype;
  check_view(op, "weight", v.weight, wt, {s.groups, s.out_features, s.in_features}, ctx);
  check_view(op, "in", v.in, wt, {s.rows, s.in_features}, ctx);
  check_view(op, "out", v.out, core::DType::kF32, {s.rows, s.out_features}, ctx);
  const bool bf16 = wt == core::DType::kBF16;
  const core::profile::Scope prof(core::profile::Kind::kGemm,
                                  bf16 ? "grouped_linear bf16" : "grouped_linear fp32",
                                  2.0 * s.grouped_rows * s.in_features * s.out_features, 0,
                                  s.grouped_rows, s.out_features, s.in_features);
  const auto run = [&]<class T>(const T*) {
    dispatch(op, ctx,
             BasicGroupedLinearForwardArgs<T>{.out = v.out.as<float>(),
                                              .in = v.in.as<T>(),
                                              .weight = v.weight.as<T>(),
                                              .groups = v.groups.data(),
                                              .num_groups = s.groups,
                                              .in_features = s.in_features,
                                              .out_features = s.out_features,
                                              .scratch = v.scratch});
  };
  bf16 ? run(static_cast<const core::bf16*>(nullptr)) : run(static_cast<const float*>(nullptr));
}

void grouped_linear_backward(const core::ExecContext& ctx, const GroupedLinearBackwardViews& v) {
  constexpr const char* op = "grouped_linear_backward";
  const Sizes s = sizes_of(op, v.in, v.weight, v.groups);
  const core::DType wt = v.weight.dtype;
  check_view(op, "weight", v.weight, wt, {s.groups, s.out_features, s.in_features}, ctx);
  check_view(op, "in", v.in, wt, {s.rows, s.in_features}, ctx);
  check_view(op, "d_out", v.d_out, wt, {s.rows, s.out_features}, ctx);
  check_view(op, "d_weight", v.d_weight, core::DType::kF32,
             {s.groups, s.out_features, s.in_features}, ctx);
  detail::check_optional_view(op, "d_in", v.d_in, core::DType::kF32, {s.rows, s.in_features}, ctx);
  const bool bf16 = wt == core::DType::kBF16;
  const double product = 2.0 * s.grouped_rows * s.in_features * s.out_features;
  const core::profile::Scope prof(
      core::profile::Kind::kGemm,
      bf16 ? "grouped_linear_backward bf16" : "grouped_linear_backward fp32",
      v.d_in.empty() ? product : 2 * product, 0, s.grouped_rows, s.out_features, s.in_features);
  const auto run = [&]<class T>(const T*) {
    dispatch(op, ctx,
             BasicGroupedLinearBackwardArgs<T>{.d_in = detail::data_or_null<float>(v.d_in),
                                               .d_weight = v.d_weight.as<float>(),
                                               .d_out = v.d_out.as<T>(),
                                               .in = v.in.as<T>(),
                                               .weight = v.weight.as<T>(),
                                               .groups = v.groups.data(),
                                               .num_groups = s.groups,
                                               .in_features = s.in_features,
                                               .out_features = s.out_features,
                                               .scratch = v.scratch});
  };
  bf16 ? run(static_cast<const core::bf16*>(nullptr)) : run(static_cast<const float*>(nullptr));
}

std::int64_t grouped_linear_bf16_scratch_bytes(const core::ExecContext& ctx,
                                               std::int64_t in_features,
                                               std::int64_t out_features) {
  TRIDENT_CHECK(in_features > 0 && out_features > 0,
                "grouped_linear_bf16_scratch_bytes: need in_features, out_features > 0, got ",
                in_features, " and ", out_features);
  if (ctx.device.kind == core::DeviceKind::kCuda) return 0;  // cuBLASLt: the stream's pool
  return onednn_bytes(ctx, in_features, out_features) + pad_bytes(in_features, out_features);
}

}  // namespace trident::kernels
