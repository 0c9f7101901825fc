// Hugging Face transformers models <-> trident: config.json <-> ModelConfig, and every HF weight
// as a re-indexing of one trident parameter (the full, single-rank ParamTable), for GPT-2
// (GPT2LMHeadModel), BLOOM (BloomForCausalLM), Llama (LlamaForCausalLM), Mixtral
// (MixtralForCausalLM: Llama with a mixture of experts in every layer, docs/moe.md) and Qwen2-MoE
// (Qwen2MoeForCausalLM: the same with q, k, v biases and a gated shared expert; dense layers among
// them) and Qwen2 (Qwen2ForCausalLM: Llama with q, k, v biases). Used by
// `trident convert --from-hf / --to-hf` (tools/convert_hf.cc); docs/hf-import.md, docs/hf-export.md
// list the supported config fields and what is refused.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trident/ckpt/model_config_json.h"
#include "trident/ckpt/safetensors.h"
#include "trident/model/config.h"

namespace trident::ckpt {

// "gpt2", "bloom", "llama", "mixtral", "qwen2_moe", "qwen2"
const char* hf_arch_name(HfArch a);

struct HfImport {
  HfArch arch = HfArch::kGpt2;
  model::ModelConfig model;
  StDType dtype = StDType::kF32;  // the weights' dtype (config's torch_dtype), kept for export
};

// config.json -> trident. seq_length: the training sequence length to record (0: the model's
// max_position_embeddings, 2048 for BLOOM, which has none). Throws InvalidArgument naming the
// config field for anything trident cannot run exactly (e.g. rope_scaling types other than
// llama3, attention biases in Llama, BLOOM's apply_residual_connection_post_layernorm, Mixtral's
// sliding_window; Qwen2-MoE's decoder_sparse_step and mlp_only_layers become the
// --moe-layer-freq pattern).
HfImport hf_config_to_trident(const nlohmann::json& config, std::int64_t seq_length);

// The architecture trident's config corresponds to; InvalidArgument listing the mismatches when
// it is none of the six (e.g. rotary positions with LayerNorm; for a model with experts, each
// setting Mixtral, or with shared experts Qwen2-MoE, cannot express, such as
// --moe-router-pre-softmax in a Mixtral or an ungated shared expert).
HfArch hf_arch_of(const model::ModelConfig& cfg);
// trident -> config.json for `arch`, weights stored as `dtype`.
nlohmann::json trident_to_hf_config(const model::ModelConfig& cfg, HfArch arch, StDType dtype);

// One HF weight: its name and shape, the trident parameter it comes from, and index(i): the
// element of that (whole) parameter that HF's flat element i is.
struct HfTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string trident_name;
  std::function<std::int64_t(std::int64_t)> index;
  std::int64_t numel() const;
};
// Every weight of the HF model of `cfg` in save_pretrained's names (tied output layers absent).
std::vector<HfTensor> hf_tensors(const model::ModelConfig& cfg, HfArch arch);
// HF names that are not weights (buffers some checkpoints carry) and tied copies, skipped on
// import; and the other spelling of a name (original GPT-2/BLOOM files lack "transformer.").
bool hf_ignored_name(const std::string& name, HfArch arch, const model::ModelConfig& cfg);
std::string hf_alternate_name(const std::string& name, HfArch arch);

}  // namespace trident::ckpt
