#include "trident/ckpt/hf_model.h"

#include <algorithm>
#include <limits>

#include "trident/ckpt/model_config_json.h"
#include "trident/core/error.h"
#include "trident/model/param_table.h"

namespace trident::ckpt {

using core::InvalidArgument;
using core::str;
using nlohmann::json;

const char* hf_arch_name(HfArch a) {
  switch (a) {
    case HfArch::kGpt2:
      return "gpt2";
    case HfArch::kBloom:
      return "bloom";
    case HfArch::kLlama:
      return "llama";
    case HfArch::kMixtral:
      return "mixtral";
    case HfArch::kQwen2Moe:
      return "qwen2_moe";
    case HfArch::kQwen2:
      return "qwen2";
  }
  return "?";
}

std::int64_t HfTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

namespace {

template <class T>
T get_or(const json& c, const char* key, T fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  try {
    return c[key].get<T>();
  } catch (const json::exception& e) {
    throw InvalidArgument(
        str("config.json: \"", key, "\" = ", c[key].dump().substr(0, 40), ": ", e.what()));
  }
}

void refuse_if(bool bad, const std::string& what) {
  if (bad) throw InvalidArgument(str("config.json: ", what));
}

// A size or count: an integer in 0 .. 2^31-1 (a float such as 1e300 would overflow the
// conversion; no real model has a dimension beyond that).
std::int64_t int_of(const json& v, const std::string& key) {
  const bool ok = v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
                  v.get<std::int64_t>() <= std::numeric_limits<std::int32_t>::max();
  refuse_if(!ok, str(key, " = ", v.dump(), " must be a non-negative integer below 2^31"));
  return v.get<std::int64_t>();
}

StDType dtype_of(const json& c) {
  const std::string t = get_or<std::string>(c, "torch_dtype", "float32");
  if (t == "bfloat16") return StDType::kBF16;
  if (t == "float16") return StDType::kF16;
  refuse_if(t != "float32",
            str("torch_dtype ", t, " is not supported (float32, bfloat16, float16)"));
  return StDType::kF32;
}

const char* dtype_torch_name(StDType t) {
  return t == StDType::kBF16 ? "bfloat16" : t == StDType::kF16 ? "float16" : "float32";
}

// What Llama and Mixtral share: RMSNorm, rotary positions, grouped-query attention, SwiGLU, no
// biases, untied output by default; their refusals.
void llama_like_to_model(const json& c, model::ModelConfig& m) {
  m.normalization = model::Normalization::kRmsNorm;
  m.position_embedding = model::PositionEmbedding::kRope;
  m.swiglu = true;
  m.add_bias_linear = false;
  m.untie_embeddings_and_output_weights = !get_or<bool>(c, "tie_word_embeddings", false);
  if (m.num_query_groups == m.num_attention_heads) m.num_query_groups = 0;  // multi-head
  refuse_if(get_or<std::string>(c, "hidden_act", "silu") != "silu",
            "hidden_act other than silu is not supported");
  refuse_if(get_or<bool>(c, "attention_bias", false),
            "attention_bias true is not supported (trident's Llama has no biases)");
  refuse_if(get_or<bool>(c, "mlp_bias", false),
            "mlp_bias true is not supported (trident's Llama has no biases)");
  refuse_if(c.contains("head_dim") && !c["head_dim"].is_null() && m.num_attention_heads > 0 &&
                int_of(c["head_dim"], "head_dim") != m.hidden_size / m.num_attention_heads,
            "head_dim other than hidden_size / num_attention_heads is not supported");
}

// What Qwen2 and Qwen2-MoE share: Llama's layer with biases on q, k and v alone
// (--add-qkv-bias with --disable-bias-linear; null key/value heads: one per query head), without
// sliding windows or rope scaling.
void qwen2_like_to_model(const json& c, HfArch arch, model::ModelConfig& m) {
  hf_keys_to_model(c, arch, m);
  if (c.contains("num_key_value_heads") && c["num_key_value_heads"].is_null()) {
    m.num_query_groups = m.num_attention_heads;
  }
  llama_like_to_model(c, m);
  m.add_qkv_bias = true;
  refuse_if(get_or<bool>(c, "use_sliding_window", false),
            "use_sliding_window true is not supported (trident's attention is causal over the "
            "whole sequence)");
  refuse_if(c.contains("rope_scaling") && !c["rope_scaling"].is_null(),
            str("rope_scaling is not supported for ", hf_arch_name(arch), " (only null converts)"));
}

// What Qwen2-MoE's config.json may say that trident's model cannot run.
void refuse_qwen2_moe(const json& c, const model::ModelConfig& m) {
  refuse_if(m.num_experts == 0,
            "num_experts 0 is not supported (a Qwen2-MoE has experts; a dense one is "
            "model_type qwen2)");
  refuse_if(m.num_experts > 65536, str("num_experts ", m.num_experts,
                                       ": more than trident reads from a file (65536); the file "
                                       "is corrupt"));
  refuse_if(m.moe_shared_expert_intermediate_size == 0,
            "shared_expert_intermediate_size 0 is not supported (trident's shared expert and its "
            "gate need a size)");
  // decoder_sparse_step and mlp_only_layers are read by qwen2_moe_layers.
  refuse_if(get_or<double>(c, "router_jitter_noise", 0.0) != 0.0,
            "router_jitter_noise other than 0 is not supported");
}

// transformers' Qwen2MoeDecoderLayer: layer i's MLP is sparse iff i is not in mlp_only_layers and
// (i + 1) % decoder_sparse_step == 0 (num_experts > 0 is refused before); the other layers have
// the dense MLP of intermediate_size. Sets trident's --moe-layer-freq: 1 when every layer is
// sparse, otherwise the per-layer pattern.
void qwen2_moe_layers(const json& c, model::ModelConfig& m) {
  const json step_json = c.contains("decoder_sparse_step") ? c["decoder_sparse_step"] : json(1);
  const std::int64_t step = step_json.is_null() ? 1 : int_of(step_json, "decoder_sparse_step");
  refuse_if(step < 1, str("decoder_sparse_step = ", step,
                          " is not supported (a layer is sparse when (i + 1) % "
                          "decoder_sparse_step == 0: it must be >= 1)"));
  std::vector<bool> pattern(static_cast<std::size_t>(m.num_layers));
  for (std::int64_t i = 0; i < m.num_layers; ++i) {
    pattern[static_cast<std::size_t>(i)] = (i + 1) % step == 0;
  }
  if (c.contains("mlp_only_layers") && !c["mlp_only_layers"].is_null()) {
    const json& dense = c["mlp_only_layers"];
    refuse_if(!dense.is_array(), str("mlp_only_layers = ", dense.dump().substr(0, 40),
                                     " must be a list of layer indices"));
    for (const json& i : dense) {
      const std::int64_t l = int_of(i, "mlp_only_layers[]");
      refuse_if(l >= m.num_layers,
                str("mlp_only_layers = ", dense.dump().substr(0, 40), ": layer ", l,
                    " is not one of the num_hidden_layers = ", m.num_layers, " layers"));
      pattern[static_cast<std::size_t>(l)] = false;
    }
  }
  refuse_if(std::none_of(pattern.begin(), pattern.end(), [](bool b) { return b; }),
            str("decoder_sparse_step = ", step, " and mlp_only_layers leave no sparse layer in ",
                m.num_layers,
                " layers (a dense Qwen2-MoE is not converted: use model_type "
                "qwen2)"));
  m.moe_layer_freq = 1;
  m.moe_layer_pattern.clear();
  if (std::find(pattern.begin(), pattern.end(), false) != pattern.end()) {
    m.moe_layer_pattern = std::move(pattern);
  }
}

// The other way: decoder_sparse_step and mlp_only_layers that make exactly trident's expert
// layers sparse. A step alone when one does (the smallest), else step 1 and the dense layers.
void qwen2_moe_layers_to_hf(const model::ModelConfig& m, json& c) {
  for (std::int64_t step = 1; step <= m.num_layers; ++step) {
    bool same = true;
    for (std::int64_t i = 0; i < m.num_layers && same; ++i) {
      same = m.moe_layer(i) == ((i + 1) % step == 0);
    }
    if (same) {
      c["decoder_sparse_step"] = step;
      c["mlp_only_layers"] = json::array();
      return;
    }
  }
  json dense = json::array();
  for (std::int64_t i = 0; i < m.num_layers; ++i) {
    if (!m.moe_layer(i)) dense.push_back(i);
  }
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = dense;
}

}  // namespace

HfImport hf_config_to_trident(const json& c, std::int64_t seq_length) {
  HfImport r;
  model::ModelConfig& m = r.model;
  m.make_vocab_size_divisible_by = 128;
  refuse_if(!c.is_object(), "the file is not a JSON object");
  std::string type;
  try {
    type = get_or<std::string>(c, "model_type", "");
    r.dtype = dtype_of(c);
    // The sizes and the other keys the model config's list maps (model_config_json.cc), then
    // what each architecture fixes and refuses.
    if (type == "gpt2") {
      r.arch = HfArch::kGpt2;
      hf_keys_to_model(c, r.arch, m);
      const std::string act = get_or<std::string>(c, "activation_function", "gelu_new");
      refuse_if(act != "gelu_new" && act != "gelu_pytorch_tanh",
                str("activation_function ", act,
                    " is not supported (trident's GPT-2 MLP is the tanh GeLU: gelu_new)"));
      refuse_if(!get_or<bool>(c, "scale_attn_weights", true),
                "scale_attn_weights false is not supported");
      refuse_if(get_or<bool>(c, "scale_attn_by_inverse_layer_idx", false),
                "scale_attn_by_inverse_layer_idx is not supported");
      refuse_if(get_or<bool>(c, "add_cross_attention", false),
                "add_cross_attention is not supported (decoder-only models)");
      refuse_if(!get_or<bool>(c, "tie_word_embeddings", true),
                "GPT-2 with tie_word_embeddings false is not supported");
    } else if (type == "bloom") {
      r.arch = HfArch::kBloom;
      json keys = c;  // older BLOOM files spell hidden_size n_embed
      if (!c.contains("hidden_size") && c.contains("n_embed")) keys["hidden_size"] = c["n_embed"];
      hf_keys_to_model(keys, r.arch, m);
      m.position_embedding = model::PositionEmbedding::kAlibi;
      m.embed_layernorm = true;
      refuse_if(get_or<bool>(c, "apply_residual_connection_post_layernorm", false),
                "apply_residual_connection_post_layernorm true is not supported");
      m.max_position_embeddings = seq_length > 0 ? seq_length : 2048;
    } else if (type == "llama") {
      r.arch = HfArch::kLlama;
      hf_keys_to_model(c, r.arch, m);
      llama_like_to_model(c, m);
      if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
        const json& s = c["rope_scaling"];
        const std::string rt =
            get_or<std::string>(s, "rope_type", get_or<std::string>(s, "type", ""));
        refuse_if(rt != "llama3", str("rope_scaling type '", rt,
                                      "' is not supported (only llama3; linear, dynamic, yarn, "
                                      "longrope are not)"));
        m.rope_scaling = true;
        m.rope_scaling_factor = s.at("factor");
        m.rope_low_freq_factor = s.at("low_freq_factor");
        m.rope_high_freq_factor = s.at("high_freq_factor");
        m.rope_original_max_positions = int_of(s.at("original_max_position_embeddings"),
                                               "rope_scaling.original_max_position_embeddings");
      }
    } else if (type == "mixtral") {
      // A Llama whose every MLP is a sparse mixture of experts (modeling_mixtral.py): the router
      // softmax over all experts, the top k renormalised (Megatron-Core's default softmax
      // router), no capacity (dropless).
      r.arch = HfArch::kMixtral;
      hf_keys_to_model(c, r.arch, m);
      // null: one key/value head per query head (MixtralConfig); absent: its default, 8.
      if (c.contains("num_key_value_heads") && c["num_key_value_heads"].is_null()) {
        m.num_query_groups = m.num_attention_heads;
      }
      llama_like_to_model(c, m);
      m.ffn_hidden_size = m.moe_ffn_hidden_size;
      m.moe_layer_freq = 1;
      m.moe_router_score_function = model::MoeScoreFunction::kSoftmax;
      m.moe_router_pre_softmax = false;
      m.moe_expert_capacity_factor = 0.0;
      m.moe_router_load_balancing_type = model::MoeLoadBalancing::kAuxLoss;
      refuse_if(m.num_experts == 0, "num_local_experts 0 is not supported (a Mixtral has experts)");
      // A bound before E x 3 tensors per layer are listed (a corrupt file, as check_model_size's).
      refuse_if(m.num_experts > 65536,
                str("num_local_experts ", m.num_experts,
                    ": more than trident reads from a file (65536); the file is corrupt"));
      refuse_if(c.contains("sliding_window") && !c["sliding_window"].is_null(),
                str("sliding_window = ", c["sliding_window"].dump(),
                    " is not supported (trident's attention is causal over the whole sequence; "
                    "only sliding_window null converts)"));
      refuse_if(c.contains("rope_scaling") && !c["rope_scaling"].is_null(),
                "rope_scaling is not supported for mixtral (transformers' Mixtral has none)");
      refuse_if(get_or<double>(c, "router_jitter_noise", 0.0) != 0.0,
                "router_jitter_noise other than 0 is not supported (trident's router has no "
                "input jitter)");
    } else if (type == "qwen2_moe") {
      // modeling_qwen2_moe.py: Llama's layer with biases on q, k and v alone (--add-qkv-bias),
      // and in every layer a mixture of experts (the softmax over all experts, the top k
      // renormalised only with norm_topk_prob) beside a shared expert weighed by
      // sigmoid(shared_expert_gate . x) (--moe-shared-expert-gate).
      r.arch = HfArch::kQwen2Moe;
      qwen2_like_to_model(c, r.arch, m);
      refuse_if(!get_or<bool>(c, "qkv_bias", true),
                "qkv_bias false is not supported (transformers' Qwen2-MoE has biases on q, k, v)");
      refuse_qwen2_moe(c, m);
      qwen2_moe_layers(c, m);
      m.moe_router_score_function = model::MoeScoreFunction::kSoftmax;
      // norm_topk_prob false: the top k of the softmax over all experts, not renormalised
      // (Megatron's --moe-router-pre-softmax); true: renormalised, the default router's.
      m.moe_router_pre_softmax = !get_or<bool>(c, "norm_topk_prob", false);
      m.moe_expert_capacity_factor = 0.0;
      m.moe_router_load_balancing_type = model::MoeLoadBalancing::kAuxLoss;
      m.moe_shared_expert_gate = true;
    } else if (type == "qwen2") {
      // modeling_qwen2.py: Llama's layer with biases on q, k and v alone.
      r.arch = HfArch::kQwen2;
      qwen2_like_to_model(c, r.arch, m);
    } else {
      throw InvalidArgument(
          str("config.json: model_type '", type,
              "' is not supported (trident converts gpt2, bloom, llama, mixtral, qwen2_moe and "
              "qwen2)"));
    }
  } catch (const json::exception& e) {
    throw InvalidArgument(str("config.json: ", e.what()));
  }
  m.seq_length = seq_length > 0 ? seq_length : m.max_position_embeddings;
  refuse_if(
      r.arch != HfArch::kBloom && m.seq_length > m.max_positions(),
      str("--seq-length ", m.seq_length, " exceeds max_position_embeddings ", m.max_positions()));
  m.validate();
  check_model_size(m, "config.json");
  return r;
}

