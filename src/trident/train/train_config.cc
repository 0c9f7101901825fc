#include "trident/train/train_config.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "trident/ckpt/model_config_json.h"
#include "trident/core/error.h"
#include "trident/data/data_loader.h"
#include "trident/data/utf8.h"
#include "trident/data/weighted_split_paths.h"
#include "trident/kernels/moe.h"
#include "trident/train/compat_flags.h"
#include "trident/train/deepspeed_config.h"
#include "trident/train/exit_codes.h"

namespace trident::train {

TrainConfig::TrainConfig() {
  model.hidden_dropout = 0.1;  // Megatron's defaults
  model.attention_dropout = 0.1;
}

namespace {

using core::str;

// The trainer's settings, each declared once (the add_*_options functions below): the declaration
// registers its flag with CLI11 (the command line, and the --config TOML file through the same
// options) and names the setting's JSON key, the flag without "--" with '_' for '-' (Megatron's
// argparse dest). TrainConfig::to_json walks the same declarations with a JSON object to write
// into: the checkpoint's config and the start-up arguments table read that.
class Settings {
 public:
  // json: null while registering options for parsing; set, each setting's value is also written
  // there (the options then go to a scratch app that never parses).
  explicit Settings(CLI::App& app, nlohmann::json* json = nullptr) : app_(app), json_(json) {}

  template <class T>
  CLI::Option* add_option(const std::string& flag, T& field, const std::string& help = "") {
    write(key_of(flag), field);
    return app_.add_option(flag, field, help);
  }
  // The same, under a JSON key that is not the flag's (--vocab-size: the NullTokenizer's
  // vocabulary, not the model's).
  template <class T>
  CLI::Option* add_option_as(const std::string& key, const std::string& flag, T& field,
                             const std::string& help) {
    write(key, field);
    return app_.add_option(flag, field, help);
  }
  CLI::Option* add_flag(const std::string& flag, bool& field, const std::string& help) {
    write(key_of(flag), field);
    return app_.add_flag(flag, field, help);
  }
  // A setting whose option fills its field through a callback (registered on app()).
  template <class T>
  void value(const std::string& flag, const T& field) {
    write(key_of(flag), field);
  }
  CLI::App& app() { return app_; }

 private:
  static std::string key_of(const std::string& flag) {
    std::string k = flag.substr(flag.find_first_not_of('-'));
    std::replace(k.begin(), k.end(), '-', '_');
    return k;
  }
  template <class T>
  void write(const std::string& key, const T& field) {
    if (json_ != nullptr) (*json_)[key] = field;
  }

