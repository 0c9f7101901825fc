#include "trident/train/compat_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <unordered_set>

#include "trident/core/error.h"
#include "trident/train/train_config.h"

namespace trident::train {

namespace {

using core::str;

constexpr CompatFlag kTable[] = {
#include "trident/train/megatron_flags_table.inc"
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

std::string one(const std::string& flag, const std::vector<std::string>& v) {
  TRIDENT_CHECK(v.size() == 1, flag, " takes one value, got '", joined(v), "'");
  return v[0];
}

std::int64_t to_int(const std::string& flag, const std::vector<std::string>& v) {
  const std::string s = strip_digit_underscores(one(flag, v));
  std::size_t pos = 0;
  std::int64_t x = 0;
  try {
    x = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  TRIDENT_CHECK(pos == s.size() && !s.empty(), flag, ": '", s, "' is not an integer");
  return x;
}

double to_double(const std::string& flag, const std::vector<std::string>& v) {
  const std::string s = strip_digit_underscores(one(flag, v));
  std::size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  TRIDENT_CHECK(pos == s.size() && !s.empty(), flag, ": '", s, "' is not a number");
  return x;
}

[[noreturn]] void refuse(const CompatFlag& f, const std::vector<std::string>& v) {
  throw core::InvalidArgument(str(f.name, v.empty() ? "" : " ", joined(v),
                                  ": not supported by trident (", f.note,
                                  "); remove it from the launch script. See docs/flags.md"));
}

// Mixture-of-experts settings Megatron and Megatron-DeepSpeed read only in a model with experts:
// refused there (their notes say why), accepted in a dense run, whose model they leave as it is
// (dense launch scripts often carry them).
bool moe_only(std::string_view name) {
  static constexpr std::string_view kMoeOnly[] = {
      "--moe-train-capacity-factor",
      "--moe-eval-capacity-factor",
      "--moe-min-capacity",
      "--mlp-type",
      "--use-tutel",
      "--expert-parallel",
      "--moe-router-topk-limited-devices",
      "--moe-input-jitter-eps",
      "--moe-router-force-load-balancing",
      "--moe-router-force-biased",
      "--moe-apply-probs-on-input",
      "--moe-latent-size",
      "--moe-router-dtype",
      "--moe-token-dropping",
      "--moe-router-type",
      "--moe-expert-rank-capacity-factor",
      "--moe-dispatch-fwd-dtype",
      "--moe-combine-bwd-dtype",
  };
  return std::find(std::begin(kMoeOnly), std::end(kMoeOnly), name) != std::end(kMoeOnly);
}

// Refused flags that are accepted with the value that says what trident does anyway.
bool accepted_value(const TrainConfig& c, std::string_view name,
                    const std::vector<std::string>& v) {
  if (c.model.num_experts == 0 && moe_only(name)) return true;
  auto is = [&](std::initializer_list<const char*> ok) {
    if (v.size() != 1) return false;
    for (const char* o : ok)
      if (v[0] == o) return true;
    return false;
  };
  auto is_num = [&](double want) {
    if (v.size() != 1) return false;
    try {
      return std::stod(strip_digit_underscores(v[0])) == want;
    } catch (const std::exception&) {
      return false;
    }
  };
  if (name == "--data-impl") return is({"mmap", "infer"});
  if (name == "--softmax-type") return is({"vanilla"});
  if (name == "--remote-device") return is({"none"});
  if (name == "--mlp-type") return is({"standard"});
  if (name == "--recompute-modules") return is({"core_attn"});
  if (name == "--weight-decay-incr-style" || name == "--wd-incr-style") return is({"constant"});
  if (name == "--main-grads-dtype" || name == "--main-params-dtype" || name == "--exp-avg-dtype" ||
      name == "--exp-avg-sq-dtype")
    return is({"fp32"});
  if (name == "--cp-comm-type") return is({"p2p"});
  if (name == "--num-distributed-optimizer-instances") return is_num(1);
  // Each expert is split over the tensor-parallel ranks, as Megatron-Core's default
  // (--expert-tensor-parallel-size = --tensor-model-parallel-size).
  if (name == "--expert-tensor-parallel-size") {
    return is_num(static_cast<double>(c.tensor_model_parallel_size));
  }
  // DeepSpeed-MoE's capacities are unused when it drops no tokens.
  if (name == "--moe-train-capacity-factor" || name == "--moe-eval-capacity-factor" ||
      name == "--moe-min-capacity")
    return c.compat.contains("--disable-moe-token-dropping");
  if (name == "--moe-router-dtype") return is({"fp32"});
  if (name == "--moe-dispatch-fwd-dtype" || name == "--moe-combine-bwd-dtype") return is({"bf16"});
  if (name == "--sample-rate") return is_num(1.0);
  if (name == "--start-weight-decay" || name == "--end-weight-decay" || name == "--start-wd" ||
      name == "--end-wd")
    return is_num(c.optimizer.weight_decay);
  if (name == "--kv-channels") {
    return c.model.num_attention_heads > 0 &&
           is_num(static_cast<double>(c.model.hidden_size / c.model.num_attention_heads)) &&
           c.model.hidden_size % c.model.num_attention_heads == 0;
  }
  if (name == "--microbatch-group-size-per-virtual-pipeline-stage")
    return is_num(c.pipeline_model_parallel_size);
  if (name == "--glu-linear-offset") return is_num(0.0);
  return false;
}

void apply_mapped(TrainConfig& c, const CompatFlag& f, const std::vector<std::string>& v) {
  const std::string n(f.name);
  if (n == "--checkpoint-activations") {
    c.recompute_granularity = "full";
    c.recompute_method = "uniform";
    c.model.recompute_num_layers = 1;
  } else if (n == "--recompute-activations") {
    c.recompute_granularity = "selective";
  } else if (n == "--activations-checkpoint-method" || n == "--checkpoint-method") {
    c.recompute_method = one(n, v);
  } else if (n == "--activations-checkpoint-num-layers" || n == "--checkpoint-num-layers") {
    c.model.recompute_num_layers = to_int(n, v);
  } else if (n == "--checkpoint-granularity") {
    c.recompute_granularity = one(n, v);
  } else if (n == "--override-lr-scheduler" || n == "--override-opt_param-scheduler" ||
             n == "--override-opt-param-scheduler" || n == "--no-load-lr-state") {
    // trident's schedule always comes from the flags.
  } else if (n == "--no-pipeline-parallel") {
    c.no_pipeline_parallel = true;
  } else if (n == "--model-parallel-size") {
    c.tensor_model_parallel_size = static_cast<int>(to_int(n, v));
  } else if (n == "--moe-expert-parallel-size") {
    c.expert_model_parallel_size = static_cast<int>(to_int(n, v));
  } else if (n == "--batch-size") {
    c.micro_batch_size = to_int(n, v);
  } else if (n == "--warmup") {
    c.lr_warmup_fraction = to_double(n, v);
  } else if (n == "--dataloader_type") {
    c.dataloader_type = one(n, v);
  } else if (n == "--min-scale") {
    c.min_loss_scale = to_double(n, v);
  } else if (n == "--virtual-pipeline-model-parallel-size" ||
             n == "--num-virtual-stages-per-pipeline-rank") {
    c.virtual_pipeline_model_parallel_size = to_int(n, v);
  } else if (n == "--distributed-timeout-minutes") {
    c.comm_timeout = 60.0 * to_double(n, v);
  } else if (n == "--deepscale") {
    c.deepspeed = true;
  } else if (n == "--deepscale_config") {
    c.deepspeed_config = one(n, v);
  } else if (n == "--zero-reduce-bucket-size" || n == "--zero-allgather-bucket-size") {
    c.ddp_bucket_size = to_int(n, v);
  } else if (n == "--pp-partition-method") {
    const std::string m = one(n, v);
    if (m != "type:transformer") {
      c.warnings.push_back(str(n, " ", m,
                               ": trident splits the transformer layers evenly over the stages "
                               "(type:transformer; use --decoder-first/last-pipeline-num-layers "
                               "to move layers)"));
    }
  } else if (n == "--kill-switch-file") {
    c.kill_switch_path = one(n, v);
  } else if (n == "--exit-signal-handler-for-training") {
    c.exit_signal_handler = true;
  } else if (n == "--exit-signal") {
    const std::string sig = one(n, v);
    if (sig != "SIGTERM" && sig != "SIGUSR1" && sig != "signal.SIGTERM" &&
        sig != "signal.SIGUSR1") {
      c.warnings.push_back(str(n, " ", sig,
                               ": trident's --exit-signal-handler catches SIGTERM and SIGUSR1 "
                               "only; send one of those"));
    }
  } else if (n == "--use-rotary-position-embeddings") {
    c.position_embedding_type = "rope";
  } else if (n == "--num-key-value-heads") {
    c.group_query_attention = true;
    c.model.num_query_groups = to_int(n, v);
  } else if (n == "--rotary-position-embeddings-theta") {
    c.model.rotary_base = to_double(n, v);
  } else if (n == "--norm-epsilon") {
    c.model.layernorm_epsilon = to_double(n, v);
  } else if (n == "--decoder-num-layers") {
    c.model.num_layers = to_int(n, v);
  } else if (n == "--use-flash-attn-v1" || n == "--use-flash-attn-v2" ||
             n == "--use-flash-attn-triton" || n == "--use-flash-attn-builder") {
    c.model.use_flash_attention = true;
  } else if (n == "--exit-on-missing-checkpoint") {
    c.exit_on_missing_checkpoint = true;
  } else if (n == "--encoder-num-layers") {
    // Megatron's validate_args: GPT's layers, unless --num-layers is given too (an error there).
    TRIDENT_CHECK(c.given.count("--num-layers") == 0,
                  "--encoder-num-layers with --num-layers: give one (Megatron refuses both: "
                  "'cannot have both num-layers and encoder-num-layers specified')");
    c.model.num_layers = to_int(n, v);
  } else if (n == "--encoder-seq-length") {
    TRIDENT_CHECK(c.given.count("--seq-length") == 0,
                  "--encoder-seq-length with --seq-length: give one (Megatron refuses both)");
    c.model.seq_length = to_int(n, v);
  } else if (n == "--padded-vocab-size") {
    c.pad_vocab_size_to = to_int(n, v);
  } else if (n == "--disable-log-loss-scale-to-tensorboard") {
    c.no_log_loss_scale_to_tensorboard = true;
  } else if (n == "--moe-frequency") {
    TRIDENT_CHECK(c.given.count("--moe-layer-freq") == 0,
                  "--moe-frequency with --moe-layer-freq: give one (--moe-frequency is "
                  "Megatron-LM's name of late 2023)");
    c.model.moe_layer_freq = to_int(n, v);
  } else if (n == "--topk" || n == "--moe-loss-coeff" || n == "--disable-moe-token-dropping" ||
             n == "--disable-moe-top2-2nd-expert-sampling" || n == "--expert-interval") {
    // Together, with Megatron-DeepSpeed's defaults: apply_deepspeed_moe.
  } else {
    throw core::Error(str("internal: mapped flag ", n, " has no mapping"));
  }
}

// Megatron-DeepSpeed's mixture of experts (DeepSpeed-MoE's gate) as trident's router, which is
// Megatron-Core's: its flags where the run is the same, its defaults where a launch script of it
// relies on them (they differ from Megatron-Core's), refusals where trident computes something
// else. Megatron-DeepSpeed reads them only with --num-experts > 1.
void apply_deepspeed_moe(TrainConfig& c) {
  const auto has = [&](const char* f) { return c.compat.contains(f); };
  const auto given = [&](const char* f) { return c.given.contains(f); };
  for (const auto& [ds, core] :
       {std::pair{"--topk", "--moe-router-topk"},
        {"--moe-loss-coeff", "--moe-aux-loss-coeff"},
        {"--expert-interval", "--moe-layer-freq"},
        {"--disable-moe-token-dropping", "--moe-expert-capacity-factor"}}) {
    TRIDENT_CHECK(!has(ds) || !given(core), ds, " with ", core, ": give one (", ds,
                  " is Megatron-DeepSpeed's, ", core, " Megatron-Core's)");
  }
  if (c.model.num_experts == 0) return;
  static constexpr const char* kDeepSpeedMoe[] = {
      "--topk",
      "--expert-interval",
      "--moe-loss-coeff",
      "--moe-train-capacity-factor",
      "--moe-eval-capacity-factor",
      "--moe-min-capacity",
      "--disable-moe-token-dropping",
      "--disable-moe-top2-2nd-expert-sampling",
      "--moe-expert-parallel-size",
      "--create-moe-param-group",
      "--mlp-type",
      "--enable-expert-tensor-parallelism",
      "--use-tutel",
  };
  if (std::none_of(std::begin(kDeepSpeedMoe), std::end(kDeepSpeedMoe), has)) {
    if (c.deepspeed) {
      c.warnings.push_back(
          str("--num-experts ", c.model.num_experts,
              " with --deepspeed: trident takes Megatron-Core's defaults for the flags not given "
              "(top-2 softmax router, experts in every layer, dropless, no load-balancing loss); "
              "Megatron-DeepSpeed's differ (--topk 1, --expert-interval 2, token dropping at "
              "--moe-train-capacity-factor 1.0, --moe-loss-coeff 0.1)"));
    }
    return;
  }
  // Experts per token: DeepSpeed's top-1 weight is the chosen expert's softmax probability
  // (Switch: Megatron-Core's pre-softmax); its top-2 weights are the two probabilities
  // renormalised (the softmax over the two, Megatron-Core's default), the top-k ones likewise.
  if (!given("--moe-router-topk")) {
    const std::int64_t k = has("--topk") ? to_int("--topk", c.compat.at("--topk")) : 1;
    c.model.moe_router_topk = k;
    if (k == 1) c.model.moe_router_pre_softmax = true;
    TRIDENT_CHECK(k != 2 || has("--disable-moe-top2-2nd-expert-sampling"),
                  "--topk 2: DeepSpeed-MoE draws each token's second expert with Gumbel noise, "
                  "trident's router takes the next-highest score; add "
                  "--disable-moe-top2-2nd-expert-sampling (DeepSpeed's argmax, the same run)");
  }
  // The load-balancing loss (the Switch loss, summed over the expert layers): Megatron-DeepSpeed's
  // default coefficient 0.1 unless one is given.
  if (!given("--moe-aux-loss-coeff")) {
    const double coeff = has("--moe-loss-coeff")
                             ? to_double("--moe-loss-coeff", c.compat.at("--moe-loss-coeff"))
                             : 0.1;
    const std::string which = has("--moe-loss-coeff")
                                  ? str("--moe-loss-coeff ", coeff)
                                  : "Megatron-DeepSpeed's default --moe-loss-coeff 0.1";
    TRIDENT_CHECK(coeff == 0 || c.model.moe_router_topk != 2, which,
                  " with top-2 routing: DeepSpeed-MoE's top-2 load-balancing loss counts the "
                  "first choices only, trident's (Megatron-Core's) both; give --moe-loss-coeff 0, "
                  "or --moe-aux-loss-coeff for Megatron-Core's loss");
    TRIDENT_CHECK(
        coeff == 0 || c.moe_router_load_balancing_type == "aux_loss", which,
        " is DeepSpeed-MoE's Switch loss (aux_loss), not --moe-router-load-balancing-type ",
        c.moe_router_load_balancing_type);
    c.model.moe_aux_loss_coeff = coeff;
  }
  // Expert layers: Megatron-DeepSpeed's layers N, 2N, ... counted from 1 (its
  // get_num_experts_per_layer: layer i + 1 divisible by N), i.e. 0-based N - 1, 2N - 1, ...:
  // every layer for N = 1 (--moe-layer-freq 1), otherwise that per-layer pattern.
  if (!given("--moe-layer-freq")) {
    const std::int64_t n = has("--expert-interval")
                               ? to_int("--expert-interval", c.compat.at("--expert-interval"))
                               : 2;
    TRIDENT_CHECK(n >= 1, "--expert-interval must be >= 1, got ", n);
    const std::int64_t layers = c.model.num_layers;
    TRIDENT_CHECK(n <= layers,
                  has("--expert-interval") ? str("--expert-interval ", n)
                                           : std::string("Megatron-DeepSpeed's default "
                                                         "--expert-interval 2"),
                  " with --num-layers ", layers,
                  ": no layer would have experts (Megatron-DeepSpeed puts them in layers ", n, ", ",
                  2 * n, ", ... counting from 1); give a smaller --expert-interval");
    c.model.moe_layer_freq = 1;
    c.model.moe_layer_pattern.clear();
    if (n > 1) {
      c.model.moe_layer_pattern.resize(static_cast<std::size_t>(layers));
      for (std::int64_t l = 0; l < layers; ++l) {
        c.model.moe_layer_pattern[static_cast<std::size_t>(l)] = (l + 1) % n == 0;
      }
    }
  }
  // Token dropping: DeepSpeed-MoE's capacity keeps at least --moe-min-capacity rows and drops at
  // random (top-1) or second choices before first (top-2): not Megatron-Core's policies.
  if (!given("--moe-expert-capacity-factor")) {
    TRIDENT_CHECK(has("--disable-moe-token-dropping"),
                  "Megatron-DeepSpeed's mixture of experts drops tokens by default (capacity "
                  "--moe-train-capacity-factor 1.0, at least --moe-min-capacity 4 rows per "
                  "expert, the dropped tokens drawn at random for top-1), which trident does not "
                  "reproduce: add --disable-moe-token-dropping (dropless), or give "
                  "--moe-expert-capacity-factor and --moe-token-drop-policy for Megatron-Core's "
                  "dropping");
    c.model.moe_expert_capacity_factor = 0;
  }
  c.warnings.push_back(
      "Megatron-DeepSpeed mixture of experts: trident draws the router's weights as every other "
      "weight (normal, --init-method-std, as Megatron-Core); DeepSpeed-MoE's torch.nn.Linear "
      "draws them uniform in +-1/sqrt(--hidden-size)");
}

}  // namespace

const char* flag_status_name(FlagStatus s) {
  switch (s) {
    case FlagStatus::kImplemented:
      return "implemented";
    case FlagStatus::kMapped:
      return "mapped";
    case FlagStatus::kNoOp:
      return "no-op";
    case FlagStatus::kNoOpDiffers:
      return "no-op, differs";
    case FlagStatus::kRefused:
      return "refused";
  }
  return "?";
}

std::span<const CompatFlag> megatron_flag_table() { return kTable; }

const CompatFlag* find_compat_flag(std::string_view name) {
  for (const CompatFlag& f : kTable)
    if (f.name == name) return &f;
  return nullptr;
}

std::string strip_digit_underscores(const std::string& s) {
  if (s.find('_') == std::string::npos) return s;
  for (char ch : s) {
    if (!std::isdigit(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.' && ch != 'e' &&
        ch != 'E' && ch != '+' && ch != '-')
      return s;
  }
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      const bool between = i > 0 && i + 1 < s.size() &&
                           std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
                           std::isdigit(static_cast<unsigned char>(s[i + 1]));
      if (!between) return s;  // Python refuses it too; let the parser report it
      continue;
    }
    out += s[i];
  }
  return out;
}

void add_compat_options(CLI::App& app, TrainConfig& cfg) {
  // The long names registered so far, looked up in a hash set: CLI11 2.1's get_option_no_throw
  // scans every option and copies each one's name list per call (detail::find_member takes the
  // vector by value), which made this loop quadratic in the ~1,150 flags (a third of a
  // registration's time, seconds under ASan). CLI11's own duplicate check in add_option is
  // quadratic the same way and stays: the way around it, CLI11 option groups of a few dozen flags,
  // changes what an empty argument means (CLI11 takes "" for the name of a nameless option group:
  // `trident train ... ""` was accepted, and the values of a many-valued flag ended at a ""; and a
  // run of them took seconds: found by fuzz_train_args).
  std::unordered_set<std::string> registered;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) registered.insert("--" + l);
  }
  for (const CompatFlag& f : kTable) {
    if (f.status == FlagStatus::kImplemented) continue;
    const std::string name(f.name);
    // A flag another part of trident registered itself (implemented there) wins.
    if (!registered.insert(name).second) continue;
    const std::string help = str("[", flag_status_name(f.status), "] ", f.meaning, ": ", f.note);
    auto store = [&cfg, name](const std::vector<std::string>& v) { cfg.compat[name] = v; };
    CLI::Option* o = nullptr;
    if (f.values == 0) {
      o = app.add_flag_callback(
          name, [&cfg, name] { cfg.compat[name] = {}; }, help);
    } else {
      o = app.add_option_function<std::vector<std::string>>(name, store, help);
      constexpr int kMany = CLI::detail::expected_max_vector_size;
      switch (f.values) {
        case -1:
          o->expected(1, kMany);
          break;
        case -2:
          o->expected(0, kMany);
          break;
        case -3:
          o->expected(0, 1);
          break;
        default:
          o->expected(f.values);
      }
      o->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    }
    o->group("Megatron / DeepSpeed compatibility (docs/flags.md)");
  }
}

