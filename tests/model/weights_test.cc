// The layers' weight declarations (model/layers/weights.h) and their two readers: the table
// (build_gpt_param_table) and the binder (gpt_param_views, gpt_grad_views, block_*_views). Every
// table row must be bound to exactly one field of the layers' Params and Grads (the tied output
// layer to the embedding's), at the row's offset, with the BF16 copy at the same offset of its
// buffer, for every model family and every kind of shard.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "trident/core/error.h"
#include "trident/model/gpt_weights.h"

namespace trident::model {
namespace {

ModelConfig family(const std::string& name) {
  ModelConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.vocab_size = 100;
  if (name == "bloom") {
    c.position_embedding = PositionEmbedding::kAlibi;
    c.embed_layernorm = true;
  } else if (name == "llama") {
    c.position_embedding = PositionEmbedding::kRope;
    c.normalization = Normalization::kRmsNorm;
    c.swiglu = true;
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
    c.num_query_groups = 1;  // fewer groups than tp ranks: the replicated split
    c.ffn_hidden_size = 48;
  }
  return c;
}

// Every view of a GptParams, written by hand here (not from the declarations), with a label.
struct Bound {
  std::string what;
  const float* f32;
  const core::bf16* bf16;  // for the matmul weights (layers::Weight)
  bool matmul;
};
void add(std::vector<Bound>& out, const std::string& what, const layers::Weight& w) {
  out.push_back({what, w.f32, w.bf16, true});
}
void add(std::vector<Bound>& out, const std::string& what, const float* p) {
  out.push_back({what, p, nullptr, false});
}
void add_norm(std::vector<Bound>& out, const std::string& what, const layers::NormParams& n) {
  add(out, what + ".weight", n.weight);
  add(out, what + ".bias", n.bias);
}
std::vector<Bound> block_views(const layers::BlockParams& b, const std::string& at) {
  std::vector<Bound> out;
  add_norm(out, at + "norm1", b.norm1);
  add(out, at + "qkv_w", b.attention.qkv_w);
  add(out, at + "qkv_b", b.attention.qkv_b);
  add(out, at + "proj_w", b.attention.proj_w);
  add(out, at + "proj_b", b.attention.proj_b);
  add_norm(out, at + "norm2", b.norm2);
  add(out, at + "fc_w", b.mlp.fc_w);
  add(out, at + "fc_b", b.mlp.fc_b);
  add(out, at + "fc2_w", b.mlp.fc2_w);
  add(out, at + "fc2_b", b.mlp.fc2_b);
  return out;
}
std::vector<Bound> all_views(const GptParams& p) {
  std::vector<Bound> out;
  add(out, "wte", p.embedding.wte);
  add(out, "wpe", p.embedding.wpe);
  add_norm(out, "emb_norm", p.embedding.norm);
  for (std::size_t l = 0; l < p.layers.size(); ++l) {
    const std::vector<Bound> b = block_views(p.layers[l], "layer" + std::to_string(l) + ".");
    out.insert(out.end(), b.begin(), b.end());
  }
  add_norm(out, "head_norm", p.head.norm);
  add(out, "out_w", p.head.out_w);
  return out;
}
std::vector<float*> all_grads(const GptGrads& g) {
  std::vector<float*> out{g.embedding.wte, g.embedding.wpe, g.embedding.norm.weight,
                          g.embedding.norm.bias};
  for (const layers::BlockGrads& b : g.layers) {
    for (float* p : {b.norm1.weight, b.norm1.bias, b.attention.qkv_w, b.attention.qkv_b,
                     b.attention.proj_w, b.attention.proj_b, b.norm2.weight, b.norm2.bias,
                     b.mlp.fc_w, b.mlp.fc_b, b.mlp.fc2_w, b.mlp.fc2_b})
      out.push_back(p);
  }
  out.push_back(g.head.norm.weight);
  out.push_back(g.head.norm.bias);
  out.push_back(g.head.out_w);
  return out;
}

std::vector<ModelShard> shards(int tp, bool sp) {
  std::vector<ModelShard> out;
  for (const auto& [emb, head, first, n] :
       {std::tuple{true, true, 0, -1}, std::tuple{true, false, 0, 2}, std::tuple{false, true, 2, 2},
        std::tuple{false, false, 1, 2}}) {
    out.push_back({.tp_size = tp,
                   .tp_rank = tp - 1,
                   .first_layer = first,
                   .num_layers = n,
                   .has_embedding = emb,
                   .has_head = head,
                   .sequence_parallel = sp});
  }
  return out;
}

TEST(Weights, EveryTableRowIsBoundOnceAtItsOffset) {
  for (const std::string name : {"gpt", "bloom", "llama"}) {
    const ModelConfig cfg = family(name);
    for (const int tp : {1, 2, 4}) {
      for (const ModelShard& shard : shards(tp, tp > 1)) {
        SCOPED_TRACE(::testing::Message() << name << " tp " << tp << " layers " << shard.first_layer
                                          << "+" << shard.num_layers << " emb "
                                          << shard.has_embedding << " head " << shard.has_head);
        const ParamTable t = build_gpt_param_table(cfg, shard);
        std::vector<float> flat(static_cast<std::size_t>(t.total_numel));
        std::vector<core::bf16> flat16(flat.size());
        std::vector<float> grads(flat.size());
        const GptParams p = gpt_param_views(cfg, t, flat.data(), flat16.data());
        const GptGrads g = gpt_grad_views(cfg, t, grads.data());
        ASSERT_EQ(std::ssize(p.layers), shard.layers(cfg));

        std::map<std::int64_t, int> bound;  // offset -> views bound there
        for (const Bound& b : all_views(p)) {
          if (b.f32 == nullptr) {
            EXPECT_EQ(b.bf16, nullptr) << b.what;
            continue;
          }
          const std::int64_t o = b.f32 - flat.data();
          ++bound[o];
          // The BF16 copy: the same declaration bound to the other buffer, matmul weights only.
          if (b.matmul) {
            EXPECT_EQ(b.bf16 - flat16.data(), o) << b.what;
          }
        }
        std::map<std::int64_t, int> bound_grads;
        for (float* gp : all_grads(g))
          if (gp != nullptr) ++bound_grads[gp - grads.data()];

        const bool tied_here = cfg.tied_output() && shard.has_embedding && shard.has_head;
        ASSERT_EQ(bound.size(), t.params.size());
        for (const ParamSpec& s : t.params) {
          const int expect =
              tied_here && s.name == "embedding.word_embeddings.weight" ? 2 : 1;  // + out_w
          EXPECT_EQ(bound[s.offset], expect) << s.name;
          EXPECT_EQ(bound_grads[s.offset], expect) << s.name;
          // The flags the optimizer reads, against the names (an independent rule).
          EXPECT_EQ(s.sequence_parallel, shard.sequence_parallel && tp > 1 &&
                                             s.name.find("layernorm") != std::string::npos)
              << s.name;
          EXPECT_EQ(s.tied_embedding,
                    cfg.tied_output() && s.name == "embedding.word_embeddings.weight")
              << s.name;
          EXPECT_EQ(s.shared, s.tied_embedding && !shard.has_embedding) << s.name;
        }
        if (shard.has_head) {
          EXPECT_NE(p.head.out_w.f32, nullptr);
          EXPECT_NE(g.head.out_w, nullptr);
        }
        if (tied_here) {
          EXPECT_EQ(p.head.out_w.f32, p.embedding.wte.f32);
          EXPECT_EQ(p.head.out_w.bf16, p.embedding.wte.bf16);
          EXPECT_EQ(g.head.out_w, g.embedding.wte);
        }
      }
    }
  }
}

TEST(Weights, OneLayersViewsEqualThatLayerOfTheWholeShard) {
  for (const std::string name : {"gpt", "bloom", "llama"}) {
    const ModelConfig cfg = family(name);
    const ModelShard shard{.tp_size = 2,
                           .tp_rank = 1,
                           .first_layer = 1,
                           .num_layers = 3,
                           .has_embedding = false,
                           .has_head = true};
    const ParamTable t = build_gpt_param_table(cfg, shard);
    std::vector<float> flat(static_cast<std::size_t>(t.total_numel));
    std::vector<core::bf16> flat16(flat.size());
    const GptParams whole = gpt_param_views(cfg, t, flat.data(), flat16.data());
    const GptGrads whole_g = gpt_grad_views(cfg, t, flat.data());
    // Storage that is not one buffer: a shifted locate, as ZeRO-3's slots are.
    const auto locate = [&](std::int64_t o) -> const float* { return flat.data() + o; };
    const auto locate16 = [&](std::int64_t o) -> const core::bf16* { return flat16.data() + o; };
    for (std::int64_t l = 0; l < 3; ++l) {
      const std::vector<Bound> a = block_views(block_param_views(cfg, t, l, locate, locate16), "");
      const std::vector<Bound> b = block_views(whole.layers[static_cast<std::size_t>(l)], "");
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].f32, b[i].f32) << name << " layer " << l << " " << a[i].what;
        EXPECT_EQ(a[i].bf16, b[i].bf16) << name << " layer " << l << " " << a[i].what;
      }
      const layers::BlockGrads g =
          block_grad_views(cfg, t, l, [&](std::int64_t o) { return flat.data() + o; });
      const layers::BlockGrads& w = whole_g.layers[static_cast<std::size_t>(l)];
      EXPECT_EQ(g.attention.qkv_w, w.attention.qkv_w);
      EXPECT_EQ(g.mlp.fc2_w, w.mlp.fc2_w);
      EXPECT_EQ(g.norm2.weight, w.norm2.weight);
    }
  }
}

TEST(Weights, ATableOfAnotherModelIsRefused) {
  const ModelConfig gpt = family("gpt"), llama = family("llama");
  const ParamTable t = build_gpt_param_table(gpt);
  std::vector<float> flat(static_cast<std::size_t>(t.total_numel));
  try {
    (void)gpt_param_views(llama, t, flat.data());
    FAIL() << "bound a GPT table with Llama's declarations";
  } catch (const core::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("does not follow the layers' declarations"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trident::model
