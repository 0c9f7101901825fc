#include "trident/ckpt/model_config_json.h"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include "trident/ckpt/json_checks.h"
#include "trident/core/error.h"

namespace trident::ckpt {

namespace {

using model::ModelConfig;
using nlohmann::json;

// Where a value is read from: a checkpoint's config (file null) or a Hugging Face config.json.
struct Where {
  const char* key;
  const char* file = nullptr;
};

[[noreturn]] void bad(const Where& w, const json& v, const char* want) {
  if (w.file == nullptr) bad_checkpoint_value("config", w.key, v, want);
  throw core::InvalidArgument(
      core::str(w.file, ": ", w.key, " = ", v.dump().substr(0, 40), " must be ", want));
}

// A size or count: an integer in 0 .. 2^31-1 (converting a float such as 1e300 is undefined).
std::int64_t size_of(const json& v, const Where& key) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
      v.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
    bad(key, v, "a non-negative integer below 2^31");
  }
  return v.get<std::int64_t>();
}
double real_of(const json& v, const Where& key) {
  if (!v.is_number()) bad(key, v, "a number");
  return v.get<double>();
}
bool bool_of(const json& v, const Where& key) {
  if (!v.is_boolean()) bad(key, v, "true or false");
  return v.get<bool>();
}
std::string string_of(const json& v, const Where& key) {
  if (!v.is_string()) bad(key, v, "a string");
  return v.get<std::string>();
}

// The setting's key in one Hugging Face architecture's config.json (name null: none there).
struct HfKey {
  const char* name = nullptr;
  json fallback = nullptr;  // transformers' default when config.json omits it (null: required)
};

// One architecture setting as the checkpoint stores it.
struct Key {
  const char* name;
  json (*get)(const ModelConfig&);
  void (*set)(ModelConfig&, const json&, const Where& where);
  // The value of a checkpoint written before the key existed (null: every checkpoint has it).
  json fallback;
  // Part of the model's function and parameters: a resuming run must agree.
  bool architecture;
  // In config.json, per HfArch (gpt2, bloom, llama, mixtral, qwen2_moe, qwen2): the import reads
  // and the export writes it.
  HfKey hf[6] = {};
  // A mixture-of-experts setting: part of the model only when it has experts, so two dense
  // models agree whatever it says.
  bool moe = false;
};

#define TRIDENT_SIZE(member)                           \
  [](const ModelConfig& m) { return json(m.member); }, \
      [](ModelConfig& m, const json& v, const Where& k) { m.member = size_of(v, k); }
#define TRIDENT_REAL(member)                           \
  [](const ModelConfig& m) { return json(m.member); }, \
      [](ModelConfig& m, const json& v, const Where& k) { m.member = real_of(v, k); }
#define TRIDENT_BOOL(member)                           \
  [](const ModelConfig& m) { return json(m.member); }, \
      [](ModelConfig& m, const json& v, const Where& k) { m.member = bool_of(v, k); }