  CLI::App& app_;
  nlohmann::json* json_;
};

// Sets every option named in the TOML file `path` that the command line did not give. CLI11 2.1's
// own set_config reads the file only for the main app, so `trident train --config F` (a
// subcommand) silently ignored F (found by fuzz_train_config: no input changed its coverage).
// This applies the file the way CLI11's config reader does, from the subcommand itself.
void apply_config_file(CLI::App& app, const std::string& path) {
  CLI::ConfigTOML format;
  for (const CLI::ConfigItem& item : format.from_file(path)) {  // FileError when missing
    if (item.name == "++" || item.name == "--" || !item.parents.empty()) {
      throw CLI::ConfigError(str("--config ", path, ": sections ([", item.fullname(),
                                 "]) are not supported; write the keys at the top level"));
    }
    CLI::Option* op = app.get_option_no_throw("--" + item.name);
    if (op == nullptr || item.name == "config") {
      throw CLI::ConfigError(str("--config ", path, ": '", item.name,
                                 "' is not a `trident train` flag (keys are flag names without "
                                 "the leading --, e.g. num-layers = 2)"));
    }
    if (op->count() > 0) continue;  // the command line overrides the file
    if (op->get_expected_min() == 0) {
      op->add_result(op->get_flag_value(item.name, format.to_flag(item)));
    } else {
      op->add_result(item.inputs);
    }
    op->run_callback();
  }
}

// Every string setting is written into checkpoint manifests and logs as JSON, which must be
// UTF-8: a byte string that is not (a flag value in a Latin-1 shell, say) is refused up front,
// naming the setting, instead of failing inside a save after the run has started.
void require_utf8(const nlohmann::json& j, const std::string& key) {
  if (j.is_string()) {
    const std::string& v = j.get_ref<const std::string&>();
    if (!data::utf8::is_valid(v)) {
      std::string flag = "--" + key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      throw core::InvalidArgument(str(flag, ": the value is not valid UTF-8 (byte ",
                                      data::utf8::valid_prefix(v),
                                      " of it); give paths and names in UTF-8"));
    }
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) require_utf8(v, k);
  } else if (j.is_array()) {
    for (const nlohmann::json& v : j) require_utf8(v, key);
  }
}

// Mixture of experts: Megatron-Core's flags (docs/moe.md). Megatron-DeepSpeed's (--topk,
// --expert-interval, --moe-loss-coeff, ...) are compatibility flags mapped onto these
// (compat_flags.cc).
void add_moe_options(Settings& s, TrainConfig& c) {
  model::ModelConfig& m = c.model;
  constexpr int kMany = CLI::detail::expected_max_vector_size;
  // One count; Megatron-DeepSpeed's flag of the same name takes a list (one count per expert
  // layer), whose default [1] is a dense model.
  s.value("--num-experts", m.num_experts);
  s.app()
      .add_option_function<std::vector<std::int64_t>>(
          "--num-experts",
          [&m](const std::vector<std::int64_t>& v) {
            if (v.size() != 1) {
              std::string list;
              for (std::int64_t e : v) {
                if (!list.empty()) list += ' ';
                list += std::to_string(e);
              }
              throw CLI::ValidationError("--num-experts",
                                         str("'", list,
                                             "': one count for every expert layer is supported "
                                             "(Megatron-DeepSpeed's per-layer lists are not)"));
            }
            m.num_experts = v[0] == 1 ? 0 : v[0];
          },
          "Experts in each mixture-of-experts layer (0 or 1: dense MLPs)")
      ->expected(1, kMany);
  s.add_option("--moe-ffn-hidden-size", m.moe_ffn_hidden_size,
               "Hidden size of each expert's MLP (default --ffn-hidden-size)");
  s.add_option("--moe-router-topk", m.moe_router_topk, "Experts each token is routed to")
      ->capture_default_str();
  // An integer N, or Megatron's per-layer pattern (a Python expression of lists of 0 and 1,
  // which Megatron evaluates and trident parses: model::parse_moe_layer_pattern). The checkpoint
  // and the arguments table hold the integer or the pattern's list (ckpt/model_config_json.cc).
  s.value("--moe-layer-freq", m.moe_layer_freq);
  s.app()
      .add_option_function<std::string>(
          "--moe-layer-freq",
          [&m](const std::string& v) {
            try {
              m.set_moe_layer_freq(v);
            } catch (const core::InvalidArgument& e) {
              // CLI11 prefixes the flag's name.
              std::string what = e.what();
              const std::string own = "--moe-layer-freq ";
              if (what.rfind(own, 0) == 0) what = what.substr(own.size());
              throw CLI::ValidationError("--moe-layer-freq", what);
            }
          },
          "N: the MLP of every N-th layer (0, N, 2N, ...) is a mixture of experts; or a pattern "
          "of 0 and 1, one per layer, as Megatron's: \"[1,0,1,0]\", \"([1]*3+[0]*1)*2\" (default "
          "1)")
      ->type_name("INT|PATTERN");
  s.add_option("--moe-router-score-function", c.moe_router_score_function,
               "Router scores: softmax or sigmoid")
      ->capture_default_str();
  s.add_flag("--moe-router-pre-softmax", m.moe_router_pre_softmax,
             "Softmax over all the experts before the top-k: the weights are not renormalised");
  s.add_option("--moe-router-topk-scaling-factor", m.moe_router_topk_scaling_factor,
               "Multiplies the routing weights (default: none)");
  s.add_option("--moe-router-num-groups", m.moe_router_num_groups,
               "Group-limited routing (DeepSeek-V3): the experts in this many groups of "
               "consecutive indices (default: none)");
  s.add_option("--moe-router-group-topk", m.moe_router_group_topk,
               "Group-limited routing: a token's experts come from this many groups, those whose "
               "top (topk / group-topk) scores sum largest");
  s.add_option("--moe-expert-capacity-factor", m.moe_expert_capacity_factor,
               "Tokens an expert takes: factor x tokens x topk / experts, the rest dropped "
               "(default, 0 or negative: dropless)");
  s.add_option("--moe-token-drop-policy", c.moe_token_drop_policy,
               "Which tokens an over-full expert drops: probs (the lowest weights) or position "
               "(the last)")
      ->capture_default_str();
  s.add_flag("--moe-pad-expert-input-to-capacity", m.moe_pad_expert_input_to_capacity,
             "Pad each expert's input to its capacity");
  // One type and one coefficient; Megatron takes lists of both (several losses at once).
  s.value("--moe-router-load-balancing-type", c.moe_router_load_balancing_type);
  s.app()
      .add_option_function<std::vector<std::string>>(
          "--moe-router-load-balancing-type",
          [&c](const std::vector<std::string>& v) {
            if (v.size() != 1) {
              throw CLI::ValidationError("--moe-router-load-balancing-type",
                                         "one type is supported (aux_loss, seq_aux_loss or none)");
            }
            c.moe_router_load_balancing_type = v[0];
          },
          "Load balancing: aux_loss (Switch / GShard), seq_aux_loss (per sequence) or none "
          "(default aux_loss)")
      ->expected(1, kMany);
  s.value("--moe-aux-loss-coeff", m.moe_aux_loss_coeff);
  s.app()
      .add_option_function<std::vector<double>>(
          "--moe-aux-loss-coeff",
          [&m](const std::vector<double>& v) {
            if (v.size() != 1) {
              throw CLI::ValidationError("--moe-aux-loss-coeff",
                                         "one coefficient is supported (lists go with several "
                                         "--moe-router-load-balancing-type types, which are not)");
            }
            m.moe_aux_loss_coeff = v[0];
          },
          "Coefficient of the load-balancing loss (default 0)")
      ->expected(1, kMany);
  s.add_option("--moe-z-loss-coeff", m.moe_z_loss_coeff,
               "Coefficient of the router's z-loss (default 0)");
  s.add_option("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size,
               "Shared experts: a dense MLP of this size beside the routed experts (default 0: "
               "none)");
  s.add_flag("--moe-shared-expert-gate", m.moe_shared_expert_gate,
             "Weigh the shared experts' output by a per-token sigmoid gate (Qwen2-MoE)");
  s.add_flag("--moe-router-enable-expert-bias", m.moe_router_enable_expert_bias,
             "Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias for the top-k "
             "choice, updated after every step (needs the sigmoid router)");
  s.add_option("--moe-router-bias-update-rate", m.moe_router_bias_update_rate,
               "The expert bias's step per iteration (default 1e-3)");
}

// The model: sizes, dropout, position, norm, MLP and attention variants.
void add_model_options(Settings& s, TrainConfig& c) {
  model::ModelConfig& m = c.model;
  s.add_option("--num-layers", m.num_layers, "Transformer layers")->capture_default_str();
  s.add_option("--hidden-size", m.hidden_size, "Hidden size")->capture_default_str();
  s.add_option("--num-attention-heads", m.num_attention_heads, "Attention heads")
      ->capture_default_str();
  s.add_option("--ffn-hidden-size", m.ffn_hidden_size, "MLP hidden size (default 4 x hidden)");
  s.add_option("--seq-length", m.seq_length, "Sequence length")->capture_default_str();
  s.add_option("--max-position-embeddings", m.max_position_embeddings,
               "Learned positions (default seq-length)");
  s.add_option("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by,
               "Pad the vocabulary to a multiple of this")
      ->capture_default_str();
  s.add_option("--init-method-std", m.init_method_std, "Std of the normal init")
      ->capture_default_str();
  s.add_option("--layernorm-epsilon", m.layernorm_epsilon, "LayerNorm epsilon")
      ->capture_default_str();
  s.add_option("--hidden-dropout", m.hidden_dropout,
               "Dropout on the embedding output and both residual branches")
      ->capture_default_str();
  s.add_option("--attention-dropout", m.attention_dropout, "Dropout on attention probabilities")
      ->capture_default_str();
  s.add_flag("--use-flash-attn", m.use_flash_attention,
             "Fused attention that keeps no (T x T) probabilities (always on with ALiBi or "
             "attention dropout)");
  s.add_option("--position-embedding-type", c.position_embedding_type,
               "learned_absolute, alibi or rope")
      ->capture_default_str();
  s.add_option("--normalization", c.normalization, "LayerNorm or RMSNorm")->capture_default_str();
  s.add_option("--rotary-base", m.rotary_base, "Base of the rotary frequencies (rope)")
      ->capture_default_str();
  s.add_option("--rotary-percent", c.rotary_percent,
               "Fraction of each head rotated (rope); only 1.0 is supported");
  s.add_flag("--use-rope-scaling", m.rope_scaling,
             "Llama 3.1's frequency scaling of the rotary embedding");
  s.add_option("--rope-scaling-factor", m.rope_scaling_factor,
               "Factor of --use-rope-scaling (low/high frequency factors 1 and 4, original "
               "context 8192, as Megatron)")
      ->capture_default_str();
  s.add_flag("--swiglu", m.swiglu, "SwiGLU MLP: silu(gate) * up, two up-projections");
  s.add_flag("--group-query-attention", c.group_query_attention,
             "Grouped-query attention (with --num-query-groups)");
  s.add_option("--num-query-groups", m.num_query_groups,
               "Key/value heads with --group-query-attention (1: multi-query)");
  s.add_flag("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights,
             "Own output layer instead of the word embedding");
  s.app().add_flag(
      "--disable-bias-linear", [&m](std::int64_t) { m.add_bias_linear = false; },
      "No biases in the attention and MLP linear layers");
  s.add_flag("--add-qkv-bias", m.add_qkv_bias,
             "Keep the QKV projection's bias with --disable-bias-linear (Qwen2, Qwen2-MoE)");
  s.add_flag("--embed-layernorm", m.embed_layernorm, "LayerNorm after the word embedding (BLOOM)");
  add_moe_options(s, c);
}

// Precision, loss scaling, recomputation, the chunked head, the model preset.
void add_precision_options(Settings& s, TrainConfig& c) {
  model::ModelConfig& m = c.model;
  s.add_flag("--bf16", c.bf16,
             "BF16 mixed precision: BF16 matmul operands with FP32 accumulation, FP32 master "
             "weights, Adam moments and gradient accumulation");
  s.add_flag("--fp16", c.fp16,
             "FP16 mixed precision: dynamic loss scaling; gradients outside FP16's range "
             "skip the step (see docs/training.md for what the CPU backend computes in FP16)");
  s.add_option("--loss-scale", c.loss_scale, "Static loss scale (default: dynamic)");
  s.add_option("--initial-loss-scale", c.initial_loss_scale, "Initial dynamic loss scale")
      ->capture_default_str();
  s.add_option("--min-loss-scale", c.min_loss_scale, "Smallest dynamic loss scale")
      ->capture_default_str();
  s.add_option("--loss-scale-window", c.loss_scale_window,
               "Clean iterations before the loss scale doubles")
      ->capture_default_str();
  s.add_option("--hysteresis", c.hysteresis, "Overflows in a row before the loss scale halves")
      ->capture_default_str();
  s.add_option("--recompute-granularity", c.recompute_granularity,
               "full (recompute whole layers in backward) or selective (the attention core)");
  s.add_option("--recompute-method", c.recompute_method,
               "uniform (every layer) or block (the first --recompute-num-layers of each stage)")
      ->capture_default_str();
  s.add_option("--recompute-num-layers", m.recompute_num_layers,
               "Layers per stage to recompute with --recompute-method block")
      ->capture_default_str();
  s.add_option("--loss-chunk-rows", c.loss_chunk_rows,
               "Token rows the output layer and the cross-entropy take at a time, fused with "
               "the output layer's backward, so the (tokens x vocab) logits are never all in "
               "memory; -1: auto (about 64 MiB of logits per chunk), 0: keep all the logits")
      ->capture_default_str();
  s.add_option("--model", c.model_preset,
               "gpt (default), bloom or llama: bloom = --position-embedding-type alibi "
               "--embed-layernorm; llama = --normalization RMSNorm --position-embedding-type "
               "rope --swiglu --untie-embeddings-and-output-weights --disable-bias-linear");
}

// Batch sizes, training length, learning-rate schedule, AdamW and the seed.
void add_schedule_options(Settings& s, TrainConfig& c) {
  s.add_option("--micro-batch-size", c.micro_batch_size, "Sequences per micro-batch")
      ->capture_default_str();
  s.add_option("--global-batch-size", c.global_batch_size,
               "Sequences per iteration (micro x accumulation x data-parallel)");

  s.add_option("--train-iters", c.train_iters,
               "Training iterations (default: from --train-samples, else 100)");
  s.add_option("--train-samples", c.train_samples,
               "Training length in samples; the schedule counts samples (Megatron)");
  s.add_option("--lr-warmup-samples", c.lr_warmup_samples, "Warm-up in samples");
  s.add_option("--lr-decay-samples", c.lr_decay_samples,
               "Decay length in samples (default --train-samples)");
  s.add_option("--lr-warmup-fraction", c.lr_warmup_fraction,
               "Warm-up as a fraction of the decay length");
  s.add_option("--lr-warmup-init", c.lr.init_lr, "Learning rate at the start of warm-up")
      ->capture_default_str();
  s.add_option("--train-tokens", c.train_tokens,
               "Also stop once this many tokens were consumed (Megatron-DeepSpeed); "
               "trident plan: estimate the time to train this many")
      ->transform(CLI::Validator(
          [](std::string& v) {
            // 366e9: an exact integer written as a float.
            try {
              std::size_t used = 0;
              const double d = std::stod(v, &used);
              if (used == v.size() && d >= 0 && d < 9.2e18 &&
                  d == static_cast<double>(static_cast<std::int64_t>(d)))
                v = std::to_string(static_cast<std::int64_t>(d));
            } catch (const std::exception&) {
            }
            return std::string();
          },
          "", "integer tokens"));
  s.add_option("--lr-warmup-tokens", c.lr_warmup_tokens, "Warm-up in tokens (Megatron-DeepSpeed)");
  s.add_option("--lr-decay-tokens", c.lr_decay_tokens,
               "Decay length in tokens: the schedule counts tokens (Megatron-DeepSpeed)");
  s.add_option("--lr", c.lr.lr, "Peak learning rate")->capture_default_str();
  s.add_option("--min-lr", c.lr.min_lr, "Final learning rate")->capture_default_str();
  s.add_option("--lr-decay-style", c.lr_decay_style, "constant, linear or cosine")
      ->capture_default_str();
  s.add_option("--lr-warmup-iters", c.lr.warmup_iters, "Linear warm-up iterations")
      ->capture_default_str();
  s.add_option("--lr-decay-iters", c.lr.decay_iters, "Decay iterations (default train-iters)");
  s.add_option("--optimizer", c.optimizer_type,
               "Update rule: adam (AdamW, decoupled weight decay) or lion (sign of the momentum "
               "interpolation, one state array)")
      ->capture_default_str();
  s.add_option("--weight-decay", c.optimizer.weight_decay, "Decoupled weight decay")
      ->capture_default_str();
  s.add_option("--clip-grad", c.optimizer.clip_grad, "Global gradient-norm clip (0: off)")
      ->capture_default_str();
  s.add_option("--adam-beta1", c.optimizer.beta1, "AdamW beta1")->capture_default_str();
  s.add_option("--adam-beta2", c.optimizer.beta2, "AdamW beta2")->capture_default_str();
  s.add_option("--adam-eps", c.optimizer.eps, "AdamW epsilon")->capture_default_str();
  s.add_option("--lion-beta1", c.optimizer.lion_beta1,
               "Lion beta1: the momentum/gradient interpolation whose sign is the step")
      ->capture_default_str();
  s.add_option("--lion-beta2", c.optimizer.lion_beta2, "Lion beta2: the momentum's decay")
      ->capture_default_str();
  s.add_option("--seed", c.seed, "Random seed (init, data order)")->capture_default_str();
}

// Datasets, blending, splits, tokenizer and document masks.
void add_data_options(Settings& s, TrainConfig& c) {
  s.add_option("--data-path", c.data_path,
               "Dataset prefixes (without .bin/.idx), optionally weighted: 0.3 A 0.7 B")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  s.add_option("--train-data-path", c.train_data_path, "Training blend (instead of --split)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  s.add_option("--valid-data-path", c.valid_data_path, "Validation blend")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  s.add_option("--test-data-path", c.test_data_path, "Test blend")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  for (auto [split, groups, file] :
       {std::tuple{"train", &c.train_weighted_split_paths, &c.train_weighted_split_paths_path},
        std::tuple{"valid", &c.valid_weighted_split_paths, &c.valid_weighted_split_paths_path},
        std::tuple{"test", &c.test_weighted_split_paths, &c.test_weighted_split_paths_path}}) {
    const std::string flag = str("--", split, "-weighted-split-paths");
    s.add_option(flag, *groups,
                 str("BigScience's named ", split,
                     " groups: \"NAME: WEIGHT START:END PREFIX, ...\" (START:END: fractions of "
                     "each dataset's documents)",
                     std::string(split) == "train" ? ""
                                                   : "; each group is evaluated and logged "
                                                     "under its name"))
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    s.add_option(flag + "-path", *file,
                 str("A file holding the ", flag, " groups, one line of quoted groups"));
  }
  s.add_flag("--allow-split-paths-overlap", c.allow_split_paths_overlap,
             "Let a validation or test range of --*-weighted-split-paths share documents with "
             "the training range of the same dataset (refused by default)");
  s.add_option("--data-cache-path", c.data_cache_path,
               "Where the dataset indices are cached (default: next to the data)");
  s.add_option("--mid-level-dataset-surplus", c.mid_level_dataset_surplus,
               "Extra share of samples each blended dataset builds")
      ->capture_default_str();
  s.add_option("--rampup-batch-size", c.rampup_batch_size,
               "START INCREMENT SAMPLES: grow the global batch over SAMPLES consumed samples")
      ->expected(3);
  // One value in Megatron-LM; several are joined with spaces, because Megatron-LM's own GPT-3
  // example passes the quoted schedule through an unquoted bash array, which splits it into words.
  s.value("--step-batch-size-schedule", c.step_batch_size_schedule);
  s.app()
      .add_option_function<std::vector<std::string>>(
          "--step-batch-size-schedule",
          [&c](const std::vector<std::string>& v) {
            c.step_batch_size_schedule.clear();
            for (const std::string& x : v)
              c.step_batch_size_schedule += (c.step_batch_size_schedule.empty() ? "" : " ") + x;
          },
          "\"THRESHOLD:BATCH_SIZE ...\" (Megatron-LM): the global batch size from each "
          "threshold of consumed tokens on, e.g. \"0:16 2.4B:320 4.8B:624\" (suffixes K, M, B, "
          "T)")
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  s.add_flag("--decrease-batch-size-if-needed", c.decrease_batch_size_if_needed,
             "Round global batches down to a multiple of micro x data-parallel size");
  s.add_option("--split", c.split, "Train/valid/test split weights")->capture_default_str();
  s.add_option("--tokenizer-type", c.tokenizer_type, "GPT2BPETokenizer, ...")
      ->capture_default_str();
  s.add_option("--vocab-file", c.vocab_file, "Tokenizer vocabulary (vocab.json)");
  s.add_option("--merge-file", c.merge_file, "Tokenizer merges (merges.txt)");
  s.add_option("--tokenizer-model", c.tokenizer_model, "Tokenizer model file");
  s.add_option_as("null_tokenizer_vocab_size", "--vocab-size", c.null_tokenizer_vocab_size,
                  "Vocabulary size (NullTokenizer)");
  s.add_option("--tokenizer-name-or-path", c.tokenizer_name_or_path,
               "PretrainedFromHF: a Hugging Face tokenizer directory or its tokenizer.json");
  s.add_option("--pad-vocab-size-to", c.pad_vocab_size_to,
               "Pad the vocabulary to exactly this size (a multiple of tensor-parallel size)");
  s.add_flag("--eod-mask-loss", c.eod_mask_loss,
             "No loss where the input token is end-of-document");
  s.add_flag("--reset-position-ids", c.model.reset_position_ids,
             "Positions restart after each end-of-document token");
  s.add_flag("--reset-attention-mask", c.model.reset_attention_mask,
             "No attention across end-of-document tokens within a sample");
  s.add_option("--dataloader-type", c.dataloader_type, "single (Megatron's sampler)")
      ->capture_default_str();
}

// Evaluation, logging, TensorBoard, metrics and the profile.
void add_logging_options(Settings& s, TrainConfig& c) {
  s.add_option("--eval-interval", c.eval_interval, "Iterations between evaluations")
      ->capture_default_str();
  s.add_option("--eval-iters", c.eval_iters, "Batches per evaluation")->capture_default_str();
  s.add_option("--log-interval", c.log_interval, "Iterations between log lines")
      ->capture_default_str();
  s.add_option("--metrics-jsonl", c.metrics_jsonl, "Write metrics as JSON lines here");
  s.add_flag("--megatron-deepspeed-log", c.megatron_deepspeed_log,
             "Log Megatron-DeepSpeed's iteration line (seconds, samples per second, TFLOPs)");
  s.add_option("--tensorboard-dir", c.tensorboard_dir, "Write TensorBoard event files here");
  s.add_option("--tensorboard-log-interval", c.tensorboard_log_interval,
               "Iterations between TensorBoard scalars")
      ->capture_default_str();
  s.add_flag("--log-timers-to-tensorboard", c.log_timers_to_tensorboard,
             "Iteration time in TensorBoard");
  s.add_flag("--log-batch-size-to-tensorboard", c.log_batch_size_to_tensorboard,
             "Batch size in TensorBoard");
  s.add_flag("--log-validation-ppl-to-tensorboard", c.log_validation_ppl_to_tensorboard,
             "Validation perplexity in TensorBoard");
  s.add_flag("--log-memory-to-tensorboard", c.log_memory_to_tensorboard,
             "Memory per rank in TensorBoard");
  s.add_flag("--log-world-size-to-tensorboard", c.log_world_size_to_tensorboard,
             "World size in TensorBoard");
  s.add_flag("--log-throughput", c.log_throughput, "Throughput in TensorBoard");
  s.add_flag("--no-log-loss-scale-to-tensorboard", c.no_log_loss_scale_to_tensorboard,
             "No loss scale in TensorBoard");
  s.add_flag("--no-log-learnig-rate-to-tensorboard", c.no_log_learning_rate_to_tensorboard,
             "No learning rate in TensorBoard (Megatron's spelling)");
  s.add_option("--peak-tflops", c.peak_tflops, "Machine peak for MFU (default: measured)");
  s.add_flag("--profile", c.profile,
             "Time every kernel and collective of rank 0 (trident's own timers) over "
             "iterations profile-step-start+1 .. profile-step-end; a table at the end, per-kind "
             "times in --metrics-jsonl");
  s.add_option("--profile-step-start", c.profile_step_start,
               "--profile: iterations already done when timing starts")
      ->capture_default_str();
  s.add_option("--profile-step-end", c.profile_step_end, "--profile: last iteration timed")
      ->capture_default_str();
}

// Checkpoints, DeepSpeed config and clean stops.
void add_checkpoint_options(Settings& s, TrainConfig& c) {
  s.add_option("--save", c.save, "Checkpoint directory to write");
  s.add_option("--load", c.load, "Checkpoint directory to resume from");
  s.add_flag("--finetune", c.finetune,
             "With --load: take the weights only (iteration 0, data from the start, fresh "
             "optimizer and loss scaler), as Megatron");
  s.add_option("--save-interval", c.save_interval, "Iterations between checkpoints");
  s.add_option("--exit-interval", c.exit_interval, "Save (if --save) and exit at this iteration");
  s.add_flag("--deepspeed", c.deepspeed,
             "Megatron-DeepSpeed: read batch sizes, ZeRO, precision, loss scaling and clipping "
             "from --deepspeed_config");
  s.add_option("--deepspeed_config", c.deepspeed_config, "DeepSpeed JSON file");
  s.add_option("--save-retain", c.save_retain,
               "Keep only the newest N checkpoints in --save (0: keep all)");
  s.add_flag("--async-save", c.async_save,
             "Write checkpoints in the background while training continues");
  s.add_flag("--exit-signal-handler", c.exit_signal_handler,
             "On SIGTERM (or SIGUSR1) save (if --save) and exit after the iteration");
  s.add_option("--exit-duration-in-mins", c.exit_duration_in_mins,
               "Save (if --save) and exit once the run has trained this many minutes");
  s.add_option("--kill-switch-path", c.kill_switch_path,
               "Save (if --save) and exit when this file appears");
  s.add_option("--exit-codes", c.exit_codes,
               "What a planned stop (signal, duration, kill switch, --exit-interval) exits "
               "with: megatron (0, as Megatron; the default) or distinct (10-13, one per stop; "
               "also TRIDENT_EXIT_CODES=distinct, which trident supervise sets)")
      ->capture_default_str();
}

// Parallelism, ZeRO, offload, pipeline schedule and the communication timeout.
void add_parallel_options(Settings& s, TrainConfig& c) {
  s.add_option("--device", c.device,
               "Where to train: cpu, cuda (each rank on the GPU of its local rank), or auto "
               "(cuda when this build has CUDA and a GPU is visible, else cpu)")
      ->capture_default_str();
  s.add_option("--tensor-model-parallel-size", c.tensor_model_parallel_size, "TP size")
      ->capture_default_str();
  s.add_option("--pipeline-model-parallel-size", c.pipeline_model_parallel_size, "PP size")
      ->capture_default_str();
  s.add_option("--expert-model-parallel-size", c.expert_model_parallel_size,
               "EP size: the experts split over this many data-parallel ranks (docs/moe.md)")
      ->capture_default_str();
  s.add_option("--context-parallel-size", c.context_parallel_size,
               "CP size: each sequence split over this many ranks, attention as a ring "
               "(docs/long-context.md)")
      ->capture_default_str();
  s.add_option("--ds-sequence-parallel-size", c.ds_sequence_parallel_size,
               "DeepSpeed-Ulysses size: each sequence split over this many ranks, attention by "
               "head after an all-to-all (docs/long-context.md)")
      ->capture_default_str();
  s.add_option("--zero-stage", c.zero_stage,
               "ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters")
      ->capture_default_str();
  s.add_flag("--use-distributed-optimizer", c.use_distributed_optimizer,
             "Megatron's distributed optimizer (= --zero-stage 1)");
  s.add_option("--ddp-bucket-size", c.ddp_bucket_size,
               "Elements per gradient bucket reduced while backward runs")
      ->capture_default_str();
  s.add_option("--offload-optimizer", c.offload_optimizer,
               "Where the Adam moments live: none, cpu (host memory) or nvme (files under "
               "--offload-path, streamed through a bounded window; docs/offload.md)")
      ->capture_default_str();
  s.add_option("--offload-path", c.offload.path,
               "Directory (on a fast disk) for the files of --offload-optimizer nvme and "
               "--offload-params nvme");
  s.add_option("--offload-params", c.offload_params,
               "ZeRO-3 parameter shards: none (in memory) or nvme (a file under --offload-path, "
               "read ahead of each layer's gather; docs/offload.md)")
      ->capture_default_str();
  s.add_option("--offload-window-mib", c.offload_window_mib,
               "offload nvme: MiB of host buffers the optimizer step streams the offloaded "
               "state through")
      ->capture_default_str();
  s.add_option("--offload-io", c.offload_io,
               "--offload-optimizer nvme: asynchronous I/O engine, uring (io_uring) or threads "
               "(pread/pwrite on a thread pool)")
      ->capture_default_str();
  s.add_flag("--offload-buffered", c.offload_buffered,
             "--offload-optimizer nvme: go through the page cache (file systems without "
             "O_DIRECT)");
  s.add_flag("--hierarchical-dp", c.hierarchical_dp,
             "Data-parallel all-reduce as reduce-scatter inside each host, all-reduce across "
             "hosts, all-gather inside the host (ZeRO 0 gradients; docs/clusters.md)");
  s.add_flag("--sequence-parallel", c.sequence_parallel,
             "Split LayerNorm/dropout regions along the tokens across tensor-parallel ranks");
  s.add_option("--pipeline-schedule", c.pipeline_schedule, "gpipe, 1f1b or interleaved")
      ->capture_default_str();
  s.add_option("--num-layers-per-virtual-pipeline-stage", c.num_layers_per_virtual_pipeline_stage,
               "Layers per virtual chunk (interleaved schedule)");
  s.add_option("--decoder-first-pipeline-num-layers", c.decoder_first_pipeline_num_layers,
               "Layers on the first pipeline stage (uneven split)");
  s.add_option("--decoder-last-pipeline-num-layers", c.decoder_last_pipeline_num_layers,
               "Layers on the last pipeline stage (uneven split)");
  s.add_option("--comm-timeout", c.comm_timeout,
               "Seconds a rank may wait in a collective before the job ends")
      ->capture_default_str();
}

void add_setting_options(Settings& s, TrainConfig& c) {
  add_model_options(s, c);
  add_precision_options(s, c);
  add_schedule_options(s, c);
  add_data_options(s, c);
  add_logging_options(s, c);
  add_checkpoint_options(s, c);
  add_parallel_options(s, c);
}

}  // namespace