void apply_compat_flags(TrainConfig& cfg) {
  // Refusals first, so that a refused flag is reported even next to a warning.
  for (const auto& [name, v] : cfg.compat) {
    const CompatFlag* f = find_compat_flag(name);
    TRIDENT_CHECK(f != nullptr, "internal: unknown compatibility flag ", name);
    if (f->status == FlagStatus::kRefused && !accepted_value(cfg, name, v)) refuse(*f, v);
  }
  for (const auto& [name, v] : cfg.compat) {
    const CompatFlag* f = find_compat_flag(name);
    if (f->status == FlagStatus::kMapped) apply_mapped(cfg, *f, v);
    if (f->status == FlagStatus::kNoOp) {
      cfg.warnings.push_back(str(name, v.empty() ? "" : " ", joined(v),
                                 ": accepted, no effect in trident (", f->note, ")"));
    }
    if (f->status == FlagStatus::kNoOpDiffers) {
      cfg.warnings.push_back(str(name, v.empty() ? "" : " ", joined(v),
                                 ": accepted, but the run differs from Megatron's: ", f->note));
    }
  }
  apply_deepspeed_moe(cfg);
}

void check_compat_combinations(const TrainConfig&) {
  // None at present: --add-qkv-bias with --disable-bias-linear, refused until the QKV bias could
  // be kept alone, is implemented (ModelConfig::add_qkv_bias).
}