// The list. Sizes written resolved (ffn, positions, query groups) read back into the member.
const Key kKeys[] = {
    {"num_layers",
     TRIDENT_SIZE(num_layers),
     nullptr,
     true,
     {{"n_layer"},
      {"n_layer"},
      {"num_hidden_layers"},
      {"num_hidden_layers"},
      {"num_hidden_layers"},
      {"num_hidden_layers"}}},
    {"hidden_size",
     TRIDENT_SIZE(hidden_size),
     nullptr,
     true,
     {{"n_embd"},
      {"hidden_size"},
      {"hidden_size"},
      {"hidden_size"},
      {"hidden_size"},
      {"hidden_size"}}},
    {"num_attention_heads",
     TRIDENT_SIZE(num_attention_heads),
     nullptr,
     true,
     {{"n_head"},
      {"n_head"},
      {"num_attention_heads"},
      {"num_attention_heads"},
      {"num_attention_heads"},
      {"num_attention_heads"}}},
    {"ffn_hidden_size",
     [](const ModelConfig& m) { return json(m.ffn()); },
     [](ModelConfig& m, const json& v, const Where& k) { m.ffn_hidden_size = size_of(v, k); },
     nullptr,
     true,
     // GPT-2's n_inner null: 4 x hidden (trident's 0); BLOOM's is always 4 x hidden. Mixtral's
     // intermediate_size is the experts' (moe_ffn_hidden_size below, written after this one);
     // Qwen2-MoE's is the dense MLP's (its experts': moe_intermediate_size).
     {{"n_inner", 0},
      {},
      {"intermediate_size"},
      {"intermediate_size"},
      {"intermediate_size"},
      {"intermediate_size"}}},
    {"seq_length", TRIDENT_SIZE(seq_length), nullptr, true},
    {"max_position_embeddings",
     [](const ModelConfig& m) { return json(m.max_positions()); },
     [](ModelConfig& m, const json& v, const Where& k) {
       m.max_position_embeddings = size_of(v, k);
     },
     nullptr,
     true,
     {{"n_positions"},
      {},
      {"max_position_embeddings"},
      {"max_position_embeddings"},
      {"max_position_embeddings"},
      {"max_position_embeddings"}}},
    {"vocab_size",
     TRIDENT_SIZE(vocab_size),
     nullptr,
     true,
     {{"vocab_size"},
      {"vocab_size"},
      {"vocab_size"},
      {"vocab_size"},
      {"vocab_size"},
      {"vocab_size"}}},
    {"make_vocab_size_divisible_by", TRIDENT_SIZE(make_vocab_size_divisible_by), nullptr, false},
    {"init_method_std",
     TRIDENT_REAL(init_method_std),
     0.02,
     false,
     {{"initializer_range", 0.02},
      {"initializer_range", 0.02},
      {"initializer_range", 0.02},
      {"initializer_range", 0.02},
      {"initializer_range", 0.02},
      {"initializer_range", 0.02}}},
    {"layernorm_epsilon",
     TRIDENT_REAL(layernorm_epsilon),
     1e-5,
     false,
     {{"layer_norm_epsilon", 1e-5},
      {"layer_norm_epsilon", 1e-5},
      {"rms_norm_eps", 1e-6},
      {"rms_norm_eps", 1e-5},
      {"rms_norm_eps", 1e-6},
      {"rms_norm_eps", 1e-6}}},
    {"position_embedding_type",
     [](const ModelConfig& m) {
       return json(m.position_embedding == model::PositionEmbedding::kAlibi  ? "alibi"
                   : m.position_embedding == model::PositionEmbedding::kRope ? "rope"
                                                                             : "learned_absolute");
     },
     [](ModelConfig& m, const json& v, const Where& k) {
       const std::string s = string_of(v, k);
       if (s == "alibi") {
         m.position_embedding = model::PositionEmbedding::kAlibi;
       } else if (s == "rope") {
         m.position_embedding = model::PositionEmbedding::kRope;
       } else if (s == "learned_absolute") {
         m.position_embedding = model::PositionEmbedding::kLearnedAbsolute;
       } else {
         bad(k, v, "learned_absolute, alibi or rope");
       }
     },
     "learned_absolute", true},
    {"embed_layernorm", TRIDENT_BOOL(embed_layernorm), false, true},
    {"normalization",
     [](const ModelConfig& m) {
       return json(m.normalization == model::Normalization::kRmsNorm ? "RMSNorm" : "LayerNorm");
     },
     [](ModelConfig& m, const json& v, const Where& k) {
       const std::string s = string_of(v, k);
       if (s != "RMSNorm" && s != "LayerNorm") bad(k, v, "LayerNorm or RMSNorm");
       m.normalization =
           s == "RMSNorm" ? model::Normalization::kRmsNorm : model::Normalization::kLayerNorm;
     },
     "LayerNorm", true},
    {"swiglu", TRIDENT_BOOL(swiglu), false, true},
    // 0 (absent): one group per head.
    {"num_query_groups",
     [](const ModelConfig& m) { return json(m.query_groups()); },
     [](ModelConfig& m, const json& v, const Where& k) { m.num_query_groups = size_of(v, k); },
     0,
     true,
     {{},
      {},
      {"num_key_value_heads", 0},
      {"num_key_value_heads", 8},
      {"num_key_value_heads", 16},
      {"num_key_value_heads", 32}}},
    {"untie_embeddings_and_output_weights", TRIDENT_BOOL(untie_embeddings_and_output_weights),
     false, true},
    {"add_bias_linear", TRIDENT_BOOL(add_bias_linear), true, true},
    // --add-qkv-bias (older checkpoints: none; the QKV bias then follows add_bias_linear).
    {"add_qkv_bias", TRIDENT_BOOL(add_qkv_bias), false, true},
    {"rotary_base",
     TRIDENT_REAL(rotary_base),
     10000.0,
     true,
     {{},
      {},
      {"rope_theta", 10000.0},
      {"rope_theta", 1e6},
      {"rope_theta", 10000.0},
      {"rope_theta", 10000.0}}},
    {"use_rope_scaling", TRIDENT_BOOL(rope_scaling), false, true},
    {"rope_scaling_factor", TRIDENT_REAL(rope_scaling_factor), 8.0, false},
    {"rope_low_freq_factor", TRIDENT_REAL(rope_low_freq_factor), 1.0, false},
    {"rope_high_freq_factor", TRIDENT_REAL(rope_high_freq_factor), 4.0, false},
    {"rope_original_max_position_embeddings", TRIDENT_SIZE(rope_original_max_positions), 8192,
     false},
    // Mixture of experts (Megatron-Core's names and values; older checkpoints: dense). The
    // experts' hidden size written resolved (--ffn-hidden-size when not given).
    // Mixtral's and Qwen2-MoE's defaults are transformers' MixtralConfig's and Qwen2MoeConfig's.
    {"num_experts",
     TRIDENT_SIZE(num_experts),
     0,
     true,
     {{}, {}, {}, {"num_local_experts", 8}, {"num_experts", 60}}},
    {"moe_ffn_hidden_size",
     [](const ModelConfig& m) { return json(m.moe_ffn()); },
     [](ModelConfig& m, const json& v, const Where& k) { m.moe_ffn_hidden_size = size_of(v, k); },
     0,
     true,
     {{}, {}, {}, {"intermediate_size"}, {"moe_intermediate_size", 1408}},
     true},
    {"moe_router_topk",
     TRIDENT_SIZE(moe_router_topk),
     2,
     true,
     {{}, {}, {}, {"num_experts_per_tok", 2}, {"num_experts_per_tok", 4}},
     true},
    // An integer N, or Megatron's per-layer pattern as its list ([1, 0, 1, 0]; one entry per
    // layer, checked against num_layers once every key is read).
    {"moe_layer_freq",
     [](const ModelConfig& m) {
       if (m.moe_layer_pattern.empty()) return json(m.moe_layer_freq);
       json list = json::array();
       for (const bool b : m.moe_layer_pattern) list.push_back(b ? 1 : 0);
       return list;
     },
     [](ModelConfig& m, const json& v, const Where& k) {
       if (!v.is_array()) {
         m.moe_layer_freq = size_of(v, k);
         m.moe_layer_pattern.clear();
         return;
       }
       if (v.size() > 4096) bad(k, v, "an integer or a list of at most 4096 0 / 1 entries");
       m.moe_layer_freq = 1;
       m.moe_layer_pattern.clear();
       for (const json& e : v) {
         if (!e.is_number_integer() || (e.get<std::int64_t>() != 0 && e.get<std::int64_t>() != 1)) {
           bad(k, v, "an integer or a list of 0 / 1 entries");
         }
         m.moe_layer_pattern.push_back(e.get<std::int64_t>() == 1);
       }
     },
     1,
     true,
     {},
     true},
    {"moe_router_score_function",
     [](const ModelConfig& m) {
       return json(m.moe_router_score_function == model::MoeScoreFunction::kSigmoid ? "sigmoid"
                                                                                    : "softmax");
     },
     [](ModelConfig& m, const json& v, const Where& k) {
       const std::string s = string_of(v, k);
       if (s != "softmax" && s != "sigmoid") bad(k, v, "softmax or sigmoid");
       m.moe_router_score_function =
           s == "sigmoid" ? model::MoeScoreFunction::kSigmoid : model::MoeScoreFunction::kSoftmax;
     },
     "softmax",
     true,
     {},
     true},
    {"moe_router_pre_softmax", TRIDENT_BOOL(moe_router_pre_softmax), false, true, {}, true},
    {"moe_router_topk_scaling_factor",
     TRIDENT_REAL(moe_router_topk_scaling_factor),
     0.0,
     true,
     {},
     true},
    {"moe_router_num_groups", TRIDENT_SIZE(moe_router_num_groups), 0, true, {}, true},
    {"moe_router_group_topk", TRIDENT_SIZE(moe_router_group_topk), 0, true, {}, true},
    {"moe_expert_capacity_factor", TRIDENT_REAL(moe_expert_capacity_factor), 0.0, true, {}, true},
    {"moe_token_drop_policy",
     [](const ModelConfig& m) {
       return json(m.moe_token_drop_policy == model::MoeDropPolicy::kPosition ? "position"
                                                                              : "probs");
     },
     [](ModelConfig& m, const json& v, const Where& k) {
       const std::string s = string_of(v, k);
       if (s != "probs" && s != "position") bad(k, v, "probs or position");
       m.moe_token_drop_policy =
           s == "position" ? model::MoeDropPolicy::kPosition : model::MoeDropPolicy::kProbs;
     },
     "probs",
     true,
     {},
     true},
    {"moe_pad_expert_input_to_capacity",
     TRIDENT_BOOL(moe_pad_expert_input_to_capacity),
     false,
     true,
     {},
     true},
    {"moe_router_load_balancing_type",
     [](const ModelConfig& m) {
       switch (m.moe_router_load_balancing_type) {
         case model::MoeLoadBalancing::kSeqAuxLoss:
           return json("seq_aux_loss");
         case model::MoeLoadBalancing::kNone:
           return json("none");
         case model::MoeLoadBalancing::kAuxLoss:
           break;
       }
       return json("aux_loss");
     },
     [](ModelConfig& m, const json& v, const Where& k) {
       const std::string s = string_of(v, k);
       if (s == "aux_loss") {
         m.moe_router_load_balancing_type = model::MoeLoadBalancing::kAuxLoss;
       } else if (s == "seq_aux_loss") {
         m.moe_router_load_balancing_type = model::MoeLoadBalancing::kSeqAuxLoss;
       } else if (s == "none") {
         m.moe_router_load_balancing_type = model::MoeLoadBalancing::kNone;
       } else {
         bad(k, v, "aux_loss, seq_aux_loss or none");
       }
     },
     "aux_loss",
     true,
     {},
     true},
    // The losses' coefficients change what training minimises: a resume must keep them.
    {"moe_aux_loss_coeff",
     TRIDENT_REAL(moe_aux_loss_coeff),
     0.0,
     true,
     {{}, {}, {}, {"router_aux_loss_coef", 0.001}, {"router_aux_loss_coef", 0.001}},
     true},
    {"moe_z_loss_coeff", TRIDENT_REAL(moe_z_loss_coeff), 0.0, true, {}, true},
    {"moe_shared_expert_intermediate_size",
     TRIDENT_SIZE(moe_shared_expert_intermediate_size),
     0,
     true,
     {{}, {}, {}, {}, {"shared_expert_intermediate_size", 5632}},
     true},
    {"moe_shared_expert_gate", TRIDENT_BOOL(moe_shared_expert_gate), false, true, {}, true},
    {"moe_router_enable_expert_bias",
     TRIDENT_BOOL(moe_router_enable_expert_bias),
     false,
     true,
     {},
     true},
    // How fast the bias moves: a training setting (a resume may change it).
    {"moe_router_bias_update_rate",
     TRIDENT_REAL(moe_router_bias_update_rate),
     1e-3,
     false,
     {},
     true},
};