void add_train_options(CLI::App& app, TrainConfig& c) {
  auto config_file = std::make_shared<std::string>();
  app.add_option("--config", *config_file,
                 "TOML file holding the same keys as the flags (flags override)");
  app.parse_complete_callback([&app, config_file] {
    if (!config_file->empty()) apply_config_file(app, *config_file);
  });
  // As with argparse, a flag given twice keeps its last value (config file, then command line).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  Settings settings(app);
  add_setting_options(settings, c);

  add_compat_options(app, c);
  // Integers written with '_' (9_765_625), as Python's int() accepts; and the set of flags given
  // explicitly, for the DeepSpeed JSON's contradiction checks.
  const CLI::Validator underscores(
      [](std::string& v) {
        v = strip_digit_underscores(v);
        return std::string();
      },
      "", "digit underscores");
  for (CLI::Option* o : app.get_options()) {
    if (o->get_items_expected_max() > 0) o->transform(underscores);
  }
}

void record_given_flags(const CLI::App& app, TrainConfig& c) {
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() > 0 && !o->get_lnames().empty()) c.given.insert("--" + o->get_lnames()[0]);
  }
}

int TrainConfig::data_parallel_size(int world_size) const {
  return world_size /
         (tensor_model_parallel_size * pipeline_model_parallel_size * sequence_split());
}