// The review of the no-ops (issue 35), printed into docs/flags.md above the table.
constexpr const char* kNoOpReview =
    "## The no-ops, reviewed (issue 35)\n\n"
    "Each of the 820 flags that were no-ops was checked against one question: would a user of "
    "that flag get a different run from Megatron's without being told? (Megatron-LM's "
    "`arguments.py` and the code reading each setting, at d98e8a64; Megatron-DeepSpeed's for "
    "its flags.) 15 changed status, one more is refused in one combination, and 73 notes were "
    "corrected:\n\n"
    "- **4 now mapped**: `--encoder-num-layers` and `--encoder-seq-length` are GPT's "
    "`--num-layers` / `--seq-length` in Megatron when those are not given (trident used its "
    "defaults: another model); `--padded-vocab-size` (Megatron forks) = `--pad-vocab-size-to`; "
    "`--disable-log-loss-scale-to-tensorboard` = `--no-log-loss-scale-to-tensorboard`.\n"
    "- **3 now refused**, and one refused in combination: `--ckpt-convert-format` (Megatron "
    "converts the checkpoint and exits without training; trident trained), `--no-rope-freq` "
    "(Megatron skips RoPE in some layers), `--glu-linear-offset` other than 0 (an offset in "
    "SwiGLU, which trident now has); `--add-qkv-bias` with `--disable-bias-linear` (Megatron "
    "keeps the QKV bias alone; alone the flag stays a no-op, trident's QKV has a bias). Since "
    "implemented: `--add-qkv-bias` keeps the QKV bias with `--disable-bias-linear` (Qwen2, "
    "Qwen2-MoE).\n"
    "- **8 now warn what differs** (`no-op, differs`): `--no-bias-gelu-fusion` and `--onnx-safe` "
    "(Megatron switches to the exact erf GeLU, trident keeps the tanh approximation: up to 4.7e-4 "
    "per value), `--allow-ambiguous-pad-tokens` (Megatron masks the loss on labels equal to a "
    "pad id shared with end-of-document), `--fp16-lm-cross-entropy` (FP16 loss in Megatron), "
    "`--non-persistent-save-interval` (extra checkpoints Megatron writes and resumes from), "
    "`--save-retain-interval` (which checkpoints stay on disk), `--no-save-optim` and "
    "`--no-save-rng` (Megatron's checkpoints then lack that state, so its resume restarts "
    "it).\n"
    "- **Notes corrected, still no-ops**: the 67 MLA / DSA / Mamba / MTP / YaRN / muP settings "
    "said RoPE models were refused (RoPE is implemented; none of these is read by a RoPE model), "
    "`--no-rope-fusion` is a kernel switch, `--ckpt-convert-save` only goes with the refused "
    "`--ckpt-convert-format`, and the four `--save-*-interval` dumps are debugging output, not "
    "checkpoint format.\n"
    "- **805 stay no-ops** (`--add-qkv-bias` alone among them, implemented since), because "
    "Megatron's run with the "
    "flag is trident's run: GPU kernel, "
    "fusion, memory and communication switches (the same mathematics), inference / RL serving "
    "settings, settings read only by refused features (mixture of experts, MLA, Mamba, MTP, "
    "FP8/FP4, distillation, Muon, FIM, RL) or by Megatron's other models (BERT, T5, vision, "
    "RETRO), checkpoint formats and asynchronous-save tuning, logging, telemetry and profiling "
    "outputs, data-loader and data-parallel tuning, and flags asking for what trident always "
    "does (FP32 softmax, residual stream and gradient reduction, the tanh GeLU, full "
    "checkpoints).\n\n";

