#include "trident/ckpt/hf_model.h"

#include <limits>
#include <set>

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
    } else {
      throw InvalidArgument(str("config.json: model_type '", type,
                                "' is not supported (trident converts gpt2, bloom and llama)"));
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
  if (!ln && m.position_embedding == PositionEmbedding::kRope && m.swiglu && !m.add_bias_linear &&
      !m.embed_layernorm) {
    return HfArch::kLlama;
  }
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
  }
  return c;
}

namespace {

// Each architecture's tensors, by hand: names and layouts are transformers'.
std::vector<HfTensor> hf_tensor_list(const model::ModelConfig& m, HfArch arch) {
  const std::int64_t C = m.hidden_size, V = m.vocab_size, F = m.ffn(), L = m.num_layers;
  const std::int64_t NH = m.num_attention_heads, HS = m.head_dim(), G = m.query_groups();
  const std::int64_t hpg = NH / G;
  std::vector<HfTensor> t;
  auto same = [](std::int64_t i) { return i; };
  // HF's Conv1D (GPT-2) stores (in, out): the transpose of trident's (out, in).
  auto transposed = [](std::int64_t in, std::int64_t out) {
    return [in, out](std::int64_t i) { return (i % out) * in + i / out; };
  };
  auto add = [&](std::string name, std::vector<std::int64_t> shape, std::string tname,
                 std::function<std::int64_t(std::int64_t)> index) {
    t.push_back({std::move(name), std::move(shape), std::move(tname), std::move(index)});
  };
  if (arch == HfArch::kGpt2) {
    add("transformer.wte.weight", {V, C}, "embedding.word_embeddings.weight", same);
    add("transformer.wpe.weight", {m.max_positions(), C}, "embedding.position_embeddings.weight",
        same);
    // c_attn columns are (3, NH, HS); trident's rows (NH, 3, HS).
    auto qkv_row = [NH, HS, C](std::int64_t col) {
      const std::int64_t part = col / C, h = (col % C) / HS, d = col % HS;
      (void)NH;
      return (h * 3 + part) * HS + d;
    };
    for (std::int64_t l = 0; l < L; ++l) {
      const std::string p = str("layers.", l, "."), q = str("transformer.h.", l, ".");
      add(q + "ln_1.weight", {C}, p + "input_layernorm.weight", same);
      add(q + "ln_1.bias", {C}, p + "input_layernorm.bias", same);
      add(q + "attn.c_attn.weight", {C, 3 * C}, p + "self_attention.query_key_value.weight",
          [=](std::int64_t i) { return qkv_row(i % (3 * C)) * C + i / (3 * C); });
      add(q + "attn.c_attn.bias", {3 * C}, p + "self_attention.query_key_value.bias", qkv_row);
      add(q + "attn.c_proj.weight", {C, C}, p + "self_attention.dense.weight", transposed(C, C));
      add(q + "attn.c_proj.bias", {C}, p + "self_attention.dense.bias", same);
      add(q + "ln_2.weight", {C}, p + "post_attention_layernorm.weight", same);
      add(q + "ln_2.bias", {C}, p + "post_attention_layernorm.bias", same);
      add(q + "mlp.c_fc.weight", {C, F}, p + "mlp.dense_h_to_4h.weight", transposed(C, F));
      add(q + "mlp.c_fc.bias", {F}, p + "mlp.dense_h_to_4h.bias", same);
      add(q + "mlp.c_proj.weight", {F, C}, p + "mlp.dense_4h_to_h.weight", transposed(F, C));
      add(q + "mlp.c_proj.bias", {C}, p + "mlp.dense_4h_to_h.bias", same);
    }
    add("transformer.ln_f.weight", {C}, "final_layernorm.weight", same);
    add("transformer.ln_f.bias", {C}, "final_layernorm.bias", same);
  } else if (arch == HfArch::kBloom) {
    add("transformer.word_embeddings.weight", {V, C}, "embedding.word_embeddings.weight", same);
    add("transformer.word_embeddings_layernorm.weight", {C},
        "embedding.word_embeddings_layernorm.weight", same);
    add("transformer.word_embeddings_layernorm.bias", {C},
        "embedding.word_embeddings_layernorm.bias", same);
    for (std::int64_t l = 0; l < L; ++l) {
      const std::string p = str("layers.", l, "."), q = str("transformer.h.", l, ".");
      const std::pair<const char*, std::vector<std::int64_t>> names[] = {
          {"input_layernorm.weight", {C}},
          {"input_layernorm.bias", {C}},
          {"self_attention.query_key_value.weight", {3 * C, C}},  // (NH, 3, HS) rows in both
          {"self_attention.query_key_value.bias", {3 * C}},
          {"self_attention.dense.weight", {C, C}},
          {"self_attention.dense.bias", {C}},
          {"post_attention_layernorm.weight", {C}},
          {"post_attention_layernorm.bias", {C}},
          {"mlp.dense_h_to_4h.weight", {F, C}},
          {"mlp.dense_h_to_4h.bias", {F}},
          {"mlp.dense_4h_to_h.weight", {C, F}},
          {"mlp.dense_4h_to_h.bias", {C}}};
      for (const auto& [n, shape] : names) add(q + n, shape, p + n, same);
    }
    add("transformer.ln_f.weight", {C}, "final_layernorm.weight", same);
    add("transformer.ln_f.bias", {C}, "final_layernorm.bias", same);
  } else {
    add("model.embed_tokens.weight", {V, C}, "embedding.word_embeddings.weight", same);
    for (std::int64_t l = 0; l < L; ++l) {
      const std::string p = str("layers.", l, "."), q = str("model.layers.", l, ".");
      const std::string qkv = p + "self_attention.query_key_value.weight";
      add(q + "input_layernorm.weight", {C}, p + "input_layernorm.weight", same);
      // trident's QKV rows are (G, hpg + 2, HS): a group's query heads, its key and value head.
      add(q + "self_attn.q_proj.weight", {NH * HS, C}, qkv, [=](std::int64_t i) {
        const std::int64_t row = i / C, h = row / HS, d = row % HS;
        return ((h / hpg * (hpg + 2) + h % hpg) * HS + d) * C + i % C;
      });
      for (std::int64_t part : {hpg, hpg + 1}) {
        add(q + (part == hpg ? "self_attn.k_proj.weight" : "self_attn.v_proj.weight"), {G * HS, C},
            qkv, [=](std::int64_t i) {
              const std::int64_t row = i / C, g = row / HS, d = row % HS;
              return ((g * (hpg + 2) + part) * HS + d) * C + i % C;
            });
      }
      add(q + "self_attn.o_proj.weight", {C, C}, p + "self_attention.dense.weight", same);
      add(q + "post_attention_layernorm.weight", {C}, p + "post_attention_layernorm.weight", same);
      // trident's (2, F, C) up-projection: [0] gate, [1] up.
      add(q + "mlp.gate_proj.weight", {F, C}, p + "mlp.dense_h_to_4h.weight", same);
      add(q + "mlp.up_proj.weight", {F, C}, p + "mlp.dense_h_to_4h.weight",
          [=](std::int64_t i) { return F * C + i; });
      add(q + "mlp.down_proj.weight", {C, F}, p + "mlp.dense_4h_to_h.weight", same);
    }
    add("model.norm.weight", {C}, "final_layernorm.weight", same);
    if (!m.tied_output()) add("lm_head.weight", {V, C}, "output_layer.weight", same);
  }
  return t;
}

}  // namespace

std::vector<HfTensor> hf_tensors(const model::ModelConfig& m, HfArch arch) {
  std::vector<HfTensor> t = hf_tensor_list(m, arch);
  // Every weight the layers declare (model/layers/) must have its Hugging Face tensor: one
  // without would stay zero on import and be dropped on export.
  std::set<std::string> mapped;
  for (const HfTensor& x : t) mapped.insert(x.trident_name);
  for (const model::ParamSpec& p : model::build_gpt_param_table(m).params) {
    if (mapped.count(p.name) == 0) {
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
  if (arch == HfArch::kLlama) return name;
  if (name.rfind(prefix, 0) == 0) return name.substr(prefix.size());
  return prefix + name;
}

}  // namespace trident::ckpt
