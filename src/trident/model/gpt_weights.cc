#include "trident/model/gpt_weights.h"

#include <algorithm>

#include "trident/core/error.h"

namespace trident::model {

layers::MoeConfig moe_config(const ModelConfig& cfg, int ep_size) {
  const bool sigmoid = cfg.moe_router_score_function == MoeScoreFunction::kSigmoid;
  const bool balance = cfg.moe_router_load_balancing_type != MoeLoadBalancing::kNone;
  return {.hidden = cfg.hidden_size,
          .num_experts = cfg.num_experts,
          .ffn = cfg.moe_ffn(),
          .activation = cfg.swiglu ? layers::Activation::kSwiGlu : layers::Activation::kGelu,
          .router = {.topk = cfg.moe_router_topk,
                     .score = sigmoid ? kernels::MoeScore::kSigmoid : kernels::MoeScore::kSoftmax,
                     .pre_softmax = cfg.moe_router_pre_softmax,
                     .scaling = cfg.moe_router_topk_scaling_factor > 0
                                    ? static_cast<float>(cfg.moe_router_topk_scaling_factor)
                                    : 1.0f,
                     .num_groups = cfg.moe_router_num_groups,
                     .group_topk = cfg.moe_router_group_topk},
          .capacity_factor = cfg.moe_expert_capacity_factor,
          .drop_policy = cfg.moe_token_drop_policy == MoeDropPolicy::kPosition
                             ? kernels::MoeDropPolicy::kPosition
                             : kernels::MoeDropPolicy::kProbs,
          .pad_to_capacity = cfg.moe_pad_expert_input_to_capacity,
          .aux_loss_coeff = balance ? cfg.moe_aux_loss_coeff : 0.0,
          .aux_per_sequence = cfg.moe_router_load_balancing_type == MoeLoadBalancing::kSeqAuxLoss,
          .z_loss_coeff = cfg.moe_z_loss_coeff,
          .ep_size = ep_size,
          .shared_ffn = cfg.moe_shared_expert_intermediate_size,
          .shared_gate = cfg.moe_shared_expert_gate,
          .expert_bias = cfg.moe_router_enable_expert_bias};
}

GptLayers gpt_layers(const ModelConfig& cfg, const ModelShard& shard) {
  const int tp = shard.tp_size;
  const std::int64_t C = cfg.hidden_size, Vl = cfg.padded_vocab_size(tp) / tp;
  const layers::NormConfig norm{.kind = cfg.normalization == Normalization::kRmsNorm
                                            ? layers::NormKind::kRmsNorm
                                            : layers::NormKind::kLayerNorm,
                                .hidden = C,
                                .eps = static_cast<float>(cfg.layernorm_epsilon)};
  layers::OutputWeight output = layers::OutputWeight::kOwn;
  if (cfg.tied_output()) {
    output = shard.has_embedding ? layers::OutputWeight::kTied : layers::OutputWeight::kTiedCopy;
  }
  return {.embedding = {.hidden = C,
                        .vocab_local = Vl,
                        .max_positions = cfg.max_positions(),
                        .learned_positions =
                            cfg.position_embedding == PositionEmbedding::kLearnedAbsolute,
                        .norm = cfg.embed_layernorm,
                        .tied_output = cfg.tied_output(),
                        .norm_cfg = norm},
          .block = {.norm = norm,
                    .attention = {.hidden = C,
                                  .heads = cfg.num_attention_heads,
                                  .head_dim = cfg.head_dim(),
                                  .flash = cfg.flash_attention(),
                                  .query_groups = cfg.query_groups(),
                                  .bias = cfg.add_bias_linear,
                                  .qkv_bias = cfg.qkv_bias()},
                    .mlp = {.activation = cfg.swiglu ? layers::Activation::kSwiGlu
                                                     : layers::Activation::kGelu,
                            .hidden = C,
                            .ffn = cfg.ffn(),
                            .bias = cfg.add_bias_linear},
                    .moe = moe_config(cfg, shard.ep_size),
                    .moe_layer_freq = cfg.moe_layer_freq,
                    .moe_layer_pattern = cfg.moe_layer_pattern},
          .head = {.hidden = C,
                   .vocab = cfg.vocab_size,
                   .vocab_local = Vl,
                   .norm = norm,
                   .chunk_rows = cfg.loss_chunk_rows,
                   .output = output}};
}

namespace {

layers::WeightScope block_scope(const layers::WeightScope& top, std::int64_t global_layer) {
  return top.sub(core::str("layers.", global_layer, ".")).in_layer(global_layer);
}

// Binds the declared slots to the table's rows, in order: the declarations and the table agree
// by construction (build_gpt_param_table walks the same declarations); a name that differs is a
// table built for another model or shard.
class Binder final : public layers::WeightVisitor {
 public:
  Binder(const ParamTable& table, std::size_t first, Locate<const float> f32,
         Locate<const core::bf16> bf16, Locate<float> grad)
      : table_(table),
        next_(first),
        f32_(std::move(f32)),
        bf16_(std::move(bf16)),
        grad_(std::move(grad)) {}

