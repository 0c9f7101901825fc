// The CUDA kernels against the double-precision references and the CPU backend, in the same test:
// inputs are drawn on the host, copied to the GPU, every op runs through its public dispatch with a
// CUDA ExecContext, and the results are copied back and compared with ref:: and with the CPU
// backend's result for the same inputs. Without a GPU every test reports SKIPPED with the reason
// (the global environment below); ctest reads that as skipped, never passed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "trident/core/bf16.h"
#include "trident/core/error.h"
#include "trident/kernels/adamw.h"
#include "trident/kernels/attention.h"
#include "trident/kernels/bf16.h"
#include "trident/kernels/cross_entropy.h"
#include "trident/kernels/cuda/device.h"
#include "trident/kernels/dispatch.h"
#include "trident/kernels/dropout.h"
#include "trident/kernels/elementwise.h"
#include "trident/kernels/embedding.h"
#include "trident/kernels/fill.h"
#include "trident/kernels/flash_attention.h"
#include "trident/kernels/fused_bias_gelu.h"
#include "trident/kernels/fused_residual_layernorm.h"
#include "trident/kernels/init_normal.h"
#include "trident/kernels/kv_cache_attention.h"
#include "trident/kernels/layernorm.h"
#include "trident/kernels/matmul.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/kernels/memory.h"
#include "trident/kernels/overflow.h"
#include "trident/kernels/rmsnorm.h"
#include "trident/kernels/rope.h"
#include "trident/kernels/swiglu.h"
#include "trident/kernels/vocab_parallel_cross_entropy.h"

namespace trident::kernels {
namespace {

using cuda::DeviceBuffer;
using testing::all_close;
using testing::all_equal;
using testing::randn;
using testing::Tol;

class CudaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (cuda::device_count() == 0) {
      GTEST_SKIP() << "CUDA tests need a GPU: " << cuda::no_device_reason();
    }
    std::printf("CUDA tests on device 0: %s\n", cuda::device_name(0).c_str());
  }
};
[[maybe_unused]] ::testing::Environment* const kEnv =
    ::testing::AddGlobalTestEnvironment(new CudaEnvironment);

// A device copy of a host vector.
template <class T>
struct Dev {
  DeviceBuffer buf;
  std::int64_t n = 0;
  void* stream = nullptr;
  Dev(const std::vector<T>& h, void* s)
      : buf(static_cast<std::int64_t>(h.size() * sizeof(T))),
        n(static_cast<std::int64_t>(h.size())),
        stream(s) {
    cuda::copy_to_device(buf.data(), h.data(), n * static_cast<std::int64_t>(sizeof(T)), s);
  }
  T* p() const { return buf.as<T>(); }
  std::vector<T> host() const {
    std::vector<T> h(static_cast<std::size_t>(n));
    cuda::copy_to_host(h.data(), buf.data(), n * static_cast<std::int64_t>(sizeof(T)), stream);
    cuda::synchronize(stream);
    return h;
  }
};

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    cuda::set_device(0);
    stream_ = cuda::create_stream();
    gpu_ = cuda::cuda_context(0, stream_);
  }
  void TearDown() override { cuda::destroy_stream(stream_); }
  template <class T>
  Dev<T> dev(const std::vector<T>& h) {
    return Dev<T>(h, stream_);
  }
  void* stream_ = nullptr;
  core::ExecContext gpu_{};
  const core::ExecContext cpu_ = core::ExecContext::cpu();
};

constexpr Tol kElem{1e-5, 1e-5};
constexpr Tol kRow{2e-5, 2e-4};  // row reductions in FP32, summed in another order than the CPU

TEST_F(Cuda, ElementwiseMatchReferenceAndCpu) {
  const std::int64_t n = 100003;
  auto x = randn(n, 1, 3.0);
  x[0] = 30.0f;
  x[1] = -30.0f;  // the saturated tails
  const auto g = randn(n, 2);
  std::vector<float> ref(n), cpu(n);
  auto dx = dev(x), dg = dev(g), dout = dev(std::vector<float>(n));
  gelu_forward(gpu_, dout.p(), dx.p(), n);
  ref::gelu_forward(ref.data(), x.data(), n);
  gelu_forward(cpu_, cpu.data(), x.data(), n);
  EXPECT_TRUE(all_close("gelu_forward vs ref", dout.host(), ref, kElem));
  EXPECT_TRUE(all_close("gelu_forward vs cpu", dout.host(), cpu, kElem));
  gelu_backward(gpu_, dout.p(), dg.p(), dx.p(), n);
  ref::gelu_backward(ref.data(), g.data(), x.data(), n);
  gelu_backward(cpu_, cpu.data(), g.data(), x.data(), n);
  EXPECT_TRUE(all_close("gelu_backward vs ref", dout.host(), ref, kElem));
  EXPECT_TRUE(all_close("gelu_backward vs cpu", dout.host(), cpu, kElem));
  add_forward(gpu_, dout.p(), dx.p(), dg.p(), n);
  add_forward(cpu_, cpu.data(), x.data(), g.data(), n);
  EXPECT_TRUE(all_equal("add_forward vs cpu", dout.host(), cpu));
  scale_inplace(gpu_, dout.p(), 0.37f, n);
  scale_inplace(cpu_, cpu.data(), 0.37f, n);
  EXPECT_TRUE(all_equal("scale_inplace vs cpu", dout.host(), cpu));

  double want = 0.0;
  for (float v : x) want += static_cast<double>(v) * v;
  const double got = sum_squares(gpu_, dx.p(), n);
  EXPECT_NEAR(got, want, 1e-12 * want);
  EXPECT_EQ(got, sum_squares(gpu_, dx.p(), n)) << "sum_squares must be reproducible";
  EXPECT_TRUE(all_finite(gpu_, dx.p(), n));
  auto bad = x;
  bad[n - 7] = std::numeric_limits<float>::infinity();
  auto dbad = dev(bad);
  EXPECT_FALSE(all_finite(gpu_, dbad.p(), n));
  bad[n - 7] = std::nanf("");
  auto dnan = dev(bad);
  EXPECT_FALSE(all_finite(gpu_, dnan.p(), n));
}