int TrainConfig::virtual_pipeline_chunks() const {
  if (num_layers_per_virtual_pipeline_stage <= 0) return 1;
  return static_cast<int>(model.num_layers /
                          (num_layers_per_virtual_pipeline_stage * pipeline_model_parallel_size));
}

data::BatchScheduleConfig TrainConfig::batch_schedule_config(int dp) const {
  std::optional<data::RampupBatchSize> rampup;
  if (rampup_batch_size.size() == 3) {
    rampup =
        data::RampupBatchSize{rampup_batch_size[0], rampup_batch_size[1], rampup_batch_size[2]};
  }
  return {.global_batch_size = global_batch_size,
          .micro_batch_size = micro_batch_size,
          .data_parallel_size = dp,
          .rampup = rampup,
          .step_schedule = step_schedule,
          .decrease_batch_size_if_needed = decrease_batch_size_if_needed};
}

std::int64_t TrainConfig::num_micro_batches(int world_size) const {
  return global_batch_size / (micro_batch_size * data_parallel_size(world_size));
}

namespace {

// Megatron's update_train_iters: the iterations --train-samples takes, the ramp counted step by
// step (a partial last batch is dropped); a step schedule counted until the samples are reached
// (its last batch may overshoot them, as in Megatron-LM).
std::int64_t train_iters_from_samples(const TrainConfig& c, int dp) {
  if (!c.step_schedule.empty()) {
    return data::BatchSchedule(c.batch_schedule_config(dp)).iterations_for_samples(c.train_samples);
  }
  if (c.rampup_batch_size.empty()) return c.train_samples / c.global_batch_size;
  const data::BatchSchedule sched(c.batch_schedule_config(dp));
  std::int64_t iterations = 0, consumed = 0;
  while (consumed <= c.rampup_batch_size[2] && consumed <= c.train_samples) {
    consumed += sched.at(consumed).global_batch_size;
    ++iterations;
  }
  if (c.train_samples > consumed) iterations += (c.train_samples - consumed) / c.global_batch_size;
  return iterations;
}

}  // namespace

