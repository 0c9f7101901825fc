// model/ and optim/ pure logic: the parameter table, layout-independent initialization, the
// FLOPs formula, the learning-rate schedule and the clipping coefficient.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "trident/core/error.h"
#include "trident/model/config.h"
#include "trident/model/param_table.h"
#include "trident/optim/adamw_optimizer.h"
#include "trident/optim/lr_schedule.h"

namespace trident {
namespace {

model::ModelConfig tiny() {
  model::ModelConfig c;
  c.num_layers = 3;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.vocab_size = 100;
  return c;
}

TEST(ParamTable, GptTableIsAlignedDisjointAndComplete) {
  const model::ModelConfig c = tiny();
  const model::ParamTable t = model::build_gpt_param_table(c);
  EXPECT_EQ(t.params.size(), 2u + 12u * 3u + 2u);
  std::int64_t end = 0;
  for (const model::ParamSpec& p : t.params) {
    EXPECT_EQ(p.offset % model::ParamTable::kAlign, 0) << p.name;
    EXPECT_GE(p.offset, end) << p.name;
    end = p.offset + p.numel;
    const bool no_decay =
        p.name.find("bias") != std::string::npos || p.name.find("layernorm") != std::string::npos;
    EXPECT_EQ(p.weight_decay, !no_decay) << p.name;
  }
  EXPECT_LE(end, t.total_numel);
  EXPECT_EQ(t.num_parameters(), c.num_parameters());
  EXPECT_EQ(t.find("embedding.word_embeddings.weight").shape,
            (std::vector<std::int64_t>{128, 16}));  // vocab padded to a multiple of 128
  EXPECT_THROW(t.find("nope"), core::InvalidArgument);
}

TEST(ParamTable, InitIsKeyedByNameAndIndexWithMegatronStds) {
  model::ModelConfig c = tiny();
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.init_method_std = 0.02f;
  const model::ParamTable t = model::build_gpt_param_table(c);
  std::vector<float> a(static_cast<std::size_t>(t.total_numel)), b(a.size());
  model::init_params(c, t, 7, a.data());
  model::init_params(c, t, 7, b.data());
  EXPECT_EQ(a, b);
  auto stddev = [&](const std::string& name) {
    const model::ParamSpec& p = t.find(name);
    double s = 0;
    for (std::int64_t i = 0; i < p.numel; ++i)
      s += a[static_cast<std::size_t>(p.offset + i)] * a[static_cast<std::size_t>(p.offset + i)];
    return std::sqrt(s / static_cast<double>(p.numel));
  };
  EXPECT_NEAR(stddev("layers.0.mlp.dense_h_to_4h.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("layers.0.mlp.dense_4h_to_h.weight"), 0.02 / std::sqrt(6.0), 0.0005);
  EXPECT_EQ(a[static_cast<std::size_t>(t.find("layers.1.input_layernorm.weight").offset)], 1.0f);
  EXPECT_EQ(a[static_cast<std::size_t>(t.find("layers.1.input_layernorm.bias").offset)], 0.0f);
  // Element i of a parameter depends only on (seed, name, i): a model with more layers draws the
  // same values for the layers both have, whatever comes before them in the flat buffer.
  model::ModelConfig deeper = c;
  deeper.num_layers = 5;
  const model::ParamTable t2 = model::build_gpt_param_table(deeper);
  std::vector<float> d(static_cast<std::size_t>(t2.total_numel));
  model::init_params(deeper, t2, 7, d.data());
  const model::ParamSpec& p1 = t.find("layers.2.self_attention.query_key_value.weight");
  const model::ParamSpec& p2 = t2.find("layers.2.self_attention.query_key_value.weight");
  for (std::int64_t i = 0; i < p1.numel; ++i) {
    ASSERT_EQ(a[static_cast<std::size_t>(p1.offset + i)],
              d[static_cast<std::size_t>(p2.offset + i)]);
  }
}

TEST(ModelConfig, ValidationNamesTheFlag) {
  model::ModelConfig c = tiny();
  c.num_attention_heads = 3;
  try {
    c.validate();
    FAIL();
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--hidden-size (16) must be divisible by "
                                         "--num-attention-heads (3)"),
              std::string::npos);
  }
  c = tiny();
  c.max_position_embeddings = 4;
  EXPECT_THROW(c.validate(), core::InvalidArgument);
}

TEST(ModelConfig, FlopsFollowMegatronFormula) {
  model::ModelConfig c;
  c.num_layers = 12;
  c.hidden_size = 768;
  c.num_attention_heads = 12;
  c.seq_length = 1024;
  c.vocab_size = 50257;
  const double B = 8, s = 1024, l = 12, h = 768, V = 50304;
  const double expected = 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  EXPECT_NEAR(c.flops_per_iteration(8 * 1024) / expected, 1.0, 1e-12);
  EXPECT_EQ(c.padded_vocab_size(), 50304);
  EXPECT_EQ(c.padded_vocab_size(2), 50432);
}

TEST(LrSchedule, WarmupThenDecay) {
  optim::LrSchedule s{.lr = 1.0,
                      .min_lr = 0.1,
                      .decay_style = optim::LrDecayStyle::kCosine,
                      .warmup_iters = 10,
                      .decay_iters = 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(5), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  s.decay_style = optim::LrDecayStyle::kLinear;
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.75, 1e-12);
  s.decay_style = optim::LrDecayStyle::kConstant;
  EXPECT_DOUBLE_EQ(s.at(80), 1.0);
  EXPECT_THROW(optim::parse_lr_decay_style("exp"), core::InvalidArgument);
}

TEST(Clip, CoefficientAsTorch) {
  EXPECT_FLOAT_EQ(optim::clip_coefficient(2.0, 1.0f), static_cast<float>(1.0 / (2.0 + 1e-6)));
  EXPECT_FLOAT_EQ(optim::clip_coefficient(0.5, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(optim::clip_coefficient(100.0, 0.0f), 1.0f);
}

}  // namespace
}  // namespace trident