HfArch hf_arch_of(const model::ModelConfig& m) {
  using model::Normalization;
  using model::PositionEmbedding;
  const bool ln = m.normalization == Normalization::kLayerNorm;
  const bool mha = m.query_groups() == m.num_attention_heads;
  if (ln && m.position_embedding == PositionEmbedding::kLearnedAbsolute && !m.swiglu && mha &&
      m.add_bias_linear && m.tied_output() && !m.embed_layernorm) {
    return HfArch::kGpt2;
  }
  if (ln && m.position_embedding == PositionEmbedding::kAlibi && m.embed_layernorm && !m.swiglu &&
      mha && m.add_bias_linear && m.tied_output() && m.ffn() == 4 * m.hidden_size) {
    return HfArch::kBloom;
  }
  const bool llama = !ln && m.position_embedding == PositionEmbedding::kRope && m.swiglu &&
                     !m.add_bias_linear && !m.embed_layernorm;
  if (m.num_experts > 0) {
    // Mixtral: a Llama whose every MLP is a softmax-routed, renormalised top-k, dropless mixture
    // of SwiGLU experts. Qwen2-MoE (a model with shared experts): the same with biases on q, k
    // and v, a gated shared expert, and the top k renormalised or not (norm_topk_prob). Each
    // setting the architecture cannot express is named.
    const bool qwen = m.moe_shared_expert_intermediate_size > 0;
    std::string no;
    auto refuse = [&no](bool bad, const char* what) {
      if (bad) no += str(no.empty() ? "" : "; ", what);
    };
    refuse(ln || m.position_embedding != PositionEmbedding::kRope || m.embed_layernorm,
           "not a Llama's norms and positions (RMSNorm, rope, no --embed-layernorm)");
    refuse(!m.swiglu, qwen ? "GeLU experts (Qwen2-MoE's are SwiGLU: --swiglu)"
                           : "GeLU experts (Mixtral's are SwiGLU: --swiglu)");
    refuse(m.add_bias_linear, qwen ? "biases other than the QKV's (Qwen2-MoE has them on q, k "
                                     "and v alone: --disable-bias-linear --add-qkv-bias)"
                                   : "biases (Mixtral has none: --disable-bias-linear)");
    // Qwen2-MoE's dense layers (decoder_sparse_step, mlp_only_layers) say any pattern.
    bool every_layer = true;
    for (std::int64_t l = 0; l < m.num_layers; ++l) every_layer = every_layer && m.moe_layer(l);
    refuse(!qwen && !every_layer,
           "--moe-layer-freq with dense layers (every Mixtral MLP is MoE; Qwen2-MoE has dense "
           "layers, but also shared experts)");
    refuse(m.moe_router_score_function != model::MoeScoreFunction::kSoftmax,
           "--moe-router-score-function sigmoid (the router is a softmax)");
    refuse(m.moe_router_topk_scaling_factor != 0.0 && m.moe_router_topk_scaling_factor != 1.0,
           "--moe-router-topk-scaling-factor (the routing weights are not scaled)");
    refuse(m.moe_expert_capacity_factor > 0.0, "--moe-expert-capacity-factor (dropless)");
    refuse(m.moe_pad_expert_input_to_capacity, "--moe-pad-expert-input-to-capacity");
    refuse(m.moe_router_enable_expert_bias, "--moe-router-enable-expert-bias");
    if (qwen) {
      refuse(!m.moe_shared_expert_gate,
             "shared experts without --moe-shared-expert-gate (Qwen2-MoE's shared expert is "
             "gated; Mixtral has none)");
      refuse(!m.add_bias_linear && !m.add_qkv_bias,
             "no QKV bias (Qwen2-MoE's q, k and v have biases: --add-qkv-bias)");
      refuse(m.rope_scaling, "--use-rope-scaling (rope_scaling of Qwen2-MoE is not converted)");
    } else {
      refuse(m.moe_router_pre_softmax,
             "--moe-router-pre-softmax (Mixtral renormalises the top-k probabilities; Qwen2-MoE "
             "does not, but has shared experts)");
      refuse(!m.add_bias_linear && m.add_qkv_bias,
             "--add-qkv-bias (Mixtral's attention has no biases; Qwen2-MoE's has, but also "
             "shared experts)");
      refuse(m.rope_scaling, "--use-rope-scaling (transformers' Mixtral has no rope_scaling)");
    }
    if (!no.empty()) {
      throw InvalidArgument(str("this mixture-of-experts model is not transformers' ",
                                qwen ? "Qwen2-MoE" : "Mixtral", ": ", no,
                                "; it cannot be exported"));
    }
    return qwen ? HfArch::kQwen2Moe : HfArch::kMixtral;
  }
  if (llama && m.qkv_bias()) {
    // Biases on q, k and v alone: transformers' Qwen2.
    if (m.rope_scaling) {
      throw InvalidArgument(
          "this model is transformers' Qwen2 (a Llama with --add-qkv-bias) with "
          "--use-rope-scaling: rope_scaling of Qwen2 is not converted; it cannot be exported");
    }
    return HfArch::kQwen2;
  }
  if (llama) return HfArch::kLlama;
  throw InvalidArgument(
      "this model is none of transformers' GPT-2 (LayerNorm, learned positions, GeLU, biases, "
      "tied output), BLOOM (LayerNorm, ALiBi, --embed-layernorm, GeLU with ffn = 4 x hidden, "
      "biases, tied output) or Llama (RMSNorm, rope, SwiGLU, no biases): it cannot be exported");
}