void TrainConfig::finalize(int world_size) {
  apply_compat_flags(*this);
  apply_deepspeed_config(*this, world_size);
  if (tokenizer_type == "PretrainedFromHF") {
    TRIDENT_CHECK(!tokenizer_name_or_path.empty(),
                  "--tokenizer-type PretrainedFromHF needs --tokenizer-name-or-path DIR (a Hugging "
                  "Face tokenizer directory holding tokenizer.json, or the file itself)");
    tokenizer_type = "HuggingFaceTokenizer";
    tokenizer_model =
        std::filesystem::is_directory(tokenizer_name_or_path)
            ? (std::filesystem::path(tokenizer_name_or_path) / "tokenizer.json").string()
            : tokenizer_name_or_path;
    TRIDENT_CHECK(std::filesystem::exists(tokenizer_model), "--tokenizer-name-or-path ",
                  tokenizer_name_or_path, ": no ", tokenizer_model,
                  " (trident reads the fast tokenizer's tokenizer.json; no download from the Hub)");
  }
  if (virtual_pipeline_model_parallel_size > 0) {
    const std::int64_t per = pipeline_model_parallel_size * virtual_pipeline_model_parallel_size;
    TRIDENT_CHECK(model.num_layers % per == 0, "--virtual-pipeline-model-parallel-size ",
                  virtual_pipeline_model_parallel_size, ": --num-layers ", model.num_layers,
                  " is not divisible by pp x virtual stages = ", per);
    if (virtual_pipeline_model_parallel_size > 1)
      num_layers_per_virtual_pipeline_stage = model.num_layers / per;
  }
  TRIDENT_CHECK(!no_pipeline_parallel || pipeline_model_parallel_size == 1,
                "--no-pipeline-parallel with --pipeline-model-parallel-size ",
                pipeline_model_parallel_size, ": Megatron-DeepSpeed needs pipeline size 1 there");
  if (save_interval > 0 && save.empty()) {
    warnings.push_back("--save-interval without --save: nothing is saved (as Megatron)");
    save_interval = 0;
  }
  finalize_model();
  check_compat_combinations(*this);
  finalize_parallel(world_size);
  finalize_schedule(data_parallel_size(world_size));
  finalize_split_paths();
  TRIDENT_CHECK(
      !data_path.empty() || !train_data_path.empty() || !train_weighted_split_paths.empty(),
      "--data-path (or --train-data-path, or --train-weighted-split-paths) is required: "
      "a prefix made by trident preprocess, or a weighted list 0.3 A 0.7 B");
  TRIDENT_CHECK(eval_interval > 0, "--eval-interval must be positive");
  TRIDENT_CHECK(eval_iters >= 0, "--eval-iters must be >= 0");
  TRIDENT_CHECK(log_interval > 0, "--log-interval must be positive");
  TRIDENT_CHECK(save_interval >= 0 && exit_interval >= 0, "intervals must be >= 0");
  // As Megatron: --save-interval without --save saves nothing (launch scripts often carry both
  // and drop --save for a dry run); said once.
  if (save_interval > 0 && save.empty()) {
    warnings.push_back("--save-interval " + std::to_string(save_interval) +
                       " without --save: no checkpoints will be written");
  }
  TRIDENT_CHECK(save_retain >= 0, "--save-retain must be >= 0 (0 keeps every checkpoint)");
  TRIDENT_CHECK(exit_duration_in_mins >= 0, "--exit-duration-in-mins must be >= 0");
  TRIDENT_CHECK(device == "auto" || device == "cpu" || device == "cuda",
                "--device: unknown device '", device, "' (use cpu, cuda or auto)");
  TRIDENT_CHECK(exit_codes == "megatron" || exit_codes == "distinct",
                "--exit-codes: unknown value '", exit_codes,
                "' (use megatron: every planned stop exits 0, or distinct: signal 10, duration "
                "11, kill switch 12, --exit-interval 13; the environment variable ",
                kExitCodesEnv, " sets it when the flag is not given)");
  TRIDENT_CHECK(dataloader_type == "single", "--dataloader-type: unknown type '", dataloader_type,
                "' (use single)");
  TRIDENT_CHECK(pad_vocab_size_to >= 0, "--pad-vocab-size-to must be >= 0");
  TRIDENT_CHECK(tensorboard_log_interval > 0, "--tensorboard-log-interval must be positive");
  if (profile) {
    TRIDENT_CHECK(profile_step_start >= 0 && profile_step_end > profile_step_start,
                  "--profile-step-start ", profile_step_start, " and --profile-step-end ",
                  profile_step_end, ": the window is empty; give 0 <= start < end");
    TRIDENT_CHECK(train_iters == 0 || profile_step_start < train_iters, "--profile-step-start ",
                  profile_step_start, " is not before --train-iters ", train_iters,
                  ": nothing would be profiled; lower --profile-step-start (Megatron's default is "
                  "10)");
  }
  require_utf8(to_json(), "");
}

// BigScience's --*-weighted-split-paths: the -path files read, the groups parsed (errors up
// front, on every rank), and BigScience's exclusions: --data-path and an explicit --split.
void TrainConfig::finalize_split_paths() {
  for (auto [which, groups, file] :
       {std::tuple{"train", &train_weighted_split_paths, &train_weighted_split_paths_path},
        std::tuple{"valid", &valid_weighted_split_paths, &valid_weighted_split_paths_path},
        std::tuple{"test", &test_weighted_split_paths, &test_weighted_split_paths_path}}) {
    const std::string flag = str("--", which, "-weighted-split-paths");
    if (!file->empty()) {
      TRIDENT_CHECK(groups->empty(), flag, " and ", flag,
                    "-path both give the groups; give one of them");
      *groups = data::read_weighted_split_paths_file(*file, flag + "-path");
    }
    (void)data::parse_weighted_split_paths(*groups, flag);
  }
  const bool any = !train_weighted_split_paths.empty() || !valid_weighted_split_paths.empty() ||
                   !test_weighted_split_paths.empty();
  if (!any) return;
  TRIDENT_CHECK(!train_weighted_split_paths.empty(),
                "--valid-weighted-split-paths / --test-weighted-split-paths need "
                "--train-weighted-split-paths (BigScience's data option 2 starts from the training "
                "group)");
  TRIDENT_CHECK(data_path.empty() && train_data_path.empty() && valid_data_path.empty() &&
                    test_data_path.empty() && !given.contains("--split"),
                "--data-path/--split (or --train/valid/test-data-path) and "
                "--train/valid/test-weighted-split-paths are mutually exclusive (BigScience's "
                "\"Mode 1\" and \"Mode 2\" of data loading); use one or the other");
}