TEST_F(Cuda, FillCopyAndOverflowCountMatchTheCpu) {
  const std::int64_t n = 70001;
  auto x = randn(n, 40, 1e4);
  x[3] = std::nanf("");
  x[99] = -std::numeric_limits<float>::infinity();
  auto gx = dev(x), gy = dev(std::vector<float>(n, 1.0f));
  fill(gpu_, {gy.p(), -2.5f, n - 1});
  auto want = std::vector<float>(n, -2.5f);
  want[n - 1] = 1.0f;
  EXPECT_TRUE(all_equal("fill", gy.host(), want));
  copy(gpu_, {gy.p(), gx.p(), n});
  EXPECT_TRUE(all_equal("copy", gy.host(), x));
  for (float t : {0.0f, 65504.0f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(overflow_count(gpu_, {gx.p(), t, n}), overflow_count(cpu_, {x.data(), t, n}))
        << "threshold " << t;
  }
}

TEST_F(Cuda, Bf16ConversionsAreTheCpusBits) {
  auto x = randn(4099, 3, 10.0);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::nanf(""),
                            -std::nanf(""),
                            std::numeric_limits<float>::denorm_min(),
                            1.0f + 0x1.0p-8f,  // a tie: rounds to even
                            std::numeric_limits<float>::max()};
  for (std::size_t i = 0; i < std::size(specials); ++i) x[i] = specials[i];
  const std::int64_t n = static_cast<std::int64_t>(x.size());
  std::vector<core::bf16> cpu(x.size());
  convert_f32_to_bf16(cpu_, cpu.data(), x.data(), n);
  auto dx = dev(x);
  auto db = dev(std::vector<core::bf16>(x.size()));
  convert_f32_to_bf16(gpu_, db.p(), dx.p(), n);
  const auto got = db.host();
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i].bits, cpu[i].bits) << "element " << i;
  auto dback = dev(std::vector<float>(x.size()));
  convert_bf16_to_f32(gpu_, dback.p(), db.p(), n);
  std::vector<float> back(x.size());
  convert_bf16_to_f32(cpu_, back.data(), cpu.data(), n);
  const auto gback = dback.host();
  EXPECT_EQ(std::memcmp(gback.data(), back.data(), back.size() * sizeof(float)), 0);
}

TEST_F(Cuda, AdamWMatchesReferenceAndCpu) {
  const std::int64_t n = 50001;
  auto p = randn(n, 4), m = randn(n, 5, 0.1), v = randn(n, 6, 0.1), g = randn(n, 7);
  for (auto& x : v) x = x * x;
  AdamWHyper hp{.lr = 3e-3f, .weight_decay = 0.1f, .step = 7, .grad_scale = 0.5f};
  auto dp = dev(p), dm = dev(m), dv = dev(v), dg = dev(g);
  adamw_update(gpu_, hp, {dp.p(), dm.p(), dv.p(), dg.p(), n});
  auto rp = p, rm = m, rv = v;
  ref::adamw_update(hp, {rp.data(), rm.data(), rv.data(), g.data(), n});
  adamw_update(cpu_, hp, {p.data(), m.data(), v.data(), g.data(), n});
  EXPECT_TRUE(all_close("adamw param vs ref", dp.host(), rp, {1e-6, 1e-5}));
  EXPECT_TRUE(all_close("adamw m vs ref", dm.host(), rm, kElem));
  EXPECT_TRUE(all_close("adamw v vs ref", dv.host(), rv, kElem));
  EXPECT_TRUE(all_close("adamw param vs cpu", dp.host(), p, {1e-6, 1e-5}));
}