json trident_to_hf_config(const model::ModelConfig& m, HfArch arch, StDType dtype) {
  json c;
  c["torch_dtype"] = dtype_torch_name(dtype);
  // The sizes and the other keys the model config's list maps (model_config_json.cc), then what
  // each architecture fixes.
  model_to_hf_keys(m, arch, c);
  switch (arch) {
    case HfArch::kGpt2:
      c["model_type"] = "gpt2";
      c["architectures"] = {"GPT2LMHeadModel"};
      c["n_ctx"] = m.max_positions();
      c["activation_function"] = "gelu_new";
      c["resid_pdrop"] = c["embd_pdrop"] = c["attn_pdrop"] = m.hidden_dropout;
      c["attn_pdrop"] = m.attention_dropout;
      c["tie_word_embeddings"] = true;
      break;
    case HfArch::kBloom:
      c["model_type"] = "bloom";
      c["architectures"] = {"BloomForCausalLM"};
      c["hidden_dropout"] = m.hidden_dropout;
      c["attention_dropout"] = m.attention_dropout;
      c["apply_residual_connection_post_layernorm"] = false;
      c["tie_word_embeddings"] = true;
      break;
    case HfArch::kLlama:
      c["model_type"] = "llama";
      c["architectures"] = {"LlamaForCausalLM"};
      c["hidden_act"] = "silu";
      c["attention_bias"] = false;
      c["mlp_bias"] = false;
      c["attention_dropout"] = m.attention_dropout;
      c["tie_word_embeddings"] = m.tied_output();
      c["rope_scaling"] = nullptr;
      if (m.rope_scaling) {
        c["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", m.rope_scaling_factor},
                             {"low_freq_factor", m.rope_low_freq_factor},
                             {"high_freq_factor", m.rope_high_freq_factor},
                             {"original_max_position_embeddings", m.rope_original_max_positions}};
      }
      break;
    case HfArch::kMixtral:
      c["model_type"] = "mixtral";
      c["architectures"] = {"MixtralForCausalLM"};
      c["hidden_act"] = "silu";
      c["attention_dropout"] = m.attention_dropout;
      c["tie_word_embeddings"] = m.tied_output();
      c["sliding_window"] = nullptr;
      c["router_jitter_noise"] = 0.0;
      c["output_router_logits"] = false;
      break;
    case HfArch::kQwen2Moe:
    case HfArch::kQwen2: {
      const bool moe = arch == HfArch::kQwen2Moe;
      c["model_type"] = moe ? "qwen2_moe" : "qwen2";
      c["architectures"] = {moe ? "Qwen2MoeForCausalLM" : "Qwen2ForCausalLM"};
      c["hidden_act"] = "silu";
      c["attention_dropout"] = m.attention_dropout;
      c["tie_word_embeddings"] = m.tied_output();
      c["rope_scaling"] = nullptr;
      c["use_sliding_window"] = false;
      c["sliding_window"] = nullptr;
      c["max_window_layers"] = m.num_layers;
      if (moe) {
        qwen2_moe_layers_to_hf(m, c);
        c["norm_topk_prob"] = !m.moe_router_pre_softmax;
        c["output_router_logits"] = false;
      }
      break;
    }
  }
  return c;
}