// --model presets, positions, norms, grouped-query attention, recomputation, the chunked head.
void TrainConfig::finalize_model() {
  TRIDENT_CHECK(model_preset == "gpt" || model_preset == "bloom" || model_preset == "llama",
                "--model: unknown model '", model_preset, "' (use gpt, bloom or llama)");
  if (model_preset == "bloom") {
    position_embedding_type = "alibi";
    model.embed_layernorm = true;
  }
  if (model_preset == "llama") {
    position_embedding_type = "rope";
    normalization = "RMSNorm";
    model.swiglu = true;
    model.untie_embeddings_and_output_weights = true;
    model.add_bias_linear = false;
  }
  TRIDENT_CHECK(position_embedding_type == "learned_absolute" ||
                    position_embedding_type == "alibi" || position_embedding_type == "rope",
                "--position-embedding-type: unknown type '", position_embedding_type,
                "' (use learned_absolute, alibi or rope)");
  TRIDENT_CHECK(normalization == "LayerNorm" || normalization == "RMSNorm",
                "--normalization: unknown value '", normalization, "' (use LayerNorm or RMSNorm)");
  model.normalization = normalization == "RMSNorm" ? model::Normalization::kRmsNorm
                                                   : model::Normalization::kLayerNorm;
  TRIDENT_CHECK(rotary_percent == 1.0, "--rotary-percent ", rotary_percent,
                " is not supported: trident rotates whole heads (use 1.0)");
  TRIDENT_CHECK(group_query_attention || model.num_query_groups == 0 ||
                    model.num_query_groups == model.num_attention_heads,
                "--num-query-groups needs --group-query-attention (as Megatron)");
  TRIDENT_CHECK(!group_query_attention || model.num_query_groups > 0,
                "--group-query-attention needs --num-query-groups N (key/value heads)");
  if (!group_query_attention) model.num_query_groups = 0;
  TRIDENT_CHECK(recompute_granularity.empty() || recompute_granularity == "full" ||
                    recompute_granularity == "selective",
                "--recompute-granularity: unknown value '", recompute_granularity,
                "' (use full or selective)");
  TRIDENT_CHECK(recompute_method == "uniform" || recompute_method == "block",
                "--recompute-method: unknown value '", recompute_method,
                "' (use uniform or block)");
  model.recompute = recompute_granularity == "full"        ? model::Recompute::kFull
                    : recompute_granularity == "selective" ? model::Recompute::kSelective
                                                           : model::Recompute::kNone;
  model.recompute_block = recompute_method == "block";
  TRIDENT_CHECK(model.recompute_num_layers >= 1, "--recompute-num-layers must be >= 1");
  TRIDENT_CHECK(loss_chunk_rows >= -1,
                "--loss-chunk-rows must be -1 (auto), 0 (keep all the "
                "logits) or a number of rows, got ",
                loss_chunk_rows);
  TRIDENT_CHECK(model.recompute != model::Recompute::kFull || model.recompute_block ||
                    model.recompute_num_layers == 1,
                "--recompute-method uniform recomputes each layer from its own input in trident "
                "(Megatron's --recompute-num-layers 1); use --recompute-num-layers 1, or "
                "--recompute-method block to recompute only the first N layers of each stage");
  model.position_embedding = position_embedding_type == "alibi" ? model::PositionEmbedding::kAlibi
                             : position_embedding_type == "rope"
                                 ? model::PositionEmbedding::kRope
                                 : model::PositionEmbedding::kLearnedAbsolute;
  finalize_moe();
}

// Mixture of experts: the router's enum flags. Megatron reads them only with --num-experts, so a
// dense run accepts any value (as it did when they were no-ops).
void TrainConfig::finalize_moe() {
  if (model.num_experts > 0) {
    // Megatron-Core's check (TransformerConfig): a pattern has one entry per layer.
    const std::int64_t entries = static_cast<std::int64_t>(model.moe_layer_pattern.size());
    TRIDENT_CHECK(entries == 0 || entries == model.num_layers, "--moe-layer-freq ",
                  model::moe_layer_pattern_string(model.moe_layer_pattern), " has ", entries,
                  " entries; a pattern needs one per layer (--num-layers ", model.num_layers, ")");
    TRIDENT_CHECK(
        entries == 0 || std::find(model.moe_layer_pattern.begin(), model.moe_layer_pattern.end(),
                                  true) != model.moe_layer_pattern.end(),
        "--moe-layer-freq ", model::moe_layer_pattern_string(model.moe_layer_pattern),
        " makes no layer a mixture of experts; use --num-experts 0 for a dense model");
    TRIDENT_CHECK(moe_router_score_function == "softmax" || moe_router_score_function == "sigmoid",
                  "--moe-router-score-function: unknown or unsupported value '",
                  moe_router_score_function, "' (use softmax or sigmoid)");
    finalize_moe_groups();
    TRIDENT_CHECK(moe_token_drop_policy == "probs" || moe_token_drop_policy == "position",
                  "--moe-token-drop-policy: unknown value '", moe_token_drop_policy,
                  "' (use probs or position)");
    TRIDENT_CHECK(moe_router_load_balancing_type == "aux_loss" ||
                      moe_router_load_balancing_type == "seq_aux_loss" ||
                      moe_router_load_balancing_type == "none",
                  "--moe-router-load-balancing-type: unknown or unsupported type '",
                  moe_router_load_balancing_type,
                  "' (use aux_loss, seq_aux_loss or none; sinkhorn, global_aux_loss and "
                  "quantile_balancing are not in trident)");
  }
  if (model.num_experts == 0) model.moe_router_num_groups = model.moe_router_group_topk = 0;
  model.moe_router_score_function = moe_router_score_function == "sigmoid"
                                        ? model::MoeScoreFunction::kSigmoid
                                        : model::MoeScoreFunction::kSoftmax;
  model.moe_token_drop_policy = moe_token_drop_policy == "position"
                                    ? model::MoeDropPolicy::kPosition
                                    : model::MoeDropPolicy::kProbs;
  model.moe_router_load_balancing_type =
      moe_router_load_balancing_type == "seq_aux_loss" ? model::MoeLoadBalancing::kSeqAuxLoss
      : moe_router_load_balancing_type == "none"       ? model::MoeLoadBalancing::kNone
                                                       : model::MoeLoadBalancing::kAuxLoss;
  // Megatron-Core takes a negative capacity factor for none (dropless), trident's 0.
  if (model.moe_expert_capacity_factor < 0) model.moe_expert_capacity_factor = 0;
}

// Group-limited routing's limits, as Megatron-Core's (kernels/moe.h checks them again).
void TrainConfig::finalize_moe_groups() {
  const std::int64_t G = model.moe_router_num_groups, g = model.moe_router_group_topk,
                     E = model.num_experts, k = model.moe_router_topk;
  // No groups (Megatron: None), or one group holding every expert (the same routing). A group
  // top-k without groups, or a negative value, is refused below rather than ignored.
  if ((G == 0 && g == 0) || (G == 1 && (g == 0 || g == 1))) {
    model.moe_router_num_groups = model.moe_router_group_topk = 0;
    return;
  }
  TRIDENT_CHECK(G > 1 && g >= 1, "--moe-router-num-groups ", G, " and --moe-router-group-topk ", g,
                ": group-limited routing needs both, at least 2 groups and 1 chosen");
  TRIDENT_CHECK(G <= kernels::kMoeMaxGroups && E % G == 0, "--moe-router-num-groups ", G,
                " must divide --num-experts ", E, " (and be at most ", kernels::kMoeMaxGroups, ")");
  TRIDENT_CHECK(g <= G && k % g == 0 && k <= g * (E / G), "--moe-router-group-topk ", g,
                " must be at most --moe-router-num-groups ", G, ", divide --moe-router-topk ", k,
                ", and its groups must hold ", k, " experts (", E / G, " per group)");
}

// Layout sizes, ZeRO, offload, sequence parallelism and the pipeline schedule.
// Context parallelism's limits (docs/long-context.md). dp: the ranks left after tp x pp.
void TrainConfig::finalize_context_parallel(int dp) {
  TRIDENT_CHECK(context_parallel_size >= 1, "--context-parallel-size must be >= 1, got ",
                context_parallel_size);
  TRIDENT_CHECK(ds_sequence_parallel_size >= 1, "--ds-sequence-parallel-size must be >= 1, got ",
                ds_sequence_parallel_size);
  TRIDENT_CHECK(context_parallel_size == 1 || ds_sequence_parallel_size == 1,
                "--context-parallel-size ", context_parallel_size,
                " and --ds-sequence-parallel-size ", ds_sequence_parallel_size,
                " both split the sequence: choose one (the ring, or Ulysses' all-to-all)");
  const int cp = sequence_split();
  if (cp == 1) return;
  const std::string name = ulysses() ? "--ds-sequence-parallel-size" : "--context-parallel-size";
  const std::string flag = str(name, " ", cp);
  TRIDENT_CHECK(dp % cp == 0, flag, " must divide the ", dp,
                " ranks left after --tensor-model-parallel-size x --pipeline-model-parallel-size "
                "(the data-parallel size is world size / (tp x pp x ",
                cp, "))");
  TRIDENT_CHECK(model.seq_length % (2 * cp) == 0, "--seq-length (", model.seq_length,
                ") must be divisible by 2 x ", name, " (", 2 * cp, "): each rank holds 2 of the ",
                2 * cp, " equal chunks (the load-balanced causal split)");
  if (ulysses()) {
    const int heads = static_cast<int>(model.num_attention_heads / tensor_model_parallel_size);
    TRIDENT_CHECK(heads % cp == 0, flag, ": the ", heads,
                  " attention heads of a tensor-parallel rank (--num-attention-heads / "
                  "--tensor-model-parallel-size) must be divisible by it: each rank attends "
                  "with heads / ",
                  cp, " of them over the whole sequence");
  }
  // The ring runs flash blocks merged by their log-sum-exp: the fused core (Megatron-Core's
  // context parallelism needs flash attention too), as if --use-flash-attn were given.
  model.use_flash_attention = true;
  TRIDENT_CHECK(!model.documents(), flag,
                " with --reset-position-ids / --reset-attention-mask is not supported yet (a "
                "document can start in any chunk); drop those flags or use ",
                name, " 1");
  TRIDENT_CHECK(model.num_experts == 0, flag,
                " with a mixture-of-experts model is not supported yet (the router's "
                "auxiliary losses would need the cp group's token counts); use ",
                name, " 1");
  TRIDENT_CHECK(!(sequence_parallel && tensor_model_parallel_size > 1 &&
                  (micro_batch_size * model.seq_length / cp) % tensor_model_parallel_size != 0),
                "--sequence-parallel: micro-batch x seq-length / ", name, " (",
                micro_batch_size * model.seq_length / cp,
                " rows) must be divisible by --tensor-model-parallel-size (",
                tensor_model_parallel_size, ")");
}