#undef TRIDENT_SIZE
#undef TRIDENT_REAL
#undef TRIDENT_BOOL

}  // namespace

nlohmann::json model_config_to_json(const ModelConfig& m) {
  json j = json::object();
  for (const Key& k : kKeys) j[k.name] = k.get(m);
  return j;
}

void check_model_size(const ModelConfig& m, const std::string& where) {
  if (m.num_layers > 4096) {
    throw core::DataError(core::str(where, ": ", m.num_layers,
                                    " layers: more than trident reads from a file (4096); the "
                                    "file is corrupt"));
  }
  // In double: the int64 count itself could overflow for sizes near 2^31.
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn());
  const double v = static_cast<double>(m.padded_vocab_size());
  const double p = static_cast<double>(m.max_positions());
  // Every layer counted with its experts (a bound; --moe-layer-freq thins them).
  const double experts = static_cast<double>(m.num_experts) *
                         (h + 3 * h * static_cast<double>(m.num_experts > 0 ? m.moe_ffn() : 0));
  const double params =
      2 * v * h + p * h + static_cast<double>(m.num_layers) * (4 * h * h + 3 * h * f + experts);
  if (params > 0x1p40) {
    throw core::DataError(core::str(where, ": the model would have about ", params,
                                    " parameters, more than 2^40 (hidden ", m.hidden_size, ", ffn ",
                                    m.ffn(), ", vocab ", m.vocab_size, ", ", m.num_layers,
                                    " layers): the file is corrupt"));
  }
}

