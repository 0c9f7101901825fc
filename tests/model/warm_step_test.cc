// A warm step allocates nothing in the matmuls: every oneDNN BF16 matmul primitive (one per
// product configuration: shape, strides, transpositions, beta, bias, threads) a training step uses
// is created by the activation layout's scratch sizing or the first step, and the second step, on
// the same shapes, creates none (oneDNN allocates when it creates a primitive), also when the
// experts of a mixture-of-experts layer get other row counts each step.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tiny_model.h"
#include "trident/core/bf16.h"
#include "trident/kernels/matmul_bf16.h"
#include "trident/model/gpt.h"

namespace trident::model {
namespace {

// One BF16 step of the model (forward, loss, backward) on fresh tokens.
struct Bf16Model {
  testing::TinyParams f32;
  const ModelConfig& cfg = f32.cfg;
  std::vector<core::bf16> params16;
  ModelRuntime rt;
  GptActivations acts;
  std::mt19937 rng{3};

  Bf16Model(const ModelConfig& c, std::int64_t B) : f32(c, 9) {
    for (float x : f32.params) params16.push_back(core::bf16::from_float(x));
    make_activations(cfg, rt.shard, B, cfg.seq_length, /*bf16=*/true, acts);
  }

  void step(const core::ExecContext& ctx) {
    const std::int64_t n = acts.batch * acts.seq_len;
    const auto tokens = testing::random_ids(rng, n, cfg.vocab_size);
    const auto labels = testing::random_ids(rng, n, cfg.vocab_size);
    const GptParams p = gpt_param_views(cfg, f32.table, f32.params.data(), params16.data());
    const GptGrads g = f32.grad_views();
    gpt_forward(ctx, cfg, rt, p, {.tokens = tokens.data()}, acts);
    gpt_loss(ctx, cfg, rt, p, g, labels.data(), 1.0f / static_cast<float>(n), LossGrad::kCompute,
             acts);
    gpt_backward(ctx, cfg, rt, p, g, tokens.data(), acts);
  }
};

ModelConfig small(bool chunked_head) {
  ModelConfig cfg = testing::tiny_config(/*seq_length=*/16, /*vocab_size=*/300);
  // The chunked head runs its output layer on chunks of 20 rows: 32 rows = a full and a partial
  // chunk, two more product shapes.
  cfg.loss_chunk_rows = chunked_head ? 20 : 0;
  return cfg;
}

TEST(WarmStep, Bf16MatmulsCreateNoPrimitivesAfterTheFirstStep) {
  for (const bool chunked : {false, true}) {
    Bf16Model m(small(chunked), 2);
    const core::ExecContext ctx;  // as the trainer's: every thread
    m.step(ctx);
    const std::int64_t after_first = kernels::gemm_bf16_primitives_created();
    m.step(ctx);
    m.step(ctx);
    EXPECT_EQ(kernels::gemm_bf16_primitives_created(), after_first)
        << "a warm step created matmul primitives (chunked head: " << chunked << ")";
  }
  // BF16 experts: their matmuls run by fixed blocks of rows (model/layers/moe.h), so the routing,
  // which gives each expert other row counts every step, creates no new product shapes. With
  // top-1 of 4 experts over 32 rows the counts are uneven, some above one block.
  ModelConfig moe = small(false);
  moe.swiglu = true;
  moe.add_bias_linear = false;
  moe.num_experts = 4;
  moe.moe_router_topk = 1;
  moe.moe_shared_expert_intermediate_size = 32;
  Bf16Model m(moe, 4);
  const core::ExecContext ctx;
  m.step(ctx);
  const std::int64_t after_first = kernels::gemm_bf16_primitives_created();
  for (int i = 0; i < 4; ++i) m.step(ctx);
  EXPECT_EQ(kernels::gemm_bf16_primitives_created(), after_first)
      << "a warm step of the BF16 experts created matmul primitives";
  // The counter counts: a product shape never seen before creates one.
  const std::int64_t before = kernels::gemm_bf16_primitives_created();
  (void)kernels::gemm_bf16_scratch_bytes(core::ExecContext{},
                                         {.m = 7, .n = 5, .k = 3, .lda = 3, .ldb = 5, .ldc = 5});
  EXPECT_EQ(kernels::gemm_bf16_primitives_created(), before + 1);
}

}  // namespace
}  // namespace trident::model