void TrainConfig::finalize_parallel(int world_size) {
  TRIDENT_CHECK(tensor_model_parallel_size >= 1 && pipeline_model_parallel_size >= 1,
                "parallel sizes must be >= 1");
  TRIDENT_CHECK(world_size % (tensor_model_parallel_size * pipeline_model_parallel_size) == 0,
                "world size ", world_size, " is not divisible by --tensor-model-parallel-size ",
                tensor_model_parallel_size, " x --pipeline-model-parallel-size ",
                pipeline_model_parallel_size);
  TRIDENT_CHECK(comm_timeout > 0, "--comm-timeout must be positive");
  if (use_distributed_optimizer && zero_stage == 0) zero_stage = 1;
  TRIDENT_CHECK(!(bf16 && fp16), "--bf16 and --fp16 exclude each other");
  // Expert parallelism: Megatron-Core's layout (parallel/layout.h), the experts over ep of the dp
  // ranks.
  const int ep = expert_model_parallel_size;
  const int dp = world_size / (tensor_model_parallel_size * pipeline_model_parallel_size);
  TRIDENT_CHECK(ep >= 1, "--expert-model-parallel-size must be >= 1, got ", ep);
  if (ep > 1) {
    TRIDENT_CHECK(model.num_experts > 0, "--expert-model-parallel-size ", ep,
                  " needs a mixture-of-experts model (--num-experts)");
    TRIDENT_CHECK(model.num_experts % ep == 0, "--num-experts (", model.num_experts,
                  ") must be divisible by --expert-model-parallel-size (", ep,
                  "): each expert-parallel rank holds num_experts / ep experts");
    TRIDENT_CHECK(dp % ep == 0, "--expert-model-parallel-size ", ep,
                  " must divide the data-parallel size ", dp, " (", world_size, " ranks / (tp ",
                  tensor_model_parallel_size, " x pp ", pipeline_model_parallel_size,
                  ")): the experts are split over data-parallel ranks, as in Megatron-Core");
  }
  finalize_context_parallel(dp);
  // The mixture-of-experts layer's limits (docs/moe.md).
  if (model.num_experts > 0) {
    // Each expert is tensor-parallel as the dense MLP (Megatron's expert tensor parallelism =
    // tensor parallelism): its F split over the tp ranks.
    TRIDENT_CHECK(model.moe_ffn() % tensor_model_parallel_size == 0, "--moe-ffn-hidden-size (",
                  model.moe_ffn(), ") must be divisible by --tensor-model-parallel-size (",
                  tensor_model_parallel_size, ")");
    TRIDENT_CHECK(model.moe_shared_expert_intermediate_size % tensor_model_parallel_size == 0,
                  "--moe-shared-expert-intermediate-size (",
                  model.moe_shared_expert_intermediate_size,
                  ") must be divisible by --tensor-model-parallel-size (",
                  tensor_model_parallel_size, "): the shared experts are split as the dense MLP");
  }
  TRIDENT_CHECK(zero_stage >= 0 && zero_stage <= 3, "--zero-stage must be 0, 1, 2 or 3, got ",
                zero_stage);
  TRIDENT_CHECK(ddp_bucket_size > 0, "--ddp-bucket-size must be positive");
  finalize_offload();
  if (sequence_parallel && tensor_model_parallel_size == 1)
    sequence_parallel = false;  // as Megatron
  TRIDENT_CHECK(
      !sequence_parallel || (micro_batch_size * model.seq_length) % tensor_model_parallel_size == 0,
      "--sequence-parallel splits the micro-batch's ", micro_batch_size, " x ", model.seq_length,
      " tokens across --tensor-model-parallel-size ", tensor_model_parallel_size,
      ": they must divide evenly");
  if (num_layers_per_virtual_pipeline_stage > 0) {
    TRIDENT_CHECK(pipeline_schedule == "interleaved" || pipeline_schedule == "1f1b",
                  "--num-layers-per-virtual-pipeline-stage needs the interleaved schedule");
    pipeline_schedule = "interleaved";
    TRIDENT_CHECK(pipeline_model_parallel_size > 1,
                  "--num-layers-per-virtual-pipeline-stage "
                  "needs --pipeline-model-parallel-size > 1");
    TRIDENT_CHECK(
        model.num_layers % (num_layers_per_virtual_pipeline_stage * pipeline_model_parallel_size) ==
            0,
        "--num-layers (", model.num_layers,
        ") must be divisible by "
        "--num-layers-per-virtual-pipeline-stage (",
        num_layers_per_virtual_pipeline_stage, ") x --pipeline-model-parallel-size (",
        pipeline_model_parallel_size, ")");
  }
  TRIDENT_CHECK(pipeline_schedule != "interleaved" || num_layers_per_virtual_pipeline_stage > 0,
                "--pipeline-schedule interleaved needs --num-layers-per-virtual-pipeline-stage");
}

// --offload-optimizer / --offload-params and their path, window and I/O.
void TrainConfig::finalize_offload() {
  offload.device = optim::parse_offload_device(offload_optimizer);
  offload.io = optim::parse_offload_io(offload_io);
  offload.direct = !offload_buffered;
  TRIDENT_CHECK(offload_window_mib >= 0.1, "--offload-window-mib must be >= 0.1, got ",
                offload_window_mib);
  offload.window_bytes = static_cast<std::int64_t>(offload_window_mib * 1024 * 1024);
  TRIDENT_CHECK(offload_params == "none" || offload_params == "nvme",
                "--offload-params must be none or nvme, got '", offload_params, "'");
  const bool params_nvme = offload_params == "nvme";
  TRIDENT_CHECK(!params_nvme || zero_stage == 3, "--offload-params nvme needs --zero-stage 3 (got ",
                zero_stage,
                "): only ZeRO-3 shards the weights, stages 0-2 keep them whole on every rank; add "
                "--zero-stage 3 or drop --offload-params");
  const bool any_nvme = offload.device == optim::OffloadDevice::kNvme || params_nvme;
  TRIDENT_CHECK(offload.device != optim::OffloadDevice::kNvme || !offload.path.empty(),
                "--offload-optimizer nvme needs --offload-path DIR (a directory on the disk that "
                "holds the optimizer state)");
  TRIDENT_CHECK(!params_nvme || !offload.path.empty(),
                "--offload-params nvme needs --offload-path DIR (a directory on the disk that "
                "holds the parameter shards)");
  TRIDENT_CHECK(any_nvme || offload.path.empty(),
                "--offload-path is given but --offload-optimizer "
                "is ",
                offload_optimizer, " and --offload-params is ", offload_params,
                ": add --offload-optimizer nvme and/or --offload-params nvme");
  TRIDENT_CHECK(!(async_save && any_nvme),
                "--async-save copies the optimizer state and weights into host memory, which "
                "--offload-optimizer/--offload-params nvme keep on disk: drop --async-save (saves "
                "then stream from the offload files)");
}

