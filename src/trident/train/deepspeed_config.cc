#include "trident/train/deepspeed_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "trident/core/error.h"
#include "trident/data/json_io.h"
#include "trident/train/train_config.h"

namespace trident::train {

namespace {

using core::str;
using nlohmann::json;

struct Reader {
  TrainConfig& c;
  std::string src;

  std::string where(const std::string& key) const { return str(src, ": \"", key, "\""); }

  double number(const json& j, const std::string& key) const {
    if (j.is_string() && j.get<std::string>() == "auto") {
      throw core::InvalidArgument(str(where(key),
                                      " is \"auto\": only the Hugging Face "
                                      "integration fills those in; give the number"));
    }
    TRIDENT_CHECK(j.is_number() || j.is_boolean(), where(key), " must be a number, got ", j.dump());
    return j.get<double>();
  }
  // An integer in [lo, hi] (checked before the conversion: 1e300 does not fit an int64).
  std::int64_t integer(const json& j, const std::string& key, std::int64_t lo,
                       std::int64_t hi) const {
    const double v = number(j, key);
    TRIDENT_CHECK(
        v == std::floor(v) && v >= static_cast<double>(lo) && v <= static_cast<double>(hi),
        where(key), " must be an integer in [", lo, ", ", hi, "], got ", j.dump());
    return static_cast<std::int64_t>(v);
  }
  // A block's "enabled" switch ({"enabled": true} / false; absent: false).
  bool enabled(const json& ds, const char* block) const {
    if (!ds.contains(block)) return false;
    const json& b = ds[block];
    TRIDENT_CHECK(b.is_object(), where(block),
                  " must be an object {\"enabled\": true|false, ...}, got ", b.dump());
    return b.contains("enabled") && boolean(b["enabled"], str(block, ".enabled"));
  }
  std::string string(const json& j, const std::string& key) const {
    TRIDENT_CHECK(j.is_string(), where(key), " must be a string, got ", j.dump());
    return j.get<std::string>();
  }
  bool boolean(const json& j, const std::string& key) const {
    TRIDENT_CHECK(j.is_boolean(), where(key), " must be true or false, got ", j.dump());
    return j.get<bool>();
  }
  void ignored(const std::string& key, const json& v, const std::string& why) {
    c.warnings.push_back(str(where(key), " = ", v.dump(), ": ignored (", why, ")"));
  }
  // A JSON value against a flag: the flag given explicitly with another value is a contradiction.
  template <class T, class U>
  void set(T& field, U json_value, const std::string& key, const char* flag) {
    const T value = static_cast<T>(json_value);
    if (c.given.contains(flag) && field != value) {
      throw core::InvalidArgument(str(where(key), " = ", json_value, " contradicts ", flag, " ",
                                      field, ": make them agree (or drop the flag)"));
    }
    field = value;
  }
};

}  // namespace

namespace {

constexpr std::int64_t kMaxCount = std::int64_t{1} << 31;

// Batch sizes (DeepSpeed derives the missing one of three) and gradient clipping.
void apply_batch(Reader& r, const json& ds, int world_size) {
  const char* source = r.src.c_str();
  TrainConfig& c = r.c;
  const int dp = c.data_parallel_size(world_size);
  // Batch sizes: train_batch_size = micro x gradient_accumulation_steps x dp (DeepSpeed derives
  // the missing one).
  std::int64_t tbs = 0, mbs = 0, gas = 0;
  if (ds.contains("train_batch_size"))
    tbs = r.integer(ds["train_batch_size"], "train_batch_size", 1, kMaxCount);
  if (ds.contains("train_micro_batch_size_per_gpu"))
    mbs = r.integer(ds["train_micro_batch_size_per_gpu"], "train_micro_batch_size_per_gpu", 1,
                    kMaxCount);
  if (ds.contains("gradient_accumulation_steps"))
    gas = r.integer(ds["gradient_accumulation_steps"], "gradient_accumulation_steps", 1, kMaxCount);
  if (tbs == 0 && mbs > 0 && gas > 0) {
    TRIDENT_CHECK(mbs * gas <= kMaxCount / dp, source, ": train_micro_batch_size_per_gpu ", mbs,
                  " x gradient_accumulation_steps ", gas, " x data-parallel ", dp,
                  " exceeds 2^31 sequences per step");
    tbs = mbs * gas * dp;
  }
  if (mbs == 0 && tbs > 0 && gas > 0) {
    TRIDENT_CHECK(tbs % (gas * dp) == 0, r.where("train_batch_size"), " ", tbs,
                  " is not divisible by gradient_accumulation_steps ", gas, " x data-parallel ",
                  dp);
    mbs = tbs / (gas * dp);
  }
  if (gas > 0 && mbs > 0 && tbs > 0) {
    TRIDENT_CHECK(mbs * gas <= kMaxCount / dp && tbs == mbs * gas * dp, source,
                  ": train_batch_size ", tbs, " != train_micro_batch_size_per_gpu ", mbs,
                  " x gradient_accumulation_steps ", gas, " x data-parallel size ", dp, " (world ",
                  world_size, " / (tp x pp)); fix the JSON or the parallel sizes");
  }
  if (mbs > 0)
    r.set(c.micro_batch_size, mbs, "train_micro_batch_size_per_gpu", "--micro-batch-size");
  if (tbs > 0) r.set(c.global_batch_size, tbs, "train_batch_size", "--global-batch-size");

  if (ds.contains("gradient_clipping")) {
    const double clip = r.number(ds["gradient_clipping"], "gradient_clipping");
    r.set(c.optimizer.clip_grad, clip, "gradient_clipping", "--clip-grad");
  } else if (c.optimizer.clip_grad > 0) {
    c.warnings.push_back(str("--clip-grad ", c.optimizer.clip_grad, " under --deepspeed: ", source,
                             " has no \"gradient_clipping\", so DeepSpeed does not clip; "
                             "trident does the same (clipping off)"));
    c.optimizer.clip_grad = 0;
  }
}

// fp16 / bf16 blocks and DeepSpeed's loss scaler.
void apply_precision(Reader& r, const json& ds) {
  const char* source = r.src.c_str();
  TrainConfig& c = r.c;
  // Precision and DeepSpeed's loss scaler (deepspeed/runtime/fp16/loss_scaler.py defaults).
  const bool json_fp16 = r.enabled(ds, "fp16");
  const bool json_bf16 = r.enabled(ds, "bf16") || r.enabled(ds, "bfloat16");
  TRIDENT_CHECK(!(json_fp16 && json_bf16), source, ": fp16 and bf16 are both enabled");
  TRIDENT_CHECK(!(c.bf16 && json_fp16), "--bf16 contradicts ", source,
                ": \"fp16\": {\"enabled\": true}; make them agree");
  TRIDENT_CHECK(!(c.fp16 && json_bf16), "--fp16 contradicts ", source,
                ": \"bf16\": {\"enabled\": true}; make them agree");
  TRIDENT_CHECK(!c.fp16 || json_fp16, "--fp16 under --deepspeed needs ", source,
                " to enable it: \"fp16\": {\"enabled\": true}");
  TRIDENT_CHECK(!c.bf16 || json_bf16 || json_fp16 || !ds.contains("bf16"), "--bf16 contradicts ",
                source, ": \"bf16\": {\"enabled\": false}");
  if (json_bf16) c.bf16 = true;
  if (c.given.contains("--loss-scale")) {
    c.warnings.push_back(str("--loss-scale ", c.loss_scale,
                             " ignored under --deepspeed: the loss scale comes from ", source,
                             " (fp16.loss_scale 0 = dynamic, starting at 2^initial_scale_power)"));
  }
  c.loss_scale = 0;
  if (json_fp16) {
    c.fp16 = true;
    const json& f = ds["fp16"];
    // DeepSpeed's defaults, which replace Megatron's under --deepspeed.
    c.initial_loss_scale = std::ldexp(1.0, 16);
    c.loss_scale_window = 1000;
    c.hysteresis = 2;
    c.min_loss_scale = 1;
    for (const auto& [k, v] : f.items()) {
      const std::string key = "fp16." + k;
      if (k == "enabled") continue;
      if (k == "loss_scale") {
        c.loss_scale = r.number(v, key);
      } else if (k == "initial_scale_power") {
        c.initial_loss_scale = std::ldexp(1.0, static_cast<int>(r.integer(v, key, 0, 63)));
      } else if (k == "loss_scale_window") {
        c.loss_scale_window = r.integer(v, key, 1, kMaxCount);
      } else if (k == "hysteresis") {
        c.hysteresis = r.integer(v, key, 1, kMaxCount);
      } else if (k == "min_loss_scale") {
        c.min_loss_scale = r.number(v, key);
      } else if (k == "consecutive_hysteresis") {
        TRIDENT_CHECK(!r.boolean(v, key), r.where(key),
                      " = true is not supported: trident's hysteresis counts overflows without "
                      "refilling on clean steps (DeepSpeed's default, false)");
      } else {
        r.ignored(key, v, "not read by trident");
      }
    }
  }
  if (ds.contains("bf16")) {
    TRIDENT_CHECK(ds["bf16"].is_object(), r.where("bf16"), " must be an object");
    for (const auto& [k, v] : ds["bf16"].items())
      if (k != "enabled") r.ignored("bf16." + k, v, "not read by trident");
  }
}

// zero_optimization: the stage, buckets, offload.
void apply_zero(Reader& r, const json& ds) {
  TrainConfig& c = r.c;
  if (ds.contains("zero_optimization")) {
    const json& z = ds["zero_optimization"];
    TRIDENT_CHECK(z.is_object(), r.where("zero_optimization"), " must be an object");
    for (const auto& [k, v] : z.items()) {
      const std::string key = "zero_optimization." + k;
      if (k == "stage") {
        r.set(c.zero_stage, static_cast<int>(r.integer(v, key, 0, 3)), key, "--zero-stage");
      } else if (k == "reduce_bucket_size") {
        c.ddp_bucket_size = r.integer(v, key, 1, std::int64_t{1} << 40);
      } else if (k == "allgather_bucket_size" || k == "stage3_prefetch_bucket_size" ||
                 k == "stage3_param_persistence_threshold" || k == "stage3_max_live_parameters" ||
                 k == "stage3_max_reuse_distance" || k == "sub_group_size") {
        r.ignored(key, v, "trident gathers parameters in --ddp-bucket-size buckets");
      } else if (k == "contiguous_gradients" || k == "overlap_comm" || k == "reduce_scatter" ||
                 k == "allgather_partitions" || k == "round_robin_gradients" ||
                 k == "stage3_gather_16bit_weights_on_model_save" ||
                 k == "stage3_gather_fp16_weights_on_model_save" || k == "elastic_checkpoint") {
        r.ignored(key, v, "trident's ZeRO always works this way or has no such switch");
      } else if (k == "offload_optimizer" || k == "offload_param" || k == "cpu_offload") {
        // ZeRO-Offload / ZeRO-Infinity (docs/offload.md): {"device": "none" | "cpu" | "nvme",
        // "nvme_path": DIR, ...}; the legacy "cpu_offload": true is offload_optimizer cpu.
        const bool params = k == "offload_param";
        TRIDENT_CHECK(v.is_object() || v.is_boolean(), r.where(key),
                      " must be an object {\"device\": ...} (or true/false for cpu_offload)");
        const std::string dev =
            v.is_object() ? (v.contains("device") ? r.string(v["device"], key + ".device") : "none")
                          : (v.get<bool>() ? "cpu" : "none");
        TRIDENT_CHECK(dev == "none" || dev == "cpu" || dev == "nvme", r.where(key + ".device"),
                      " = ", dev, ": must be none, cpu or nvme");
        if (params) {
          // cpu: the CPU backend's parameters are in host memory already (the identity); nvme is
          // --offload-params nvme (ZeRO-3 only: refused with the flag's message otherwise).
          if (dev == "nvme") r.set(c.offload_params, dev, key + ".device", "--offload-params");
        } else {
          r.set(c.offload_optimizer, dev, key + ".device", "--offload-optimizer");
        }
        if (v.is_object()) {
          for (const auto& [sk, sv] : v.items()) {
            const std::string skey = key + "." + sk;
            if (sk == "device") continue;
            if (sk == "nvme_path") {
              TRIDENT_CHECK(sv.is_string(), r.where(skey), " must be a directory path");
              if (dev == "nvme") {
                const std::string path = sv.get<std::string>();
                TRIDENT_CHECK(c.offload.path.empty() || c.offload.path == path ||
                                  c.given.contains("--offload-path"),
                              r.where(skey), " = ", path,
                              ": trident keeps all offload files in one directory and the other "
                              "offload block names ",
                              c.offload.path, ": give both the same nvme_path");
                r.set(c.offload.path, path, skey, "--offload-path");
              }
            } else {
              r.ignored(skey, sv,
                        "trident's offload streams through --offload-window-mib of buffers with "
                        "--offload-io; see docs/offload.md");
            }
          }
        }
      } else {
        r.ignored(key, v, "not read by trident");
      }
    }
  }
}

// The optimizer block: AdamW or Lion and their hyper-parameters.
void apply_optimizer(Reader& r, const json& ds) {
  TrainConfig& c = r.c;
  if (ds.contains("optimizer")) {
    const json& o = ds["optimizer"];
    TRIDENT_CHECK(o.is_object(), r.where("optimizer"),
                  " must be an object {\"type\": \"AdamW\", ...}");
    const std::string type = o.contains("type") ? r.string(o["type"], "optimizer.type") : "";
    const bool adam = type == "Adam" || type == "AdamW" || type == "adam" || type == "adamw" ||
                      type == "FusedAdam";
    const bool lion =
        type == "Lion" || type == "lion" || type == "FusedLion" || type == "DeepSpeedCPULion";
    TRIDENT_CHECK(adam || lion, r.where("optimizer.type"), " ", type,
                  ": trident has AdamW (DeepSpeed's Adam with adam_w_mode true) and Lion");
    const optim::OptimizerKind kind =
        adam ? optim::OptimizerKind::kAdamW : optim::OptimizerKind::kLion;
    TRIDENT_CHECK(
        !c.given.contains("--optimizer") || optim::parse_optimizer(c.optimizer_type) == kind,
        r.where("optimizer.type"), " = ", type, " contradicts --optimizer ", c.optimizer_type,
        ": make them agree (or drop the flag)");
    c.optimizer_type = optim::optimizer_name(kind);
    if (o.contains("params")) {
      TRIDENT_CHECK(o["params"].is_object(), r.where("optimizer.params"), " must be an object");
      for (const auto& [k, v] : o["params"].items()) {
        const std::string key = "optimizer.params." + k;
        if (k == "betas") {
          TRIDENT_CHECK(v.is_array() && v.size() == 2, r.where(key), " must be [beta1, beta2]");
          if (lion) {
            r.set(c.optimizer.lion_beta1, r.number(v[0], key), key, "--lion-beta1");
            r.set(c.optimizer.lion_beta2, r.number(v[1], key), key, "--lion-beta2");
          } else {
            r.set(c.optimizer.beta1, r.number(v[0], key), key, "--adam-beta1");
            r.set(c.optimizer.beta2, r.number(v[1], key), key, "--adam-beta2");
          }
        } else if (k == "eps" && adam) {
          r.set(c.optimizer.eps, r.number(v, key), key, "--adam-eps");
        } else if (k == "adam_w_mode" && adam) {
          TRIDENT_CHECK(r.boolean(v, key), r.where(key),
                        " = false (Adam with L2 regularisation) is not supported: trident has "
                        "AdamW");
        } else if (k == "lr" || k == "weight_decay") {
          r.ignored(key, v,
                    "Megatron's scheduler sets the learning rate and weight decay every step "
                    "from --lr and --weight-decay");
        } else {
          r.ignored(key, v, "not read by trident");
        }
      }
    }
  }
}

// The scheduler block (refused) and every key trident does not read (warned).
void apply_scheduler_and_the_rest(Reader& r, const json& ds) {
  if (ds.contains("scheduler")) {
    throw core::InvalidArgument(str(r.where("scheduler"),
                                    ": DeepSpeed versions differ on whether this block or "
                                    "Megatron's scheduler runs; trident runs Megatron's schedule "
                                    "from the --lr* flags. Remove the block"));
  }

  static const std::set<std::string> kHandled = {"train_batch_size",
                                                 "train_micro_batch_size_per_gpu",
                                                 "gradient_accumulation_steps",
                                                 "gradient_clipping",
                                                 "fp16",
                                                 "bf16",
                                                 "bfloat16",
                                                 "zero_optimization",
                                                 "optimizer",
                                                 "scheduler"};
  for (const auto& [k, v] : ds.items()) {
    if (kHandled.contains(k)) continue;
    if (k == "steps_per_print" || k == "wall_clock_breakdown" || k == "tensorboard" ||
        k == "wandb" || k == "flops_profiler" || k == "comms_logger" || k == "memory_breakdown" ||
        k == "csv_monitor" || k == "dump_state") {
      r.ignored(k, v,
                "DeepSpeed's own logging; trident logs with --log-interval, "
                "--tensorboard-dir");
    } else {
      r.ignored(k, v, "not read by trident");
    }
  }
}

void apply_json(TrainConfig& c, const json& ds, int world_size, const char* source) {
  Reader r{c, source};
  apply_batch(r, ds, world_size);
  apply_precision(r, ds);
  apply_zero(r, ds);
  apply_optimizer(r, ds);
  apply_scheduler_and_the_rest(r, ds);
}

}  // namespace

void apply_deepspeed_json(TrainConfig& c, const json& ds, int world_size, const char* source) {
  TRIDENT_CHECK(ds.is_object(), source, ": the DeepSpeed config must be a JSON object");
  try {
    apply_json(c, ds, world_size, source);
  } catch (const json::exception& e) {
    // A value of a type no check above expected (each names its key; this is the safety net).
    throw core::InvalidArgument(str(source, ": a value has the wrong type (", e.what(), ")"));
  }
}

void apply_deepspeed_config(TrainConfig& c, int world_size) {
  if (!c.deepspeed) {
    if (!c.deepspeed_config.empty()) {
      c.warnings.push_back(str("--deepspeed_config ", c.deepspeed_config,
                               " ignored without --deepspeed (as Megatron-DeepSpeed)"));
    }
    return;
  }
  TRIDENT_CHECK(!c.deepspeed_config.empty(),
                "--deepspeed needs --deepspeed_config FILE.json (DeepSpeed's configuration)");
  std::ifstream in(c.deepspeed_config);
  TRIDENT_CHECK(in.good(), "--deepspeed_config ", c.deepspeed_config, ": cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  json ds;
  try {
    ds = data::parse_json_strict(ss.str());  // DeepSpeed also refuses duplicate keys
  } catch (const data::JsonDuplicateKey& e) {
    throw core::InvalidArgument(str("--deepspeed_config ", c.deepspeed_config, ": ", e.what()));
  } catch (const json::exception& e) {
    throw core::InvalidArgument(
        str("--deepspeed_config ", c.deepspeed_config, ": not valid JSON: ", e.what()));
  }
  const std::string src = str("--deepspeed_config ", c.deepspeed_config);
  apply_deepspeed_json(c, ds, world_size, src.c_str());
}

}  // namespace trident::train