TEST_F(Cuda, LayerNormMatchesReferenceAndCpu) {
  const std::int64_t rows = 300, cols = 1000;
  const auto x = randn(rows * cols, 8, 2.0, 0.5), w = randn(cols, 9), b = randn(cols, 10),
             dy = randn(rows * cols, 11);
  std::vector<float> out(rows * cols), mean(rows), rstd(rows);
  ref::layernorm_forward(
      {out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, cols, 1e-5f});
  auto dx = dev(x), dw = dev(w), db = dev(b), ddy = dev(dy);
  auto dout = dev(std::vector<float>(rows * cols)), dmean = dev(std::vector<float>(rows)),
       drstd = dev(std::vector<float>(rows));
  layernorm_forward(gpu_,
                    {dout.p(), dmean.p(), drstd.p(), dx.p(), dw.p(), db.p(), rows, cols, 1e-5f});
  EXPECT_TRUE(all_close("layernorm out", dout.host(), out, kRow));
  EXPECT_TRUE(all_close("layernorm mean", dmean.host(), mean, kRow));
  EXPECT_TRUE(all_close("layernorm rstd", drstd.host(), rstd, kRow));
  const auto d_in0 = randn(rows * cols, 12);  // the residual gradient already there (+=)
  auto rdin = d_in0;
  std::vector<float> rdw(cols, 0.5f), rdb(cols, -0.5f);
  ref::layernorm_backward({rdin.data(), rdw.data(), rdb.data(), dy.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), rows, cols});
  auto cdin = d_in0;
  std::vector<float> cdw(cols, 0.5f), cdb(cols, -0.5f);
  layernorm_backward(cpu_, {cdin.data(), cdw.data(), cdb.data(), dy.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), rows, cols});
  auto gdin = dev(d_in0), gdw = dev(std::vector<float>(cols, 0.5f)),
       gdb = dev(std::vector<float>(cols, -0.5f));
  layernorm_backward(gpu_, {gdin.p(), gdw.p(), gdb.p(), ddy.p(), dx.p(), dw.p(), dmean.p(),
                            drstd.p(), rows, cols});
  EXPECT_TRUE(all_close("layernorm d_in vs ref", gdin.host(), rdin, kRow));
  EXPECT_TRUE(all_close("layernorm d_weight vs ref", gdw.host(), rdw, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("layernorm d_bias vs ref", gdb.host(), rdb, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("layernorm d_in vs cpu", gdin.host(), cdin, kRow));
  EXPECT_TRUE(all_close("layernorm d_weight vs cpu", gdw.host(), cdw, {1e-4, 1e-4}));
}

TEST_F(Cuda, ResidualLayerNormMatchesReferenceAndCpu) {
  const std::int64_t rows = 130, cols = 768;
  const auto a = randn(rows * cols, 13), b = randn(rows * cols, 14), w = randn(cols, 15),
             bias = randn(cols, 16), dy = randn(rows * cols, 17), dres0 = randn(rows * cols, 18);
  std::vector<float> resid(rows * cols), out(rows * cols), mean(rows), rstd(rows);
  std::vector<core::bf16> out16(rows * cols);
  ref::residual_layernorm_forward({.resid_out = resid.data(),
                                   .out = out.data(),
                                   .out_bf16 = out16.data(),
                                   .mean = mean.data(),
                                   .rstd = rstd.data(),
                                   .a = a.data(),
                                   .b = b.data(),
                                   .weight = w.data(),
                                   .bias = bias.data(),
                                   .rows = rows,
                                   .cols = cols});
  auto ga = dev(a), gb = dev(b), gw = dev(w), gbias = dev(bias), gdy = dev(dy);
  auto gout = dev(std::vector<float>(rows * cols)), gmean = dev(std::vector<float>(rows)),
       grstd = dev(std::vector<float>(rows));
  auto gout16 = dev(std::vector<core::bf16>(rows * cols));
  // In place on the residual stream: resid_out aliases a.
  residual_layernorm_forward(gpu_, {.resid_out = ga.p(),
                                    .out = gout.p(),
                                    .out_bf16 = gout16.p(),
                                    .mean = gmean.p(),
                                    .rstd = grstd.p(),
                                    .a = ga.p(),
                                    .b = gb.p(),
                                    .weight = gw.p(),
                                    .bias = gbias.p(),
                                    .rows = rows,
                                    .cols = cols});
  EXPECT_TRUE(all_close("residual_layernorm resid", ga.host(), resid, kElem));
  EXPECT_TRUE(all_close("residual_layernorm out", gout.host(), out, kRow));
  const auto o16 = gout16.host();
  const auto o = gout.host();
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(o16[i].bits, core::bf16::from_float(o[i]).bits) << "out_bf16 is not out rounded";
  }
  auto rdres = dres0;
  std::vector<float> rdw(cols, 0.0f), rdb(cols, 0.0f);
  std::vector<core::bf16> rd16(rows * cols);
  ref::residual_layernorm_backward({.d_resid = rdres.data(),
                                    .d_resid_bf16 = rd16.data(),
                                    .d_weight = rdw.data(),
                                    .d_bias = rdb.data(),
                                    .d_out = dy.data(),
                                    .resid = resid.data(),
                                    .weight = w.data(),
                                    .mean = mean.data(),
                                    .rstd = rstd.data(),
                                    .rows = rows,
                                    .cols = cols});
  auto gdres = dev(dres0), gdw = dev(std::vector<float>(cols)), gdb = dev(std::vector<float>(cols));
  // The caller's device scratch, as the model gives it (model/layers/norm.cc).
  DeviceBuffer scratch(residual_layernorm_backward_scratch_bytes(rows, cols));
  residual_layernorm_backward(
      gpu_, {.d_resid = gdres.p(),
             .d_weight = gdw.p(),
             .d_bias = gdb.p(),
             .d_out = gdy.p(),
             .resid = ga.p(),
             .weight = gw.p(),
             .mean = gmean.p(),
             .rstd = grstd.p(),
             .rows = rows,
             .cols = cols,
             .scratch = {scratch.as<std::byte>(), static_cast<std::size_t>(scratch.bytes())}});
  EXPECT_TRUE(all_close("residual_layernorm d_resid", gdres.host(), rdres, kRow));
  EXPECT_TRUE(all_close("residual_layernorm d_weight", gdw.host(), rdw, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("residual_layernorm d_bias", gdb.host(), rdb, {1e-4, 1e-4}));
}

TEST_F(Cuda, BiasGeluMatchesReferenceAndCpu) {
  const std::int64_t rows = 200, cols = 3072;
  const auto in = randn(rows * cols, 19, 2.0), bias = randn(cols, 20), dy = randn(rows * cols, 21);
  std::vector<float> out(rows * cols), din(rows * cols), dbias(cols, 0.25f);
  ref::bias_gelu_forward(
      {.out = out.data(), .in = in.data(), .bias = bias.data(), .rows = rows, .cols = cols});
  ref::bias_gelu_backward({.d_in = din.data(),
                           .d_bias = dbias.data(),
                           .d_out = dy.data(),
                           .in = in.data(),
                           .bias = bias.data(),
                           .rows = rows,
                           .cols = cols});
  auto gin = dev(in), gbias = dev(bias), gdy = dev(dy), gout = dev(std::vector<float>(rows * cols));
  auto gdbias = dev(std::vector<float>(cols, 0.25f));
  bias_gelu_forward(
      gpu_, {.out = gout.p(), .in = gin.p(), .bias = gbias.p(), .rows = rows, .cols = cols});
  EXPECT_TRUE(all_close("bias_gelu out", gout.host(), out, kElem));
  // d_in aliases d_out, and the scratch is the caller's device memory, as the model uses them
  // (model/layers/mlp.cc).
  DeviceBuffer scratch(bias_gelu_backward_scratch_bytes(rows, cols));
  bias_gelu_backward(
      gpu_, {.d_in = gdy.p(),
             .d_bias = gdbias.p(),
             .d_out = gdy.p(),
             .in = gin.p(),
             .bias = gbias.p(),
             .rows = rows,
             .cols = cols,
             .scratch = {scratch.as<std::byte>(), static_cast<std::size_t>(scratch.bytes())}});
  EXPECT_TRUE(all_close("bias_gelu d_in", gdy.host(), din, kElem));
  EXPECT_TRUE(all_close("bias_gelu d_bias", gdbias.host(), dbias, {1e-4, 1e-5}));
}

TEST_F(Cuda, EmbeddingMatchesReferenceAndIsTheCpusBits) {
  const std::int64_t B = 3, T = 37, C = 96, V = 50, vocab_start = 10, vocab_local = 30;
  std::vector<std::int32_t> tokens(B * T);
  for (std::int64_t i = 0; i < B * T; ++i) tokens[i] = static_cast<std::int32_t>((i * 7 + 3) % V);
  tokens[5] = tokens[9] = tokens[40] = 12;  // repeated rows: the scatter-add order matters
  const auto wte = randn(vocab_local * C, 22), wpe = randn(T * C, 23), dy = randn(B * T * C, 24);
  std::vector<float> out(B * T * C), cout(B * T * C);
  EmbeddingForwardArgs fa{.tokens = tokens.data(),
                          .wte = wte.data(),
                          .wpe = wpe.data(),
                          .batch = B,
                          .seq_len = T,
                          .hidden = C,
                          .vocab_start = vocab_start,
                          .vocab_local = vocab_local};
  fa.out = out.data();
  ref::embedding_forward(fa);
  fa.out = cout.data();
  embedding_forward(cpu_, fa);
  auto gtok = dev(tokens);
  auto gwte = dev(wte), gwpe = dev(wpe), gdy = dev(dy);
  auto gout = dev(std::vector<float>(B * T * C));
  EmbeddingForwardArgs ga = fa;
  ga.out = gout.p();
  ga.tokens = gtok.p();
  ga.wte = gwte.p();
  ga.wpe = gwpe.p();
  embedding_forward(gpu_, ga);
  EXPECT_TRUE(all_equal("embedding out vs cpu", gout.host(), cout));
  EXPECT_TRUE(all_close("embedding out vs ref", gout.host(), out, kElem));
  std::vector<float> dwte(vocab_local * C, 0.125f), dwpe(T * C, -1.0f);
  EmbeddingBackwardArgs ba{.d_wte = dwte.data(),
                           .d_wpe = dwpe.data(),
                           .d_out = dy.data(),
                           .tokens = tokens.data(),
                           .batch = B,
                           .seq_len = T,
                           .hidden = C,
                           .vocab_start = vocab_start,
                           .vocab_local = vocab_local};
  embedding_backward(cpu_, ba);
  auto gdwte = dev(std::vector<float>(vocab_local * C, 0.125f)),
       gdwpe = dev(std::vector<float>(T * C, -1.0f));
  EmbeddingBackwardArgs gb = ba;
  gb.d_wte = gdwte.p();
  gb.d_wpe = gdwpe.p();
  gb.d_out = gdy.p();
  gb.tokens = gtok.p();
  embedding_backward(gpu_, gb);
  EXPECT_TRUE(all_equal("embedding d_wte vs cpu", gdwte.host(), dwte));
  EXPECT_TRUE(all_equal("embedding d_wpe vs cpu", gdwpe.host(), dwpe));
  auto bad = tokens;
  bad[17] = -4;
  auto gbad = dev(bad);
  ga.tokens = gbad.p();
  // Reported at the stream's next read-back (here synchronize()), naming the first bad element as
  // the CPU does; nothing read out of bounds meanwhile.
  embedding_forward(gpu_, ga);
  try {
    kernels::synchronize(gpu_);
    ADD_FAILURE() << "a negative token id was not reported";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("embedding_forward: tokens[17] = -4"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(kernels::synchronize(gpu_));  // reported once
}

TEST_F(Cuda, CrossEntropyMatchesReferenceAndCpu) {
  const std::int64_t rows = 77, V = 1000, Vp = 1024;
  auto logits = randn(rows * Vp, 25, 3.0);
  std::vector<std::int32_t> targets(rows);
  for (std::int64_t r = 0; r < rows; ++r) targets[r] = static_cast<std::int32_t>((r * 131) % V);
  targets[3] = -1;  // ignored
  std::vector<float> loss(rows), dl(rows * Vp), closs(rows), cdl(rows * Vp);
  ref::cross_entropy_forward_backward(
      {loss.data(), dl.data(), logits.data(), targets.data(), 0.01f, rows, V, Vp});
  cross_entropy_forward_backward(
      cpu_, {closs.data(), cdl.data(), logits.data(), targets.data(), 0.01f, rows, V, Vp});
  auto gt = dev(targets);
  auto glog = dev(logits), gloss = dev(std::vector<float>(rows));
  // d_logits aliases logits, as the trainer runs it.
  cross_entropy_forward_backward(gpu_, {gloss.p(), glog.p(), glog.p(), gt.p(), 0.01f, rows, V, Vp});
  EXPECT_TRUE(all_close("cross_entropy loss vs ref", gloss.host(), loss, {1e-5, 1e-5}));
  EXPECT_TRUE(all_close("cross_entropy d_logits vs ref", glog.host(), dl, {1e-8, 1e-4}));
  EXPECT_TRUE(all_close("cross_entropy loss vs cpu", gloss.host(), closs, {1e-5, 1e-5}));
  EXPECT_TRUE(all_close("cross_entropy d_logits vs cpu", glog.host(), cdl, {1e-8, 1e-4}));
  auto bad = targets;
  bad[10] = static_cast<std::int32_t>(V + 3);  // a padding column
  auto gbad = dev(bad);
  auto glog2 = dev(logits);
  cross_entropy_forward_backward(gpu_,
                                 {gloss.p(), nullptr, glog2.p(), gbad.p(), 1.0f, rows, V, Vp});
  try {
    kernels::synchronize(gpu_);
    ADD_FAILURE() << "a target in the padding was not reported";
  } catch (const core::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("targets[10] = 1003"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::isnan(gloss.host()[10])) << "the bad row's loss is NaN, not a read past the row";
}

TEST_F(Cuda, RmsNormMatchesReferenceAndCpu) {
  const std::int64_t rows = 300, cols = 1000;
  const auto x = randn(rows * cols, 40, 2.0, 0.5), w = randn(cols, 41), dy = randn(rows * cols, 42);
  std::vector<float> out(rows * cols), rstd(rows), cout_(rows * cols), crstd(rows);
  ref::rmsnorm_forward({out.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-5f});
  rmsnorm_forward(cpu_, {cout_.data(), crstd.data(), x.data(), w.data(), rows, cols, 1e-5f});
  auto dx = dev(x), dw = dev(w), ddy = dev(dy);
  auto dout = dev(std::vector<float>(rows * cols)), drstd = dev(std::vector<float>(rows));
  rmsnorm_forward(gpu_, {dout.p(), drstd.p(), dx.p(), dw.p(), rows, cols, 1e-5f});
  EXPECT_TRUE(all_close("rmsnorm out vs ref", dout.host(), out, kRow));
  EXPECT_TRUE(all_close("rmsnorm rstd vs ref", drstd.host(), rstd, kRow));
  EXPECT_TRUE(all_close("rmsnorm out vs cpu", dout.host(), cout_, kRow));
  const auto d_in0 = randn(rows * cols, 43);  // accumulated into (+=)
  auto rdin = d_in0, cdin = d_in0;
  std::vector<float> rdw(cols, 0.5f), cdw(cols, 0.5f);
  ref::rmsnorm_backward(
      {rdin.data(), rdw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, cols});
  rmsnorm_backward(
      cpu_, {cdin.data(), cdw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, cols});
  auto gdin = dev(d_in0), gdw = dev(std::vector<float>(cols, 0.5f));
  rmsnorm_backward(gpu_, {gdin.p(), gdw.p(), ddy.p(), dx.p(), dw.p(), drstd.p(), rows, cols});
  EXPECT_TRUE(all_close("rmsnorm d_in vs ref", gdin.host(), rdin, kRow));
  EXPECT_TRUE(all_close("rmsnorm d_weight vs ref", gdw.host(), rdw, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("rmsnorm d_in vs cpu", gdin.host(), cdin, kRow));
  EXPECT_TRUE(all_close("rmsnorm d_weight vs cpu", gdw.host(), cdw, {1e-4, 1e-4}));
}

// Rotary positions with grouped heads (2 groups of 3 query heads), per-row positions and the
// plain expansion (no inv_freq); forward and the transpose.
TEST_F(Cuda, RopeQkvMatchesReferenceAndCpu) {
  const std::int64_t rows = 40, T = 20, G = 2, hpg = 3, HS = 16;
  std::vector<float> inv_freq(HS / 2);
  for (std::int64_t i = 0; i < HS / 2; ++i)
    inv_freq[static_cast<std::size_t>(i)] =
        static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / HS));
  std::vector<std::int32_t> positions(rows);
  for (std::int64_t r = 0; r < rows; ++r) positions[static_cast<std::size_t>(r)] = (r * 7) % 33;
  auto ginv = dev(inv_freq);
  auto gpos = dev(positions);
  for (int variant = 0; variant < 3; ++variant) {
    RopeQkvShape host{.rows = rows,
                      .seq_len = T,
                      .position = 5,
                      .groups = G,
                      .heads_per_group = hpg,
                      .head_dim = HS,
                      .inv_freq = variant == 2 ? nullptr : inv_freq.data(),
                      .positions = variant == 1 ? positions.data() : nullptr};
    RopeQkvShape device = host;
    device.inv_freq = variant == 2 ? nullptr : ginv.p();
    device.positions = variant == 1 ? gpos.p() : nullptr;
    const auto in = randn(rows * host.in_cols(), 60 + variant);
    const auto dy = randn(rows * host.out_cols(), 63 + variant);
    std::vector<float> out(rows * host.out_cols()), cout_(out.size());
    ref::rope_qkv_forward({out.data(), in.data(), host});
    rope_qkv_forward(cpu_, {cout_.data(), in.data(), host});
    auto gin = dev(in), gdy = dev(dy), gout = dev(std::vector<float>(out.size()));
    rope_qkv_forward(gpu_, {gout.p(), gin.p(), device});
    const std::string v = " (variant " + std::to_string(variant) + ")";
    EXPECT_TRUE(all_close((std::string("rope out vs ref") + v).c_str(), gout.host(), out, kElem));
    EXPECT_TRUE(all_close((std::string("rope out vs cpu") + v).c_str(), gout.host(), cout_, kElem));
    std::vector<float> din(rows * host.in_cols()), cdin(din.size());
    ref::rope_qkv_backward({din.data(), dy.data(), host});
    rope_qkv_backward(cpu_, {cdin.data(), dy.data(), host});
    auto gdin = dev(std::vector<float>(din.size()));
    rope_qkv_backward(gpu_, {gdin.p(), gdy.p(), device});
    EXPECT_TRUE(all_close((std::string("rope d_in vs ref") + v).c_str(), gdin.host(), din, kElem));
    EXPECT_TRUE(all_close((std::string("rope d_in vs cpu") + v).c_str(), gdin.host(), cdin, kElem));
  }
}

// A prompt of 5 tokens, then one more, against a cache of 12 positions, with and without ALiBi:
// the outputs and the caches against the reference and the CPU.
TEST_F(Cuda, KvCacheAttentionMatchesReferenceAndCpu) {
  const std::int64_t NH = 3, HS = 16, C = NH * HS, P = 12;
  std::vector<float> slopes(NH);
  alibi_slopes(NH, slopes.data());
  auto gslopes = dev(slopes);
  for (bool alibi : {false, true}) {
    std::vector<float> rk(P * C, 0.0f), rv(P * C, 0.0f), ck(P * C, 0.0f), cv(P * C, 0.0f);
    auto gk = dev(std::vector<float>(P * C, 0.0f)), gv = dev(std::vector<float>(P * C, 0.0f));
    std::vector<float> scratch(static_cast<std::size_t>(kv_cache_attention_scratch_floats(P, NH)));
    auto gscratch = dev(scratch);
    std::int64_t position = 0;
    for (std::int64_t rows : {5, 1}) {
      const auto qkv = randn(rows * NH * 3 * HS, 70 + rows);
      std::vector<float> out(rows * C), cout_(rows * C);
      KvCacheAttentionArgs a{.out = out.data(),
                             .k_cache = rk.data(),
                             .v_cache = rv.data(),
                             .qkv = qkv.data(),
                             .alibi = alibi ? slopes.data() : nullptr,
                             .rows = rows,
                             .position = position,
                             .max_positions = P,
                             .num_heads = NH,
                             .head_dim = HS,
                             .scratch = scratch};
      ref::kv_cache_attention(a);
      KvCacheAttentionArgs c = a;
      c.out = cout_.data();
      c.k_cache = ck.data();
      c.v_cache = cv.data();
      kv_cache_attention(cpu_, c);
      auto gqkv = dev(qkv), gout = dev(std::vector<float>(rows * C));
      KvCacheAttentionArgs g = a;
      g.out = gout.p();
      g.k_cache = gk.p();
      g.v_cache = gv.p();
      g.qkv = gqkv.p();
      g.alibi = alibi ? gslopes.p() : nullptr;
      g.scratch = std::span<float>(gscratch.p(), scratch.size());
      kv_cache_attention(gpu_, g);
      const std::string w = alibi ? " (ALiBi)" : "";
      EXPECT_TRUE(
          all_close((std::string("kv-cache out vs ref") + w).c_str(), gout.host(), out, kRow));
      EXPECT_TRUE(
          all_close((std::string("kv-cache out vs cpu") + w).c_str(), gout.host(), cout_, kRow));
      EXPECT_TRUE(all_equal((std::string("k cache vs cpu") + w).c_str(), gk.host(), ck));
      EXPECT_TRUE(all_equal((std::string("v cache vs cpu") + w).c_str(), gv.host(), cv));
      position += rows;
    }
  }
}

TEST_F(Cuda, SwiGluMatchesReferenceAndCpu) {
  const std::int64_t rows = 129, F = 700;
  auto in = randn(rows * 2 * F, 44, 3.0);
  in[0] = 60.0f;
  in[1] = -60.0f;  // saturated gates
  const auto dy = randn(rows * F, 45);
  std::vector<float> out(rows * F), cout_(rows * F), din(rows * 2 * F), cdin(rows * 2 * F);
  ref::swiglu_forward({out.data(), in.data(), rows, F});
  swiglu_forward(cpu_, {cout_.data(), in.data(), rows, F});
  auto gin = dev(in), gdy = dev(dy), gout = dev(std::vector<float>(rows * F));
  swiglu_forward(gpu_, {gout.p(), gin.p(), rows, F});
  EXPECT_TRUE(all_close("swiglu out vs ref", gout.host(), out, kElem));
  EXPECT_TRUE(all_close("swiglu out vs cpu", gout.host(), cout_, kElem));
  ref::swiglu_backward({din.data(), dy.data(), in.data(), rows, F});
  swiglu_backward(cpu_, {cdin.data(), dy.data(), in.data(), rows, F});
  auto gdin = dev(std::vector<float>(rows * 2 * F));
  swiglu_backward(gpu_, {gdin.p(), gdy.p(), gin.p(), rows, F});
  EXPECT_TRUE(all_close("swiglu d_in vs ref", gdin.host(), din, kElem));
  EXPECT_TRUE(all_close("swiglu d_in vs cpu", gdin.host(), cdin, kElem));
}

// The three parts with the reductions between them done on the host, for a shard that holds the
// end of the real vocabulary and padding columns, and the token-loss sum (row order, as the CPU).
TEST_F(Cuda, VocabParallelCrossEntropyMatchesReferenceAndCpu) {
  const std::int64_t rows = 65, Vl = 512;
  const VocabParallelShard shard{.vocab = 1000, .vocab_start = 512, .vocab_local = Vl};
  auto logits = randn(rows * Vl, 46, 3.0);
  std::vector<std::int32_t> targets(rows);
  for (std::int64_t r = 0; r < rows; ++r) targets[r] = static_cast<std::int32_t>((r * 97) % 1000);
  targets[4] = -1;
  std::vector<float> rmax(rows), rsum(rows), rtgt(rows), cmax(rows), csum(rows), ctgt(rows);
  ref::vocab_parallel_ce_max({rmax.data(), logits.data(), rows, shard});
  vocab_parallel_ce_max(cpu_, {cmax.data(), logits.data(), rows, shard});
  auto glog = dev(logits), gmax = dev(std::vector<float>(rows));
  auto gt = dev(targets);
  vocab_parallel_ce_max(gpu_, {gmax.p(), glog.p(), rows, shard});
  EXPECT_TRUE(all_equal("ce max vs cpu", gmax.host(), cmax));
  EXPECT_TRUE(all_close("ce max vs ref", gmax.host(), rmax, kElem));
  ref::vocab_parallel_ce_sum_target(
      {rsum.data(), rtgt.data(), logits.data(), rmax.data(), targets.data(), rows, shard});
  vocab_parallel_ce_sum_target(
      cpu_, {csum.data(), ctgt.data(), logits.data(), cmax.data(), targets.data(), rows, shard});
  auto gsum = dev(std::vector<float>(rows)), gtgt = dev(std::vector<float>(rows));
  vocab_parallel_ce_sum_target(gpu_, {gsum.p(), gtgt.p(), glog.p(), gmax.p(), gt.p(), rows, shard});
  EXPECT_TRUE(all_close("ce sum_exp vs ref", gsum.host(), rsum, {1e-6, 1e-6}));
  EXPECT_TRUE(all_close("ce sum_exp vs cpu", gsum.host(), csum, {1e-6, 1e-6}));
  EXPECT_TRUE(all_equal("ce target logit vs cpu", gtgt.host(), ctgt));
  std::vector<float> rloss(rows), rdl(rows * Vl), closs(rows), cdl(rows * Vl);
  ref::vocab_parallel_ce_loss({rloss.data(), rdl.data(), logits.data(), rmax.data(), rsum.data(),
                               rtgt.data(), targets.data(), 0.01f, rows, shard});
  vocab_parallel_ce_loss(cpu_, {closs.data(), cdl.data(), logits.data(), cmax.data(), csum.data(),
                                ctgt.data(), targets.data(), 0.01f, rows, shard});
  auto gloss = dev(std::vector<float>(rows));
  // d_logits aliases logits, as the head runs it.
  vocab_parallel_ce_loss(gpu_, {gloss.p(), glog.p(), glog.p(), gmax.p(), gsum.p(), gtgt.p(), gt.p(),
                                0.01f, rows, shard});
  EXPECT_TRUE(all_close("ce loss vs ref", gloss.host(), rloss, {1e-5, 1e-5}));
  EXPECT_TRUE(all_close("ce loss vs cpu", gloss.host(), closs, {1e-5, 1e-5}));
  EXPECT_TRUE(all_close("ce d_logits vs ref", glog.host(), rdl, {1e-8, 1e-4}));
  EXPECT_TRUE(all_close("ce d_logits vs cpu", glog.host(), cdl, {1e-8, 1e-4}));
  const TokenLossSum g = sum_token_losses(gpu_, gloss.p(), gt.p(), rows);
  const TokenLossSum c = sum_token_losses(cpu_, gloss.host().data(), targets.data(), rows);
  EXPECT_EQ(g.count, rows - 1);
  EXPECT_EQ(g.count, c.count);
  EXPECT_EQ(g.sum, c.sum);  // the same floats added in the same order
  auto bad = targets;
  bad[7] = 1000;  // beyond the real vocabulary
  auto gbad = dev(bad);
  // Reported with the loss's read-back: the micro-batch's one host sync.
  vocab_parallel_ce_loss(gpu_, {gloss.p(), nullptr, glog.p(), gmax.p(), gsum.p(), gtgt.p(),
                                gbad.p(), 1.0f, rows, shard});
  EXPECT_THROW(sum_token_losses(gpu_, gloss.p(), gbad.p(), rows), core::InternalError);
}

// The same Philox draws as the CPU: dropout masks bit for bit, normals to the last ulp of libm.
TEST_F(Cuda, DropoutAndInitDrawTheCpusNumbers) {
  const std::int64_t rows = 37, cols = 300;
  const auto x = randn(rows * cols, 47);
  const HiddenDropoutArgs cargs{
      .rows = rows, .cols = cols, .first_row = 1234, .p = 0.3f, .seed = 99, .stream = 7};
  std::vector<float> cout_(rows * cols), rout(rows * cols);
  HiddenDropoutArgs a = cargs;
  a.out = cout_.data();
  a.in = x.data();
  hidden_dropout(cpu_, a);
  a.out = rout.data();
  ref::hidden_dropout(a);
  auto gx = dev(x), gout = dev(std::vector<float>(rows * cols));
  a.out = gout.p();
  a.in = gx.p();
  hidden_dropout(gpu_, a);
  EXPECT_TRUE(all_equal("hidden_dropout vs cpu", gout.host(), cout_));
  EXPECT_TRUE(all_close("hidden_dropout vs ref", gout.host(), rout, kElem));
  // A column split of a (10, 64) weight: this rank holds columns [16, 48).
  const InitNormalArgs init{.begin = 5,
                            .end = 300,
                            .seed = 3,
                            .stream = 11,
                            .stddev = 0.02,
                            .base = 0,
                            .local_cols = 32,
                            .global_cols = 64,
                            .col_offset = 16};
  std::vector<float> cinit(295), rinit(295);
  InitNormalArgs b = init;
  b.out = cinit.data();
  init_normal(cpu_, b);
  b.out = rinit.data();
  ref::init_normal(b);
  auto ginit = dev(std::vector<float>(295));
  b.out = ginit.p();
  init_normal(gpu_, b);
  EXPECT_TRUE(all_close("init_normal vs cpu", ginit.host(), cinit, {1e-9, 1e-6}));
  EXPECT_TRUE(all_close("init_normal vs ref", ginit.host(), rinit, {1e-9, 1e-6}));
}

TEST_F(Cuda, AttentionMatchesReferenceAndCpu) {
  const std::int64_t B = 2, T = 45, NH = 3, HS = 32, C = NH * HS;
  const auto qkv = randn(B * T * 3 * C, 26), dy = randn(B * T * C, 27);
  std::vector<float> out(B * T * C), probs(B * NH * T * T), dqkv(B * T * 3 * C),
      dprobs(B * NH * T * T);
  ref::attention_forward({out.data(), probs.data(), qkv.data(), B, T, NH, HS});
  ref::attention_backward(
      {dqkv.data(), dprobs.data(), dy.data(), qkv.data(), probs.data(), B, T, NH, HS});
  auto gqkv = dev(qkv), gdy = dev(dy), gout = dev(std::vector<float>(B * T * C)),
       gprobs = dev(std::vector<float>(B * NH * T * T)),
       gdqkv = dev(std::vector<float>(B * T * 3 * C)),
       gdprobs = dev(std::vector<float>(B * NH * T * T));
  attention_forward(gpu_, {gout.p(), gprobs.p(), gqkv.p(), B, T, NH, HS});
  attention_backward(gpu_, {gdqkv.p(), gdprobs.p(), gdy.p(), gqkv.p(), gprobs.p(), B, T, NH, HS});
  EXPECT_TRUE(all_close("attention out", gout.host(), out, {1e-5, 1e-4}));
  EXPECT_TRUE(all_close("attention probs", gprobs.host(), probs, {1e-6, 1e-4}));
  EXPECT_TRUE(all_close("attention d_qkv", gdqkv.host(), dqkv, {1e-5, 1e-4}));
}

struct FlashCase {
  std::int64_t B, T, NH, HS;
  bool alibi;
  float dropout;
};
class CudaFlash : public Cuda, public ::testing::WithParamInterface<FlashCase> {};

TEST_P(CudaFlash, MatchesReferenceAndCpuWithTheSameDropoutMasks) {
  const FlashCase c = GetParam();
  const std::int64_t C = c.NH * c.HS;
  const auto qkv = randn(c.B * c.T * 3 * C, 28), dy = randn(c.B * c.T * C, 29);
  std::vector<float> slopes(c.NH);
  alibi_slopes(c.NH, slopes.data());
  const AttentionDropout drop{.p = c.dropout,
                              .seed = 5,
                              .stream = 77,
                              .first_sample = 3,
                              .head_offset = 2,
                              .total_heads = c.NH + 4};
  std::vector<float> out(c.B * c.T * C), lse(c.B * c.NH * c.T), dqkv(c.B * c.T * 3 * C);
  FlashAttentionForwardArgs fa{.out = out.data(),
                               .lse = lse.data(),
                               .qkv = qkv.data(),
                               .alibi = c.alibi ? slopes.data() : nullptr,
                               .dropout = drop,
                               .batch = c.B,
                               .seq_len = c.T,
                               .num_heads = c.NH,
                               .head_dim = c.HS};
  ref::flash_attention_forward(fa);
  FlashAttentionBackwardArgs ba{.d_qkv = dqkv.data(),
                                .d_out = dy.data(),
                                .qkv = qkv.data(),
                                .out = out.data(),
                                .lse = lse.data(),
                                .alibi = fa.alibi,
                                .dropout = drop,
                                .batch = c.B,
                                .seq_len = c.T,
                                .num_heads = c.NH,
                                .head_dim = c.HS};
  ref::flash_attention_backward(ba);
  std::vector<float> cout(out.size()), clse(lse.size());
  FlashAttentionForwardArgs ca = fa;
  ca.out = cout.data();
  ca.lse = clse.data();
  flash_attention_forward(cpu_, ca);

  auto gqkv = dev(qkv), gdy = dev(dy), gslopes = dev(slopes), gout = dev(out), glse = dev(lse),
       gdqkv = dev(std::vector<float>(dqkv.size(), NAN));
  FlashAttentionForwardArgs gfa = fa;
  gfa.out = gout.p();
  gfa.lse = glse.p();
  gfa.qkv = gqkv.p();
  gfa.alibi = c.alibi ? gslopes.p() : nullptr;
  flash_attention_forward(gpu_, gfa);
  EXPECT_TRUE(all_close("flash out vs ref", gout.host(), out, {2e-5, 1e-4}));
  EXPECT_TRUE(all_close("flash lse vs ref", glse.host(), lse, {2e-5, 1e-5}));
  EXPECT_TRUE(all_close("flash out vs cpu", gout.host(), cout, {2e-5, 1e-4}));
  // Backward from the reference forward's out/lse, so only the backward is under test.
  auto rout = dev(out), rlse = dev(lse);
  FlashAttentionBackwardArgs gba = ba;
  gba.d_qkv = gdqkv.p();
  gba.d_out = gdy.p();
  gba.qkv = gqkv.p();
  gba.out = rout.p();
  gba.lse = rlse.p();
  gba.alibi = gfa.alibi;
  flash_attention_backward(gpu_, gba);
  EXPECT_TRUE(all_close("flash d_qkv vs ref", gdqkv.host(), dqkv, {5e-5, 2e-4}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlash,
                         ::testing::Values(FlashCase{2, 33, 2, 16, false, 0.0f},
                                           FlashCase{1, 64, 3, 64, true, 0.0f},
                                           FlashCase{2, 40, 2, 32, true, 0.25f},
                                           FlashCase{1, 70, 2, 128, false, 0.1f}),
                         [](const ::testing::TestParamInfo<FlashCase>& i) {
                           const FlashCase& c = i.param;
                           return "B" + std::to_string(c.B) + "T" + std::to_string(c.T) + "NH" +
                                  std::to_string(c.NH) + "HS" + std::to_string(c.HS) +
                                  (c.alibi ? "Alibi" : "") + (c.dropout > 0.0f ? "Dropout" : "");
                         });

// Every transposition, strided operands, beta 0 (C garbage) and beta 1.
TEST_F(Cuda, GemmFp32MatchesReference) {
  for (Trans ta : {Trans::kNo, Trans::kYes}) {
    for (Trans tb : {Trans::kNo, Trans::kYes}) {
      for (float beta : {0.0f, 1.0f}) {
        const std::int64_t M = 67, N = 45, K = 129;
        const std::int64_t lda = (ta == Trans::kYes ? M : K) + 3,
                           ldb = (tb == Trans::kYes ? K : N) + 1, ldc = N + 2;
        const auto a = randn((ta == Trans::kYes ? K : M) * lda, 30),
                   b = randn((tb == Trans::kYes ? N : K) * ldb, 31), c0 = randn(M * ldc, 32);
        auto c = c0;
        GemmArgs g{ta, tb, M, N, K, 0.5f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc};
        ref::gemm(g);
        auto ga = dev(a), gb = dev(b),
             gc = dev(beta == 0.0f ? std::vector<float>(c0.size(), NAN) : c0);
        GemmArgs gg = g;
        gg.a = ga.p();
        gg.b = gb.p();
        gg.c = gc.p();
        gemm(gpu_, gg);
        auto got = gc.host();
        for (std::int64_t i = 0; i < M; ++i) {
          for (std::int64_t j = N; j < ldc; ++j) got[i * ldc + j] = c[i * ldc + j];  // padding
        }
        EXPECT_TRUE(all_close("gemm fp32", got, c, {1e-4, 1e-4}))
            << "trans_a " << (ta == Trans::kYes) << " trans_b " << (tb == Trans::kYes) << " beta "
            << beta;
      }
    }
  }
}

TEST_F(Cuda, LinearFp32AndBf16MatchReference) {
  const std::int64_t rows = 96, in_f = 128, out_f = 80;
  const auto x = randn(rows * in_f, 33), w = randn(out_f * in_f, 34, 0.1), b = randn(out_f, 35),
             dy = randn(rows * out_f, 36);
  std::vector<float> out(rows * out_f), din(rows * in_f), dw(out_f * in_f, 1.0f), db(out_f, 1.0f);
  ref::linear_forward({out.data(), x.data(), w.data(), b.data(), rows, in_f, out_f});
  ref::linear_backward(
      {din.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), rows, in_f, out_f});
  auto gx = dev(x), gw = dev(w), gb = dev(b), gdy = dev(dy), gout = dev(out), gdin = dev(din),
       gdw = dev(std::vector<float>(dw.size(), 1.0f)), gdb = dev(std::vector<float>(out_f, 1.0f));
  linear_forward(gpu_, {gout.p(), gx.p(), gw.p(), gb.p(), rows, in_f, out_f});
  linear_backward(gpu_, {gdin.p(), gdw.p(), gdb.p(), gdy.p(), gx.p(), gw.p(), rows, in_f, out_f});
  EXPECT_TRUE(all_close("linear out", gout.host(), out, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("linear d_in", gdin.host(), din, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("linear d_weight", gdw.host(), dw, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("linear d_bias", gdb.host(), db, {1e-5, 1e-5}));

  // BF16 operands: the reference multiplies the same bf16 values in double.
  auto to16 = [](const std::vector<float>& v) {
    std::vector<core::bf16> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) r[i] = core::bf16::from_float(v[i]);
    return r;
  };
  const auto x16 = to16(x), w16 = to16(w), dy16 = to16(dy);
  std::vector<float> out16(rows * out_f), din16(rows * in_f), dw16(out_f * in_f, 1.0f),
      db16(out_f, 1.0f);
  ref::linear_forward_bf16({.out = out16.data(),
                            .in = x16.data(),
                            .weight = w16.data(),
                            .bias = b.data(),
                            .rows = rows,
                            .in_features = in_f,
                            .out_features = out_f});
  ref::linear_backward_bf16({.d_in = din16.data(),
                             .d_weight = dw16.data(),
                             .d_bias = db16.data(),
                             .d_out = dy.data(),
                             .d_out_bf16 = dy16.data(),
                             .in = x16.data(),
                             .weight = w16.data(),
                             .rows = rows,
                             .in_features = in_f,
                             .out_features = out_f});
  auto gx16 = dev(x16), gw16 = dev(w16), gdy16 = dev(dy16);
  auto gout16 = dev(out16), gdin16 = dev(din16), gdw16 = dev(std::vector<float>(dw.size(), 1.0f)),
       gdb16 = dev(std::vector<float>(out_f, 1.0f));
  linear_forward_bf16(gpu_, {.out = gout16.p(),
                             .in = gx16.p(),
                             .weight = gw16.p(),
                             .bias = gb.p(),
                             .rows = rows,
                             .in_features = in_f,
                             .out_features = out_f});
  linear_backward_bf16(gpu_, {.d_in = gdin16.p(),
                              .d_weight = gdw16.p(),
                              .d_bias = gdb16.p(),
                              .d_out = gdy.p(),
                              .d_out_bf16 = gdy16.p(),
                              .in = gx16.p(),
                              .weight = gw16.p(),
                              .rows = rows,
                              .in_features = in_f,
                              .out_features = out_f});
  EXPECT_TRUE(all_close("linear_bf16 out", gout16.host(), out16, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("linear_bf16 d_in", gdin16.host(), din16, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("linear_bf16 d_weight", gdw16.host(), dw16, {1e-4, 1e-4}));
  EXPECT_TRUE(all_close("linear_bf16 d_bias", gdb16.host(), db16, {1e-5, 1e-5}));
}

TEST_F(Cuda, DeviceArenaHandsOutAlignedCudaViews) {
  cuda::DeviceArena arena(1 << 20);
  const core::TensorView a = arena.alloc(core::DType::kF32, {3, 5});
  const core::TensorView b = arena.alloc(core::DType::kBF16, {7});
  EXPECT_EQ(a.device.kind, core::DeviceKind::kCuda);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data) % cuda::DeviceArena::kAlign, 0u);
  EXPECT_EQ(arena.used(), 2 * cuda::DeviceArena::kAlign);
  EXPECT_THROW(arena.alloc(core::DType::kF32, {1 << 20}), core::InternalError);
  std::vector<float> zeros(15, 1.0f);
  cuda::copy_to_host(zeros.data(), a.data, 15 * 4, nullptr);
  cuda::synchronize(nullptr);
  for (float z : zeros) EXPECT_EQ(z, 0.0f) << "arenas start zero-filled";
}

}  // namespace
}  // namespace trident::kernels