// Batch sizes, training length and the learning-rate schedule (in samples, as Megatron).
void TrainConfig::finalize_schedule(int dp) {
  lr.decay_style = optim::parse_lr_decay_style(lr_decay_style);
  TRIDENT_CHECK(micro_batch_size > 0, "--micro-batch-size must be positive, got ",
                micro_batch_size);
  if (!step_batch_size_schedule.empty()) {
    // Megatron-LM: the schedule excludes --rampup-batch-size and --decrease-batch-size-if-needed,
    // and sets the global batch size (evaluation, --lr-*-iters in samples) to micro x dp.
    TRIDENT_CHECK(rampup_batch_size.empty(),
                  "give --step-batch-size-schedule or --rampup-batch-size, not both");
    TRIDENT_CHECK(!decrease_batch_size_if_needed,
                  "--step-batch-size-schedule cannot be combined with "
                  "--decrease-batch-size-if-needed (as in Megatron-LM)");
    step_schedule =
        data::parse_step_batch_size_schedule(step_batch_size_schedule, model.seq_length);
    const std::int64_t last = step_schedule.back().batch_size;
    if (global_batch_size != 0) {
      TRIDENT_CHECK(global_batch_size == last, "--global-batch-size ", global_batch_size,
                    " with --step-batch-size-schedule, whose last batch size is ", last,
                    ": Megatron-LM refuses the two together; drop --global-batch-size (then "
                    "micro x data-parallel, as Megatron-LM) or make it ",
                    last);
      warnings.push_back(
          str("--global-batch-size ", global_batch_size,
              " with --step-batch-size-schedule: Megatron-LM refuses the pair; trident accepts it "
              "because it equals the schedule's last batch size, and uses it where Megatron uses "
              "--global-batch-size (evaluation batches, --lr-*-iters converted to samples); "
              "without it those use micro x data-parallel = ",
              micro_batch_size * dp));
    }
  }
  if (global_batch_size == 0) global_batch_size = micro_batch_size * dp;
  TRIDENT_CHECK(global_batch_size % (micro_batch_size * dp) == 0, "--global-batch-size (",
                global_batch_size, ") must be a multiple of --micro-batch-size (", micro_batch_size,
                ") x data-parallel size (", dp, ")");
  TRIDENT_CHECK(rampup_batch_size.empty() || rampup_batch_size.size() == 3,
                "--rampup-batch-size takes START INCREMENT SAMPLES");
  // The schedule, counted in samples as Megatron's OptimizerParamScheduler counts it.
  TRIDENT_CHECK(train_iters >= 0 && train_samples >= 0 && train_tokens >= 0,
                "--train-iters / --train-samples / --train-tokens must be positive");
  TRIDENT_CHECK(train_iters == 0 || train_samples == 0,
                "give --train-iters or --train-samples, not both");
  TRIDENT_CHECK(lr.warmup_iters >= 0 && lr_warmup_samples >= 0, "warm-up must be >= 0");
  TRIDENT_CHECK(lr_warmup_fraction < 0 || (lr.warmup_iters == 0 && lr_warmup_samples == 0),
                "give one of --lr-warmup-fraction and --lr-warmup-iters / --lr-warmup-samples");
  TRIDENT_CHECK(lr_warmup_fraction < 0 || lr_warmup_fraction <= 1,
                "--lr-warmup-fraction must be in [0, 1]");
  optim::LrSchedule s = lr;
  s.decay_style = lr.decay_style;
  if (train_samples > 0) {
    TRIDENT_CHECK(lr.warmup_iters == 0 && lr.decay_iters == 0,
                  "with --train-samples give the schedule in samples (--lr-warmup-samples, "
                  "--lr-decay-samples or --lr-warmup-fraction), not iterations");
    train_iters = train_iters_from_samples(*this, dp);
    TRIDENT_CHECK(train_iters > 0, "--train-samples ", train_samples,
                  " is less than one global batch");
    s.decay_iters = static_cast<double>(lr_decay_samples > 0 ? lr_decay_samples : train_samples);
    s.warmup_iters = lr_warmup_fraction >= 0 ? lr_warmup_fraction * s.decay_iters
                                             : static_cast<double>(lr_warmup_samples);
  } else {
    TRIDENT_CHECK(lr_warmup_samples == 0 && lr_decay_samples == 0,
                  "--lr-warmup-samples / --lr-decay-samples need --train-samples (or give "
                  "--lr-warmup-iters / --lr-decay-iters)");
    if (train_iters == 0) train_iters = 100;
    if (lr.decay_iters == 0) lr.decay_iters = static_cast<double>(train_iters);
    const double gbs = static_cast<double>(global_batch_size);
    s.decay_iters = lr.decay_iters * gbs;
    s.warmup_iters =
        lr_warmup_fraction >= 0 ? lr_warmup_fraction * s.decay_iters : lr.warmup_iters * gbs;
  }
  lr_steps = s;
  TRIDENT_CHECK(lr.lr >= 0 && lr.min_lr >= 0 && lr.min_lr <= lr.lr, "--min-lr (", lr.min_lr,
                ") must be between 0 and --lr (", lr.lr, ")");
  TRIDENT_CHECK(lr_steps.decay_iters >= lr_steps.warmup_iters,
                "the decay (--lr-decay-iters / --lr-decay-samples) must be at least the warm-up");
  TRIDENT_CHECK(lr_warmup_tokens < 0 || lr_decay_tokens > 0,
                "--lr-warmup-tokens needs --lr-decay-tokens (Megatron-DeepSpeed)");
  TRIDENT_CHECK(lr_decay_tokens == 0 || lr_warmup_tokens <= lr_decay_tokens,
                "--lr-decay-tokens must be at least --lr-warmup-tokens");
  TRIDENT_CHECK(optimizer.beta1 >= 0 && optimizer.beta1 < 1, "--adam-beta1 must be in [0, 1)");
  TRIDENT_CHECK(optimizer.beta2 >= 0 && optimizer.beta2 < 1, "--adam-beta2 must be in [0, 1)");
  TRIDENT_CHECK(optimizer.eps > 0, "--adam-eps must be positive");
  TRIDENT_CHECK(optimizer.clip_grad >= 0, "--clip-grad must be >= 0");
  optimizer.kind = optim::parse_optimizer(optimizer_type);
  TRIDENT_CHECK(optimizer.lion_beta1 >= 0 && optimizer.lion_beta1 <= 1,
                "--lion-beta1 must be in [0, 1]");
  TRIDENT_CHECK(optimizer.lion_beta2 >= 0 && optimizer.lion_beta2 <= 1,
                "--lion-beta2 must be in [0, 1]");
  TRIDENT_CHECK(optimizer.weight_decay >= 0, "--weight-decay must be >= 0");
}

nlohmann::json TrainConfig::to_json() const {
  // Every setting under its flag's key, from the declarations the flags come from (Settings; the
  // options go to a scratch app that never parses, so *this is only read).
  nlohmann::json j;
  CLI::App scratch;
  Settings settings(scratch, &j);
  add_setting_options(settings, const_cast<TrainConfig&>(*this));
  // The architecture's keys (one list: ckpt/model_config_json.cc) as the checkpoint resolves them
  // (--ffn-hidden-size 0 is 4 x hidden, the position embedding by its name).
  j.update(ckpt::model_config_to_json(model));
  // Values the run derived from its settings.
  j["optimizer"] = optim::optimizer_name(optimizer.kind);
  // Iteration counts (Megatron's are ints) as integers when they are whole.
  const auto count = [](double x) {
    return x == std::floor(x) && std::abs(x) < 0x1p53 ? nlohmann::json(static_cast<std::int64_t>(x))
                                                      : nlohmann::json(x);
  };
  j["lr_warmup_iters"] = count(lr.warmup_iters);
  j["lr_decay_iters"] = count(lr.decay_iters);
  j["lr_warmup_steps_in_samples"] = lr_steps.warmup_iters;
  j["lr_decay_steps_in_samples"] = lr_steps.decay_iters;
  return j;
}

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  // The shortest digits that read back as x, in scientific form: "-1.2345e-08".
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  TRIDENT_ASSERT(ec == std::errc(), "to_chars failed");
  const std::string sci(buf, end);
  const std::size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const bool negative = !mantissa.empty() && mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char ch : mantissa)
    if (ch != '.') digits += ch;
  // x = 0.DIGITS x 10^decpt (dtoa's decimal point position), as Python's float_repr_style
  // 'short' uses it: exponent notation when decpt <= -4 or decpt > 16, else fixed with ".0".
  const int decpt = std::stoi(sci.substr(e + 1)) + 1;
  const int n = static_cast<int>(digits.size());
  std::string out = negative ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    const int exp10 = decpt - 1;
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += ebuf;
  } else if (decpt <= 0) {
    out += "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(static_cast<std::size_t>(decpt - n), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." +
           digits.substr(static_cast<std::size_t>(decpt));
  }
  return out;
}

namespace {

// A setting's value as Megatron's argument table prints it (Python's str of the argparse value):
// floats as repr (0.9, 1e-08), booleans True / False, lists ['a', 'b'], null None.
std::string python_value(const nlohmann::json& v, bool in_list = false) {
  if (v.is_string()) return in_list ? "'" + v.get<std::string>() + "'" : v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_number_float()) return python_float_repr(v.get<double>());
  if (v.is_array()) {
    std::string s = "[";
    for (const nlohmann::json& x : v) s += (s.size() > 1 ? ", " : "") + python_value(x, true);
    return s + "]";
  }
  return v.dump();
}

}  // namespace

std::string TrainConfig::arguments_table() const {
  const nlohmann::json j = to_json();  // keys sorted
  std::string s = "------------------------ arguments ------------------------\n";
  for (const auto& [k, v] : j.items()) {
    const std::string value = python_value(v);
    s += "  " + k + " " + std::string(k.size() < 48 ? 48 - k.size() : 1, '.') + " " + value + "\n";
  }
  for (const auto& [k, v] : compat) {
    std::string value;
    for (const std::string& x : v) value += (value.empty() ? "" : " ") + x;
    s += "  " + k + " " + std::string(k.size() < 48 ? 48 - k.size() : 1, '.') + " " +
         (value.empty() ? "True" : value) + "   [" +
         (find_compat_flag(k)->status == FlagStatus::kRefused
              ? "accepted value"
              : flag_status_name(find_compat_flag(k)->status)) +
         "]\n";
  }
  s += "-------------------- end of arguments ---------------------";
  return s;
}

}  // namespace trident::train