// The mixture-of-experts flags (issue 33), printed into docs/flags.md after the review: the
// no-ops of the review that said "trident refuses experts" changed with the layer.
constexpr const char* kMoeReview =
    "## The mixture-of-experts flags (issue 33)\n\n"
    "With the mixture-of-experts layer (docs/moe.md), `--num-experts` (refused before) is "
    "implemented and 40 of the no-ops above changed status: 12 of Megatron-Core's `--moe-*` "
    "settings are implemented; 6 flags are mapped (Megatron-DeepSpeed's `--topk`, "
    "`--moe-loss-coeff`, `--disable-moe-token-dropping`, `--disable-moe-top2-2nd-expert-sampling` "
    "and `--expert-interval`, each where its run is trident's, and Megatron-LM's "
    "`--moe-frequency`); "
    "22 are refused, because trident does not build what they ask for or computes something else "
    "(shared experts, the expert bias, group-limited routing, DeepSpeed-MoE's capacities, ...), 20 "
    "of them only in a model with experts (a dense run accepts them: Megatron does not read them "
    "there). The kernel, dispatcher and memory switches stay no-ops, and "
    "the inference settings that were listed with the experts are now listed as inference "
    "settings. Since then: expert parallelism (`--expert-model-parallel-size`, with "
    "Megatron-DeepSpeed's `--moe-expert-parallel-size` mapped to it), shared experts "
    "(`--moe-shared-expert-intermediate-size`, `--moe-shared-expert-gate`) and the expert bias "
    "(`--moe-router-enable-expert-bias`, `--moe-router-bias-update-rate`) are implemented, "
    "and the shared experts' kernel and overlap switches are no-ops; `--moe-layer-freq` takes "
    "Megatron's per-layer patterns (`\"([1]*3+[0]*1)*2\"`), and `--expert-interval` N > 1 (with "
    "its default 2, refused before) maps onto one.\n\n";

