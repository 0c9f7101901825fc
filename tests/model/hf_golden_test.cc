// Golden test against Hugging Face transformers (tests/reference/hf_reference.py): GPT-2, BLOOM,
// Llama and Mixtral built by transformers from their configs, with trident's weights copied in, in
// float64. `--dump PATH --variant V` writes the inputs (config, one batch, the initial weights);
// `--inputs IN --reference REF --variant V` recomputes in trident (FP32) and compares the logits,
// transformers' own loss (it shifts the labels itself) and every parameter gradient; for Mixtral
// (every MLP a mixture of 4 experts, top 2, trident's --num-experts) also each layer's router
// logits and the experts each token is routed to (exactly).
//
// Variants gpt2_docs and llama_docs: samples holding several documents (end-of-document tokens
// inside), trained with --reset-position-ids and --reset-attention-mask; transformers is given
// Megatron's position ids and block-diagonal causal mask, computed by the Python side itself.
//
// Tolerance: for each tensor, max |trident - transformers| / max |transformers| <= 1e-5 (the
// measured errors are printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "support/tensor_file.h"
#include "trident/model/gpt.h"
#include "trident/model/param_table.h"

namespace trident {
namespace {

using testing::NamedTensor;

std::string g_inputs, g_reference, g_variant = "gpt2";
constexpr std::int64_t kBatch = 3;

// "gpt2_docs" -> "gpt2": the architecture of a documents variant.
std::string base_variant() {
  const auto at = g_variant.find("_docs");
  return at == std::string::npos ? g_variant : g_variant.substr(0, at);
}
bool documents() { return g_variant != base_variant(); }

model::ModelConfig make_config() {
  model::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 80;
  c.seq_length = 12;
  c.max_position_embeddings = 16;
  c.vocab_size = 250;  // padded to 256
  c.make_vocab_size_divisible_by = 128;
  c.init_method_std = 0.2f;  // large enough that every layer matters for the output
  c.layernorm_epsilon = 1e-5f;
  if (documents()) {
    c.reset_position_ids = true;
    c.reset_attention_mask = true;
    c.eod_token = static_cast<std::int32_t>(c.vocab_size - 1);
  }
  if (base_variant() == "bloom") {
    c.position_embedding = model::PositionEmbedding::kAlibi;
    c.embed_layernorm = true;
    c.num_attention_heads = 6;  // not a power of two: the slope extension
    c.hidden_size = 36;
    c.ffn_hidden_size = 4 * 36;  // transformers' BLOOM has no other MLP size
  } else if (base_variant() == "llama") {
    c.normalization = model::Normalization::kRmsNorm;
    c.position_embedding = model::PositionEmbedding::kRope;
    c.swiglu = true;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
    c.num_attention_heads = 8;  // head_dim 4, in 2 query groups
    c.num_query_groups = 2;
    c.rotary_base = 500.0f;
    c.rope_scaling = true;  // Llama 3: low frequencies scaled, the middle band smoothed
    c.rope_scaling_factor = 4.0f;
    c.rope_original_max_positions = 8;
    c.layernorm_epsilon = 1e-6f;
  } else if (base_variant() == "mixtral") {
    // Llama's attention (grouped-query, rope without scaling: transformers' Mixtral has none) with
    // a mixture of experts in every layer: softmax router, top-2 renormalised, dropless. No
    // auxiliary losses: transformers' load-balancing loss is not Megatron-Core's (its reference
    // sets router_aux_loss_coef 0; moe_golden_test compares the per-layer losses).
    c.normalization = model::Normalization::kRmsNorm;
    c.position_embedding = model::PositionEmbedding::kRope;
    c.swiglu = true;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
    c.num_attention_heads = 8;
    c.num_query_groups = 2;
    c.rotary_base = 500.0f;
    c.layernorm_epsilon = 1e-5f;
    c.num_layers = 3;
    c.num_experts = 4;
    c.moe_router_topk = 2;
    c.ffn_hidden_size = c.moe_ffn_hidden_size = 24;
  }
  return c;
}

int dump(const std::string& path) {
  const model::ModelConfig c = make_config();
  const model::ParamTable table = model::build_gpt_param_table(c);
  std::vector<float> flat(static_cast<std::size_t>(table.total_numel));
  model::init_params(c, table, 4242, flat.data());
  std::vector<NamedTensor> out;
  out.push_back(testing::make_i64_tensor(
      "config", {16},
      {c.vocab_size, c.padded_vocab_size(), c.hidden_size, c.num_layers, c.num_attention_heads,
       c.ffn(), c.seq_length, c.max_positions(), kBatch, c.query_groups(), c.rope_scaling ? 1 : 0,
       c.rope_original_max_positions, documents() ? c.eod_token : -1, c.num_experts,
       c.moe_router_topk, c.moe_ffn()}));
  out.push_back(testing::make_f64_tensor("hyper", {5},
                                         {c.layernorm_epsilon, c.rotary_base, c.rope_scaling_factor,
                                          c.rope_low_freq_factor, c.rope_high_freq_factor}));
  std::mt19937 rng(99);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(kBatch * c.seq_length)), lab(tok.size());
  for (auto& t : tok) t = static_cast<std::int32_t>(rng() % (c.vocab_size - 1));
  if (documents()) {
    // Several documents per sample: EODs inside, adjacent, first and last (T = 12).
    for (const auto& [b, t] : {std::pair{0, 3}, std::pair{0, 7}, std::pair{1, 0}, std::pair{1, 5},
                               std::pair{1, 6}, std::pair{1, 11}, std::pair{2, 2}, std::pair{2, 9}})
      tok[static_cast<std::size_t>(b * c.seq_length + t)] = c.eod_token;
  }
  // Targets are the next tokens (transformers shifts its labels itself); the last position of
  // each row has none, one more is ignored.
  for (std::int64_t b = 0; b < kBatch; ++b) {
    for (std::int64_t t = 0; t < c.seq_length; ++t) {
      const std::size_t i = static_cast<std::size_t>(b * c.seq_length + t);
      lab[i] = t + 1 < c.seq_length ? tok[i + 1] : -1;
    }
  }
  lab[4] = -1;
  out.push_back(testing::make_i32_tensor("tokens", {kBatch, c.seq_length}, tok));
  out.push_back(testing::make_i32_tensor("labels", {kBatch, c.seq_length}, lab));
  for (const model::ParamSpec& p : table.params) {
    std::vector<float> v(flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
    out.push_back(testing::make_f32_tensor(p.name, p.shape, v));
  }
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  testing::write_tensor_file(path, out);
  return 0;
}

// max |a - b| / max |b| over n values of a read with stride (a's rows may be wider).
double rel_error(const float* a, const std::vector<double>& b, std::int64_t cols,
                 std::int64_t a_stride) {
  double max_ref = 0, max_diff = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const std::int64_t r = static_cast<std::int64_t>(i) / cols,
                       k = static_cast<std::int64_t>(i) % cols;
    max_ref = std::max(max_ref, std::abs(b[i]));
    const double d = std::abs(static_cast<double>(a[r * a_stride + k]) - b[i]);
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

void expect_close(const std::string& what, const float* a, const NamedTensor& ref,
                  std::int64_t cols = 0, std::int64_t stride = 0) {
  const std::vector<double> b = ref.to_f64();
  if (cols == 0) cols = stride = static_cast<std::int64_t>(b.size());
  const double e = rel_error(a, b, cols, stride);
  EXPECT_LE(e, 1e-5) << what << ": max |trident - transformers| / max |transformers| = " << e;
  std::printf("  %-52s rel err %.2e\n", what.c_str(), e);
}

TEST(HfGolden, MatchesTransformers) {
  std::printf("variant %s\n", g_variant.c_str());
  ASSERT_FALSE(g_inputs.empty()) << "run with --inputs IN --reference REF (see CMakeLists)";
  const auto in = testing::read_tensor_file(g_inputs);
  const auto ref = testing::read_tensor_file(g_reference);
  const model::ModelConfig c = make_config();
  const model::ParamTable table = model::build_gpt_param_table(c);
  std::vector<float> p(static_cast<std::size_t>(table.total_numel), 0.0f), g(p.size(), 0.0f);
  for (const model::ParamSpec& spec : table.params) {
    const std::vector<float> w = testing::find_tensor(in, spec.name).f32();
    ASSERT_EQ(static_cast<std::int64_t>(w.size()), spec.numel) << spec.name;
    std::copy(w.begin(), w.end(), p.begin() + spec.offset);
  }
  const core::ExecContext ctx;
  const model::GptParams params = model::gpt_param_views(c, table, p.data());
  const model::GptGrads grads = model::gpt_grad_views(c, table, g.data());
  model::GptActivations acts;
  const model::ModelRuntime rt;
  model::make_activations(c, rt.shard, kBatch, c.seq_length, acts);
  const std::vector<std::int32_t> tokens = testing::find_tensor(in, "tokens").i32();
  const std::vector<std::int32_t> labels = testing::find_tensor(in, "labels").i32();
  model::gpt_forward(ctx, c, rt, params, {.tokens = tokens.data()}, acts);
  // transformers' logits cover the real vocabulary; trident's rows are padded.
  expect_close("logits", acts.logits, testing::find_tensor(ref, "logits"), c.vocab_size,
               c.padded_vocab_size());
  // Each mixture-of-experts layer's router logits (rows, E) and its chosen experts (rows, k), as
  // sets: the order of the k choices is each side's own.
  for (std::int64_t l = 0; l < c.num_layers && c.num_experts > 0; ++l) {
    const model::layers::MoeSaved& moe = acts.layers[static_cast<std::size_t>(l)].moe;
    const std::string at = std::to_string(l);
    expect_close("router_logits." + at, moe.logits,
                 testing::find_tensor(ref, "router_logits." + at));
    const std::vector<std::int64_t> theirs =
        testing::find_tensor(ref, "router_experts." + at).i64();
    const std::int64_t k = c.moe_router_topk, rows = kBatch * c.seq_length;
    ASSERT_EQ(static_cast<std::int64_t>(theirs.size()), rows * k);
    std::int64_t differ = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      std::vector<std::int64_t> a(moe.experts + r * k, moe.experts + (r + 1) * k);
      std::vector<std::int64_t> b(theirs.begin() + r * k, theirs.begin() + (r + 1) * k);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      differ += a != b;
    }
    EXPECT_EQ(differ, 0) << "layer " << l << ": tokens routed to other experts than transformers'";
    std::printf("  %-52s %lld of %lld tokens differ\n", ("router_experts." + at).c_str(),
                static_cast<long long>(differ), static_cast<long long>(rows));
  }
  const model::LossSum loss =
      model::gpt_loss(ctx, c, rt, labels.data(), 1.0f, model::LossGrad::kCompute, acts);
  ASSERT_GT(loss.count, 0);
  const float mean_loss = static_cast<float>(loss.sum / static_cast<double>(loss.count));
  expect_close("loss", &mean_loss, testing::find_tensor(ref, "loss"));
  // gpt_loss scaled d_logits by 1; transformers' loss is the mean over counted tokens.
  for (std::int64_t i = 0; i < kBatch * c.seq_length * c.padded_vocab_size(); ++i) {
    acts.logits[i] /= static_cast<float>(loss.count);
  }
  model::gpt_backward(ctx, c, rt, params, grads, tokens.data(), acts);
  for (const model::ParamSpec& spec : table.params) {
    expect_close("grad." + spec.name, g.data() + spec.offset,
                 testing::find_tensor(ref, "grad." + spec.name));
  }
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string dump_path;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dump") dump_path = argv[i + 1];
    if (a == "--inputs") trident::g_inputs = argv[i + 1];
    if (a == "--reference") trident::g_reference = argv[i + 1];
    if (a == "--variant") trident::g_variant = argv[i + 1];
  }
  if (!dump_path.empty()) return trident::dump(dump_path);
  return RUN_ALL_TESTS();
}