  void weight(const layers::WeightDecl& decl, const layers::WeightSlot& slot) override {
    if (!table_.holds(decl.expert)) return;  // a part without it: the view stays null
    TRIDENT_ASSERT(next_ < table_.params.size() && table_.params[next_].name == decl.name,
                   "the parameter table does not follow the layers' declarations at ", decl.name);
    const std::int64_t offset = table_.params[next_++].offset;
    if (slot.f32 != nullptr && f32_) *slot.f32 = f32_(offset);
    if (slot.bf16 != nullptr && bf16_) *slot.bf16 = bf16_(offset);
    if (slot.grad != nullptr && grad_) *slot.grad = grad_(offset);
  }
  void expect_end() const {
    TRIDENT_ASSERT(next_ == table_.params.size(), "the parameter table has ",
                   table_.params.size() - next_, " rows the layers do not declare");
  }

 private:
  const ParamTable& table_;
  std::size_t next_;
  Locate<const float> f32_;
  Locate<const core::bf16> bf16_;
  Locate<float> grad_;
};

std::size_t first_row_of_layer(const ParamTable& table, std::int64_t global_layer) {
  const auto it = std::find_if(table.params.begin(), table.params.end(),
                               [&](const ParamSpec& p) { return p.layer == global_layer; });
  TRIDENT_ASSERT(it != table.params.end(), "the parameter table has no layer ", global_layer);
  return static_cast<std::size_t>(it - table.params.begin());
}

template <class T>
Locate<T> at(T* flat) {
  if (flat == nullptr) return {};
  return [flat](std::int64_t offset) { return flat + offset; };
}

std::size_t layer_count(const ModelConfig& cfg, const ParamTable& table) {
  return static_cast<std::size_t>(table.shard.layers(cfg));
}

}  // namespace

void declare_gpt(const ModelConfig& cfg, const ModelShard& shard, layers::WeightVisitor& visitor,
                 GptParams* p, GptGrads* g) {
  const GptLayers arch = gpt_layers(cfg, shard);
  const layers::WeightScope top(visitor, shard.tp_size);
  if (shard.has_embedding) {
    layers::declare_embedding(arch.embedding, top.sub("embedding."),
                              layers::field(p, &GptParams::embedding),
                              layers::field(g, &GptGrads::embedding));
  }
  const std::int64_t L = shard.layers(cfg);
  for (std::int64_t l = 0; l < L; ++l) {
    const auto i = static_cast<std::size_t>(l);
    layers::declare_block(arch.block, block_scope(top, shard.first_layer + l),
                          p != nullptr ? &p->layers.at(i) : nullptr,
                          g != nullptr ? &g->layers.at(i) : nullptr);
  }
  if (shard.has_head) {
    layers::declare_lm_head(arch.head, top, layers::field(p, &GptParams::head),
                            layers::field(g, &GptGrads::head));
    if (arch.head.output == layers::OutputWeight::kTied) {  // the embedding declared above
      if (p != nullptr) p->head.out_w = p->embedding.wte;
      if (g != nullptr) g->head.out_w = g->embedding.wte;
    }
  }
}

GptParams gpt_param_views(const ModelConfig& cfg, const ParamTable& table, const float* flat,
                          const core::bf16* flat_bf16) {
  return gpt_param_views(cfg, table, at(flat), at(flat_bf16));
}

GptGrads gpt_grad_views(const ModelConfig& cfg, const ParamTable& table, float* flat) {
  return gpt_grad_views(cfg, table, at(flat));
}

GptParams gpt_param_views(const ModelConfig& cfg, const ParamTable& table,
                          const Locate<const float>& locate,
                          const Locate<const core::bf16>& locate_bf16) {
  GptParams p;
  p.layers.resize(layer_count(cfg, table));
  Binder b(table, 0, locate, locate_bf16, {});
  declare_gpt(cfg, table.shard, b, &p, nullptr);
  b.expect_end();
  return p;
}

GptGrads gpt_grad_views(const ModelConfig& cfg, const ParamTable& table,
                        const Locate<float>& locate) {
  GptGrads g;
  g.layers.resize(layer_count(cfg, table));
  Binder b(table, 0, {}, {}, locate);
  declare_gpt(cfg, table.shard, b, nullptr, &g);
  b.expect_end();
  return g;
}

layers::BlockParams block_param_views(const ModelConfig& cfg, const ParamTable& table,
                                      std::int64_t layer, const Locate<const float>& locate,
                                      const Locate<const core::bf16>& locate_bf16) {
  const std::int64_t global = table.shard.first_layer + layer;
  Binder b(table, first_row_of_layer(table, global), locate, locate_bf16, {});
  layers::BlockParams p;
  layers::declare_block(gpt_layers(cfg, table.shard).block,
                        block_scope(layers::WeightScope(b, table.shard.tp_size), global), &p,
                        nullptr);
  return p;
}

layers::BlockGrads block_grad_views(const ModelConfig& cfg, const ParamTable& table,
                                    std::int64_t layer, const Locate<float>& locate) {
  const std::int64_t global = table.shard.first_layer + layer;
  Binder b(table, first_row_of_layer(table, global), {}, {}, locate);
  layers::BlockGrads g;
  layers::declare_block(gpt_layers(cfg, table.shard).block,
                        block_scope(layers::WeightScope(b, table.shard.tp_size), global), nullptr,
                        &g);
  return g;
}

}  // namespace trident::model