std::string flag_table_markdown() {
  std::map<FlagStatus, int> count;
  for (const CompatFlag& f : kTable) ++count[f.status];
  std::string s =
      "# Megatron-LM / Megatron-DeepSpeed / DeepSpeed flags in `trident train`\n\n"
      "Every argument that `pretrain_gpt.py` of Megatron-LM (every revision of "
      "`megatron/arguments.py` and `megatron/training/arguments.py`, 2021-2026) and of "
      "Megatron-DeepSpeed (microsoft and bigscience-workshop forks) accepts, and DeepSpeed's "
      "launcher arguments, with what trident does with it:\n\n"
      "- **implemented**: a trident flag of the same name and meaning "
      "(`trident train --help`);\n"
      "- **mapped**: translated into trident's settings as the note says;\n"
      "- **no-op**: accepted, no effect on what trident computes, and Megatron's run with it is "
      "trident's run without it; one warning line at start-up names it;\n"
      "- **no-op, differs**: accepted, but Megatron's run with it differs from trident's; the "
      "warning line says what differs (`... accepted, but the run differs from Megatron's: "
      "...`);\n"
      "- **refused**: an error giving the reason (for some, the value that says what trident "
      "does anyway is accepted, as the note says).\n\n"
      "Integers may be written with `_` (`9_765_625`), as Python accepts them. This file is "
      "generated: `trident train --print-flag-table > docs/flags.md` (a test compares them).\n\n";
  s +=
      str("Counts: ", kTable[0].name.empty() ? 0 : static_cast<int>(std::size(kTable)),
          " flags: ", count[FlagStatus::kImplemented], " implemented, ", count[FlagStatus::kMapped],
          " mapped, ", count[FlagStatus::kNoOp], " no-op, ", count[FlagStatus::kNoOpDiffers],
          " no-op that differs, ", count[FlagStatus::kRefused], " refused.\n\n");
  s += kNoOpReview;
  s += kMoeReview;
  s += "| flag | values | meaning | status | trident |\n|---|---|---|---|---|\n";
  for (const CompatFlag& f : kTable) {
    const std::string values = f.values == 0    ? "-"
                               : f.values == -1 ? "1+"
                               : f.values == -2 ? "0+"
                               : f.values == -3 ? "0-1"
                                                : str(f.values);
    s += str("| `", f.name, "` | ", values, " | ", f.meaning, " | ", flag_status_name(f.status),
             " | ", f.note, " |\n");
  }
  return s;
}

}  // namespace trident::train
