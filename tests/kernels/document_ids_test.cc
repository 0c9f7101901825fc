// document_ids (Megatron's get_ltor_masks_and_position_ids) against the reference, which reads
// the definition literally, and against the two properties that define it written another way:
// a document's positions count 0, 1, 2, ... from its first token, and the document id grows by
// one right after each end-of-document token. Plus the views' checks.
#include "trident/kernels/document_ids.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "trident/kernels/backend.h"

namespace trident::kernels {
namespace {

using testing::view_of;

constexpr std::int32_t kEod = 7;

struct Ids {
  std::vector<std::int32_t> positions, docs;
};

Ids run(const core::ExecContext& ctx, const std::vector<std::int32_t>& tokens, std::int64_t B,
        std::int64_t T) {
  Ids out{std::vector<std::int32_t>(tokens.size(), -99),
          std::vector<std::int32_t>(tokens.size(), -99)};
  document_ids(ctx, {.positions = view_of(out.positions, {B, T}),
                     .docs = view_of(out.docs, {B, T}),
                     .tokens = view_of(tokens, {B, T}),
                     .eod_token = kEod});
  testing::fetch(out.positions);
  testing::fetch(out.docs);
  return out;
}

// Tokens from {0..9} (kEod = 7: about one in ten), with forced end-of-document tokens at the
// first and last position of sample 0 and two in a row in sample 1.
std::vector<std::int32_t> make_tokens(std::int64_t B, std::int64_t T, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T));
  for (auto& t : tokens) t = static_cast<std::int32_t>(gen() % 10);
  if (T >= 2) tokens[0] = tokens[static_cast<std::size_t>(T - 1)] = kEod;
  if (B >= 2 && T >= 4) {
    tokens[static_cast<std::size_t>(T + 1)] = tokens[static_cast<std::size_t>(T + 2)] = kEod;
  }
  return tokens;
}

TEST(DocumentIds, MatchesTheReferenceAndTheDefiningProperties) {
  struct Case {
    std::int64_t B, T;
  };
  std::uint64_t seed = 1;
  for (const Case c : {Case{1, 1}, Case{1, 2}, Case{2, 5}, Case{3, 64}, Case{5, 1031}}) {
    const auto tokens = make_tokens(c.B, c.T, seed++);
    const Ids got = run(testing::backend_ctx(), tokens, c.B, c.T);
    Ids want{std::vector<std::int32_t>(tokens.size()), std::vector<std::int32_t>(tokens.size())};
    ref::document_ids({.positions = want.positions.data(),
                       .docs = want.docs.data(),
                       .tokens = tokens.data(),
                       .batch = c.B,
                       .seq_len = c.T,
                       .eod_token = kEod});
    const std::string shape = "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T);
    EXPECT_EQ(got.positions, want.positions) << shape;
    EXPECT_EQ(got.docs, want.docs) << shape;
    for (std::int64_t b = 0; b < c.B; ++b) {
      for (std::int64_t t = 0; t < c.T; ++t) {
        const auto i = static_cast<std::size_t>(b * c.T + t);
        if (t == 0) {
          EXPECT_EQ(got.positions[i], 0) << shape;
          EXPECT_EQ(got.docs[i], 0) << shape;
          continue;
        }
        const bool starts = tokens[i - 1] == kEod;  // the token after an end of document
        EXPECT_EQ(got.docs[i], got.docs[i - 1] + (starts ? 1 : 0))
            << shape << " b=" << b << " t=" << t;
        EXPECT_EQ(got.positions[i], starts ? 0 : got.positions[i - 1] + 1)
            << shape << " b=" << b << " t=" << t;
      }
    }
  }
}

TEST(DocumentIdsCpuOnly, IsIndependentOfThreadCount) {
  TRIDENT_CPU_ONLY("OpenMP thread counts");
  const std::int64_t B = 9, T = 300;
  const auto tokens = make_tokens(B, T, 42);
  core::ExecContext one = testing::backend_ctx(), two = one;
  one.num_threads = 1;
  two.num_threads = 2;
  const Ids a = run(one, tokens, B, T), b = run(two, tokens, B, T);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.docs, b.docs);
}

TEST(DocumentIds, ViewsAndTheEodTokenAreChecked) {
  const std::int64_t B = 2, T = 3;
  std::vector<std::int32_t> tokens(B * T, 1), pos(B * T), docs(B * T);
  const std::vector<float> f32(B * T);
  const DocumentIdsViews ok{.positions = view_of(pos, {B, T}),
                            .docs = view_of(docs, {B, T}),
                            .tokens = view_of(tokens, {B, T}),
                            .eod_token = kEod};
  auto error = [](const DocumentIdsViews& v) {
    return testing::invalid_argument_of([&] { document_ids(testing::backend_ctx(), v); });
  };
  EXPECT_EQ(error(ok), "no error");
  DocumentIdsViews v = ok;
  v.docs = view_of(f32, {B, T});
  EXPECT_NE(error(v).find("document_ids: view `docs` holds f32, the op needs i32"),
            std::string::npos)
      << error(v);
  v = ok;
  v.positions = core::view(pos.data(), {B * T});
  EXPECT_NE(error(v).find("view `positions` has shape (6), the op needs (2, 3)"), std::string::npos)
      << error(v);
  v = ok;
  v.eod_token = -1;
  EXPECT_NE(error(v).find("end-of-document token"), std::string::npos) << error(v);
  core::ExecContext cuda = testing::backend_ctx();
  cuda.device.kind = core::DeviceKind::kCuda;
  const core::Device dev = cuda.device;
  // No CUDA kernel: Unavailable; in a CUDA build the views' memory check comes first (host memory).
  const std::string e = [&]() -> std::string {
    try {
      document_ids(cuda, {.positions = core::view(pos.data(), {B, T}, dev),
                          .docs = core::view(docs.data(), {B, T}, dev),
                          .tokens = core::view(tokens.data(), {B, T}, dev),
                          .eod_token = kEod});
    } catch (const core::Unavailable& u) {
      return cuda_built() ? std::string("unexpected Unavailable: ") + u.what() : "Unavailable";
    } catch (const core::InvalidArgument& a) {
      return cuda_built() ? "InvalidArgument" : std::string("unexpected: ") + a.what();
    }
    return "no error";
  }();
  EXPECT_EQ(e, cuda_built() ? "InvalidArgument" : "Unavailable");
}

}  // namespace
}  // namespace trident::kernels