namespace {

// How a transformers tensor's elements sit in the trident weight it comes from.
enum class HfLayout {
  kSame,        // the same shape and order
  kTransposed,  // GPT-2's Conv1D stores (in, out): the transpose of trident's (out, in)
  kGpt2Qkv,     // c_attn's (C, 3C), columns (3, NH, HS); trident's rows (NH, 3, HS)
  kGpt2QkvBias,
  kQuery,  // Llama's q_proj / k_proj / v_proj: trident's QKV rows are (G, hpg + 2, HS), a
  kKey,    // query group's heads, then its key and its value head
  kValue,
  kQueryBias,  // Qwen2-MoE's q_proj / k_proj / v_proj biases: the same rows of the QKV bias
  kKeyBias,
  kValueBias,
  kGate,       // SwiGLU's gate_proj / up_proj: [0] and [1] of trident's (2, F, C)
  kUp,         // up-projection
  kVocabRows,  // the embedding's / output layer's real rows (trident pads the vocabulary)
  // Mixtral's experts: one transformers tensor per expert e (the "{e}" of its name) of a stacked
  // trident weight. w1 / w3: [e][0] (gate) and [e][1] (up) of experts.dense_h_to_4h (E, 2, F, C);
  // w2: [e] of experts.dense_4h_to_h (E, C, F).
  kExpertGate,
  kExpertUp,
  kExpertDown,
};

// One transformers tensor of a declared weight. Names under the layer prefixes (trident's
// "layers.<i>.", the architecture's HfNames::layer) for layer weights, whole names otherwise. A
// name with "{e}" (the kExpert* layouts) stands for one tensor per expert.
struct HfName {
  const char* trident;
  const char* hf;
  HfLayout layout = HfLayout::kSame;
};

struct HfNames {
  const char* layer;  // transformers' prefix of layer i, before i
  std::vector<HfName> global, in_layer;
};

// Each architecture's names and layouts (transformers' modeling_gpt2.py, modeling_bloom.py,
// modeling_llama.py) for the weights the layers declare (model/layers/); a declared weight
// without an entry cannot be converted.
const HfNames& hf_names(HfArch arch) {
  using L = HfLayout;
  static const HfNames gpt2{
      "transformer.h.",
      {{"embedding.word_embeddings.weight", "transformer.wte.weight", L::kVocabRows},
       {"embedding.position_embeddings.weight", "transformer.wpe.weight"},
       {"final_layernorm.weight", "transformer.ln_f.weight"},
       {"final_layernorm.bias", "transformer.ln_f.bias"}},
      {{"input_layernorm.weight", "ln_1.weight"},
       {"input_layernorm.bias", "ln_1.bias"},
       {"self_attention.query_key_value.weight", "attn.c_attn.weight", L::kGpt2Qkv},
       {"self_attention.query_key_value.bias", "attn.c_attn.bias", L::kGpt2QkvBias},
       {"self_attention.dense.weight", "attn.c_proj.weight", L::kTransposed},
       {"self_attention.dense.bias", "attn.c_proj.bias"},
       {"post_attention_layernorm.weight", "ln_2.weight"},
       {"post_attention_layernorm.bias", "ln_2.bias"},
       {"mlp.dense_h_to_4h.weight", "mlp.c_fc.weight", L::kTransposed},
       {"mlp.dense_h_to_4h.bias", "mlp.c_fc.bias"},
       {"mlp.dense_4h_to_h.weight", "mlp.c_proj.weight", L::kTransposed},
       {"mlp.dense_4h_to_h.bias", "mlp.c_proj.bias"}}};
  // BLOOM's layers use Megatron's names (its QKV rows are (NH, 3, HS) as trident's).
  static const HfNames bloom{
      "transformer.h.",
      {{"embedding.word_embeddings.weight", "transformer.word_embeddings.weight", L::kVocabRows},
       {"embedding.word_embeddings_layernorm.weight",
        "transformer.word_embeddings_layernorm.weight"},
       {"embedding.word_embeddings_layernorm.bias", "transformer.word_embeddings_layernorm.bias"},
       {"final_layernorm.weight", "transformer.ln_f.weight"},
       {"final_layernorm.bias", "transformer.ln_f.bias"}},
      {{"input_layernorm.weight", "input_layernorm.weight"},
       {"input_layernorm.bias", "input_layernorm.bias"},
       {"self_attention.query_key_value.weight", "self_attention.query_key_value.weight"},
       {"self_attention.query_key_value.bias", "self_attention.query_key_value.bias"},
       {"self_attention.dense.weight", "self_attention.dense.weight"},
       {"self_attention.dense.bias", "self_attention.dense.bias"},
       {"post_attention_layernorm.weight", "post_attention_layernorm.weight"},
       {"post_attention_layernorm.bias", "post_attention_layernorm.bias"},
       {"mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.weight"},
       {"mlp.dense_h_to_4h.bias", "mlp.dense_h_to_4h.bias"},
       {"mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.weight"},
       {"mlp.dense_4h_to_h.bias", "mlp.dense_4h_to_h.bias"}}};
  static const HfNames llama{
      "model.layers.",
      {{"embedding.word_embeddings.weight", "model.embed_tokens.weight", L::kVocabRows},
       {"final_layernorm.weight", "model.norm.weight"},
       {"output_layer.weight", "lm_head.weight", L::kVocabRows}},
      {{"input_layernorm.weight", "input_layernorm.weight"},
       {"self_attention.query_key_value.weight", "self_attn.q_proj.weight", L::kQuery},
       {"self_attention.query_key_value.weight", "self_attn.k_proj.weight", L::kKey},
       {"self_attention.query_key_value.weight", "self_attn.v_proj.weight", L::kValue},
       {"self_attention.dense.weight", "self_attn.o_proj.weight"},
       {"post_attention_layernorm.weight", "post_attention_layernorm.weight"},
       {"mlp.dense_h_to_4h.weight", "mlp.gate_proj.weight", L::kGate},
       {"mlp.dense_h_to_4h.weight", "mlp.up_proj.weight", L::kUp},
       {"mlp.dense_4h_to_h.weight", "mlp.down_proj.weight"}}};
  // Llama's attention and norms; the MLP is block_sparse_moe, trident's MoE layer (moe.h).
  static const HfNames mixtral{
      "model.layers.",
      llama.global,
      {{"input_layernorm.weight", "input_layernorm.weight"},
       {"self_attention.query_key_value.weight", "self_attn.q_proj.weight", L::kQuery},
       {"self_attention.query_key_value.weight", "self_attn.k_proj.weight", L::kKey},
       {"self_attention.query_key_value.weight", "self_attn.v_proj.weight", L::kValue},
       {"self_attention.dense.weight", "self_attn.o_proj.weight"},
       {"post_attention_layernorm.weight", "post_attention_layernorm.weight"},
       {"mlp.router.weight", "block_sparse_moe.gate.weight"},
       {"mlp.experts.dense_h_to_4h.weight", "block_sparse_moe.experts.{e}.w1.weight",
        L::kExpertGate},
       {"mlp.experts.dense_h_to_4h.weight", "block_sparse_moe.experts.{e}.w3.weight", L::kExpertUp},
       {"mlp.experts.dense_4h_to_h.weight", "block_sparse_moe.experts.{e}.w2.weight",
        L::kExpertDown}}};
  // Qwen2: Llama's layer with the q, k and v biases (after the weights).
  static const HfNames qwen2 = [] {
    HfNames n = llama;
    n.in_layer.insert(
        n.in_layer.begin() + 4,
        {{"self_attention.query_key_value.bias", "self_attn.q_proj.bias", L::kQueryBias},
         {"self_attention.query_key_value.bias", "self_attn.k_proj.bias", L::kKeyBias},
         {"self_attention.query_key_value.bias", "self_attn.v_proj.bias", L::kValueBias}});
    return n;
  }();
  // Qwen2-MoE: Qwen2's attention and norms; the MLP (mlp.) of a sparse layer holds the routed
  // experts, the shared expert (SwiGLU as a Llama MLP) and its gate, a dense layer's
  // (mlp_only_layers, decoder_sparse_step > 1) is Qwen2's, of intermediate_size
  // (--ffn-hidden-size).
  static const HfNames qwen2_moe = [] {
    HfNames n = qwen2;
    n.in_layer.insert(
        n.in_layer.end() - 3,
        {{"mlp.router.weight", "mlp.gate.weight"},
         {"mlp.experts.dense_h_to_4h.weight", "mlp.experts.{e}.gate_proj.weight", L::kExpertGate},
         {"mlp.experts.dense_h_to_4h.weight", "mlp.experts.{e}.up_proj.weight", L::kExpertUp},
         {"mlp.experts.dense_4h_to_h.weight", "mlp.experts.{e}.down_proj.weight", L::kExpertDown},
         {"mlp.shared_experts.dense_h_to_4h.weight", "mlp.shared_expert.gate_proj.weight",
          L::kGate},
         {"mlp.shared_experts.dense_h_to_4h.weight", "mlp.shared_expert.up_proj.weight", L::kUp},
         {"mlp.shared_experts.dense_4h_to_h.weight", "mlp.shared_expert.down_proj.weight"},
         {"mlp.shared_experts.gate_weight", "mlp.shared_expert_gate.weight"}});
    return n;
  }();
  switch (arch) {
    case HfArch::kGpt2:
      return gpt2;
    case HfArch::kBloom:
      return bloom;
    case HfArch::kLlama:
      return llama;
    case HfArch::kMixtral:
      return mixtral;
    case HfArch::kQwen2Moe:
      return qwen2_moe;
    case HfArch::kQwen2:
      return qwen2;
  }
  throw core::InternalError("unknown HfArch");
}

// The transformers tensor `name` of the whole declared weight of shape `g`, laid out as `layout`
// (for the kExpert* layouts: expert `expert`'s).
HfTensor hf_tensor(const model::ModelConfig& m, std::string name, const model::ParamSpec& p,
                   HfLayout layout, std::int64_t expert = 0) {
  const std::vector<std::int64_t>& g = p.global_shape;
  const std::int64_t C = m.hidden_size, NH = m.num_attention_heads, HS = m.head_dim();
  const std::int64_t G = m.query_groups(), hpg = NH / G;
  HfTensor t{std::move(name), g, p.name, [](std::int64_t i) { return i; }};
  // c_attn's column (part, head, d) is trident's row (head, part, d).
  auto gpt2_qkv_row = [C, HS](std::int64_t col) {
    return ((col % C) / HS * 3 + col / C) * HS + col % HS;
  };
  // Row `row` of Llama's projection `part` (0 queries, hpg keys, hpg + 1 values) in trident's QKV.
  auto llama_row = [=](std::int64_t part, std::int64_t row) {
    const std::int64_t head = row / HS, d = row % HS;
    const std::int64_t group = part == 0 ? head / hpg : head;
    const std::int64_t slot = part == 0 ? head % hpg : part;
    return (group * (hpg + 2) + slot) * HS + d;
  };
  switch (layout) {
    case HfLayout::kSame:
      break;
    case HfLayout::kTransposed: {
      const std::int64_t out = g[0], in = g[1];
      t.shape = {in, out};
      t.index = [in, out](std::int64_t i) { return (i % out) * in + i / out; };
      break;
    }
    case HfLayout::kGpt2Qkv:
      t.shape = {C, 3 * C};
      t.index = [=](std::int64_t i) { return gpt2_qkv_row(i % (3 * C)) * C + i / (3 * C); };
      break;
    case HfLayout::kGpt2QkvBias:
      t.index = gpt2_qkv_row;
      break;
    case HfLayout::kQuery:
    case HfLayout::kKey:
    case HfLayout::kValue: {
      const std::int64_t part = layout == HfLayout::kQuery ? 0
                                : layout == HfLayout::kKey ? hpg
                                                           : hpg + 1;
      t.shape = {(part == 0 ? NH : G) * HS, C};
      t.index = [=](std::int64_t i) { return llama_row(part, i / C) * C + i % C; };
      break;
    }
    case HfLayout::kQueryBias:
    case HfLayout::kKeyBias:
    case HfLayout::kValueBias: {
      const std::int64_t part = layout == HfLayout::kQueryBias ? 0
                                : layout == HfLayout::kKeyBias ? hpg
                                                               : hpg + 1;
      t.shape = {(part == 0 ? NH : G) * HS};
      t.index = [=](std::int64_t i) { return llama_row(part, i); };
      break;
    }
    case HfLayout::kGate:
    case HfLayout::kUp: {
      const std::int64_t start = layout == HfLayout::kGate ? 0 : g[1] * g[2];
      t.shape = {g[1], g[2]};
      t.index = [start](std::int64_t i) { return start + i; };
      break;
    }
    case HfLayout::kVocabRows:
      t.shape = {m.vocab_size, g[1]};
      break;
    case HfLayout::kExpertGate:
    case HfLayout::kExpertUp:
    case HfLayout::kExpertDown: {
      // (E, 2, F, C): expert e's gate at (e, 0), up at (e, 1); (E, C, F): expert e's at e.
      const bool down = layout == HfLayout::kExpertDown;
      const std::int64_t rows = down ? g[1] : g[2], cols = down ? g[2] : g[3];
      const std::int64_t start =
          (down ? expert : expert * 2 + (layout == HfLayout::kExpertUp)) * rows * cols;
      t.shape = {rows, cols};
      t.index = [start](std::int64_t i) { return start + i; };
      break;
    }
  }
  return t;
}

}  // namespace