ModelConfig model_config_from_json(const nlohmann::json& c) {
  if (!c.is_object()) throw core::DataError("checkpoint config: not a JSON object");
  ModelConfig m;
  for (const Key& k : kKeys) {
    if (c.contains(k.name)) {
      k.set(m, c[k.name], {k.name});
    } else if (k.fallback.is_null()) {
      throw core::DataError(
          core::str("checkpoint config: \"", k.name, "\" is missing (the checkpoint is corrupt)"));
    } else {
      k.set(m, k.fallback, {k.name});
    }
  }
  // Before a layer or a parameter is sized from it.
  if (m.make_vocab_size_divisible_by <= 0) {
    throw core::DataError("checkpoint config: make_vocab_size_divisible_by must be positive");
  }
  if (m.moe_layer_freq <= 0) {  // ModelConfig::moe_layer divides by it
    throw core::DataError("checkpoint config: moe_layer_freq must be positive");
  }
  if (!m.moe_layer_pattern.empty() &&
      static_cast<std::int64_t>(m.moe_layer_pattern.size()) != m.num_layers) {
    throw core::DataError(core::str("checkpoint config: moe_layer_freq has ",
                                    m.moe_layer_pattern.size(), " entries for ", m.num_layers,
                                    " layers (num_layers): the checkpoint is corrupt"));
  }
  check_model_size(m, "checkpoint config");
  return m;
}