std::vector<HfTensor> hf_tensors(const model::ModelConfig& m, HfArch arch) {
  const HfNames& names = hf_names(arch);
  std::vector<HfTensor> t;
  // The declared weights in the table's order (embedding, layers, head), each mapped by name.
  for (const model::ParamSpec& p : model::build_gpt_param_table(m).params) {
    std::string key = p.name, prefix;
    const std::vector<HfName>* list = &names.global;
    if (p.layer >= 0) {
      const std::string ours = str("layers.", p.layer, ".");
      key = p.name.substr(ours.size());
      prefix = str(names.layer, p.layer, ".");
      list = &names.in_layer;
    }
    const std::size_t before = t.size();
    for (const HfName& n : *list) {
      if (key != n.trident) continue;
      const std::string hf = prefix + n.hf;
      const std::size_t at = hf.find("{e}");
      if (at == std::string::npos) {
        t.push_back(hf_tensor(m, hf, p, n.layout));
        continue;
      }
      for (std::int64_t e = 0; e < p.global_shape[0]; ++e) {  // one tensor per expert
        t.push_back(
            hf_tensor(m, std::string(hf).replace(at, 3, std::to_string(e)), p, n.layout, e));
      }
    }
    // One without a tensor would stay zero on import and be dropped on export.
    if (t.size() == before) {
      throw InvalidArgument(str("the model's ", p.name, " has no tensor in transformers' ",
                                hf_arch_name(arch),
                                " (ckpt/hf_model.cc): this model cannot be converted"));
    }
  }
  return t;
}

bool hf_ignored_name(const std::string& name, HfArch arch, const model::ModelConfig& cfg) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (arch == HfArch::kGpt2 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"))) {
    return true;  // the causal-mask buffers of older GPT-2 files
  }
  if (ends_with("rotary_emb.inv_freq")) return true;     // a buffer older Llama files carry
  return name == "lm_head.weight" && cfg.tied_output();  // a tied copy
}

std::string hf_alternate_name(const std::string& name, HfArch arch) {
  const std::string prefix = "transformer.";
  if (arch == HfArch::kLlama || arch == HfArch::kMixtral || arch == HfArch::kQwen2Moe ||
      arch == HfArch::kQwen2) {
    return name;
  }
  if (name.rfind(prefix, 0) == 0) return name.substr(prefix.size());
  return prefix + name;
}

}  // namespace trident::ckpt