void hf_keys_to_model(const nlohmann::json& config, HfArch arch, ModelConfig& m) {
  for (const Key& k : kKeys) {
    const HfKey& hf = k.hf[static_cast<int>(arch)];
    if (hf.name == nullptr) continue;
    const bool given = config.contains(hf.name) && !config[hf.name].is_null();
    if (!given && hf.fallback.is_null()) {
      throw core::InvalidArgument(core::str("config.json: ", hf.name, " is missing"));
    }
    k.set(m, given ? config[hf.name] : hf.fallback, {hf.name, "config.json"});
  }
}

void model_to_hf_keys(const ModelConfig& m, HfArch arch, nlohmann::json& config) {
  for (const Key& k : kKeys) {
    const HfKey& hf = k.hf[static_cast<int>(arch)];
    if (hf.name != nullptr) config[hf.name] = k.get(m);
  }
}

std::string architecture_diff(const nlohmann::json& a, const nlohmann::json& b) {
  const ModelConfig ma = model_config_from_json(a), mb = model_config_from_json(b);
  // A real-valued setting (rotary_base) was written as a float's value before settings became
  // doubles: equal when both round to the same float.
  const auto same = [](const json& x, const json& y) {
    if (x.is_number_float() || y.is_number_float()) {
      return static_cast<float>(x.get<double>()) == static_cast<float>(y.get<double>());
    }
    return x == y;
  };
  const bool experts = ma.num_experts > 0 || mb.num_experts > 0;
  std::ostringstream diff;
  for (const Key& k : kKeys) {
    if (!k.architecture || (k.moe && !experts)) continue;
    json va = k.get(ma), vb = k.get(mb);
    // The expert layers: the same layers whether an integer or a pattern says so (as if both
    // had experts: a dense model's are counted by num_experts).
    if (std::string_view(k.name) == "moe_layer_freq") {
      ModelConfig xa = ma, xb = mb;
      xa.num_experts = xb.num_experts = 1;
      va = xa.moe_layer_pattern_string();
      vb = xb.moe_layer_pattern_string();
    }
    if (!same(va, vb)) {
      diff << " " << k.name << ": checkpoint " << va.dump() << " vs run " << vb.dump() << ";";
    }
  }
  return diff.str();
}

}  // namespace trident::ckpt
