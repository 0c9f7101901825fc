// Hugging Face interop of `trident convert` (docs/hf-import.md, docs/hf-export.md). The model
// mapping (config fields, tensor names and layouts) is ckpt/hf_model.h; safetensors files are
// ckpt/safetensors.h (read by memory mapping, written in shards, one tensor at a time).
#include "convert_hf.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/hf_model.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/ckpt/safetensors.h"
#include "trident/ckpt/save_lock.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/data/json_io.h"
#include "trident/model/param_table.h"
#include "trident/optim/update_rule.h"
#include "trident/train/train_config.h"

namespace trident::tools {

namespace fs = std::filesystem;
using core::str;

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw core::DataError(str(p.string(), ": cannot open"));
  try {
    return data::parse_json_strict(in);
  } catch (const nlohmann::json::exception& e) {
    throw core::DataError(str(p.string(), ": malformed JSON (", e.what(), ")"));
  }
}

void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream out(p);
  out << j.dump(2) << "\n";
  if (!out) throw core::Error(str("cannot write ", p.string()));
}

// The tokenizer files a transformers model directory may hold; copied as they are both ways.
constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt",     "tokenizer.model",       "generation_config.json"};

ckpt::StDType dtype_named(const std::string& t) {
  if (t == "bfloat16") return ckpt::StDType::kBF16;
  if (t == "float16") return ckpt::StDType::kF16;
  TRIDENT_CHECK(t == "float32", "--hf-dtype ", t, ": use float32, bfloat16 or float16");
  return ckpt::StDType::kF32;
}

}  // namespace

void import_from_hf(const HfImportArgs& a) {
  const fs::path src(a.from_hf);
  const nlohmann::json hf_config = read_json(src / "config.json");
  const ckpt::HfImport imp = ckpt::hf_config_to_trident(hf_config, a.seq_length);
  const model::ModelConfig& mc = imp.model;
  const model::ParamTable table = model::build_gpt_param_table(mc);
  const ckpt::SafetensorsModel weights(a.from_hf);
  log::info("convert: ", a.from_hf, ": ", ckpt::hf_arch_name(imp.arch), ", ", mc.num_layers,
            " layers, hidden ", mc.hidden_size, ", ", mc.num_attention_heads, " heads (",
            mc.query_groups(), " key/value), ffn ", mc.ffn(), ", vocab ", mc.vocab_size,
            " (padded ", mc.padded_vocab_size(), "), ",
            mc.num_experts > 0 ? str(mc.num_experts, " experts (top ", mc.moe_router_topk, ", ffn ",
                                     mc.moe_ffn(), "), ")
                               : std::string(),
            ckpt::st_dtype_name(imp.dtype));

  // The weights: each HF tensor scattered into its trident parameter (padded rows stay zero).
  std::vector<float> flat(static_cast<std::size_t>(table.total_numel), 0.0f);
  std::set<std::string> used;
  std::vector<float> buf;
  for (const ckpt::HfTensor& t : ckpt::hf_tensors(mc, imp.arch)) {
    std::string name = t.name;
    if (!weights.has(name)) name = ckpt::hf_alternate_name(t.name, imp.arch);
    TRIDENT_CHECK(weights.has(name), a.from_hf, ": the weights lack ", t.name, ", which a ",
                  ckpt::hf_arch_name(imp.arch), " model of this config.json has");
    const ckpt::SafetensorsFile& f = weights.file_of(name);
    const ckpt::StTensorInfo& info = f.info(name);
    TRIDENT_CHECK(info.shape == t.shape, f.path(), ": ", name, " has shape ",
                  nlohmann::json(info.shape).dump(), ", config.json implies ",
                  nlohmann::json(t.shape).dump());
    buf.resize(static_cast<std::size_t>(t.numel()));
    f.read_f32(name, buf.data());
    const model::ParamSpec& p = table.find(t.trident_name);
    float* dst = flat.data() + p.offset;
    for (std::int64_t i = 0; i < t.numel(); ++i) dst[t.index(i)] = buf[static_cast<std::size_t>(i)];
    used.insert(name);
  }
  std::vector<std::string> unknown;
  for (const std::string& n : weights.names()) {
    if (!used.count(n) && !ckpt::hf_ignored_name(n, imp.arch, mc)) unknown.push_back(n);
  }
  TRIDENT_CHECK(unknown.empty(), a.from_hf, ": ", unknown.size(),
                " tensors are not part of the model trident reads from config.json (first: ",
                unknown.empty() ? "" : unknown.front(), ")");

  // The run configuration the checkpoint records, as `trident train` would write it.
  train::TrainConfig tc;
  tc.model = mc;
  tc.position_embedding_type = mc.position_embedding == model::PositionEmbedding::kAlibi ? "alibi"
                               : mc.position_embedding == model::PositionEmbedding::kRope
                                   ? "rope"
                                   : "learned_absolute";
  tc.normalization = mc.normalization == model::Normalization::kRmsNorm ? "RMSNorm" : "LayerNorm";
  tc.group_query_attention = mc.num_query_groups > 0;
  tc.model_preset = "gpt";
  ckpt::SaveLock lock(a.save);
  const fs::path tok_dir = fs::absolute(a.tokenizer_dir.empty() ? fs::path(a.save) / "hf_tokenizer"
                                                                : fs::path(a.tokenizer_dir));
  fs::create_directories(tok_dir);
  for (const char* f : kTokenizerFiles) {
    if (fs::exists(src / f))
      fs::copy_file(src / f, tok_dir / f, fs::copy_options::overwrite_existing);
  }
  if (fs::exists(tok_dir / "tokenizer.json")) {
    tc.tokenizer_type = "HuggingFaceTokenizer";
    tc.tokenizer_model = (tok_dir / "tokenizer.json").string();
  } else if (fs::exists(tok_dir / "vocab.json") && fs::exists(tok_dir / "merges.txt")) {
    tc.tokenizer_type = "GPT2BPETokenizer";
    tc.vocab_file = (tok_dir / "vocab.json").string();
    tc.merge_file = (tok_dir / "merges.txt").string();
  } else if (fs::exists(tok_dir / "tokenizer.model")) {
    tc.tokenizer_type = "SentencePieceTokenizer";
    tc.tokenizer_model = (tok_dir / "tokenizer.model").string();
  } else {
    log::warn("convert: ", a.from_hf,
              " has no tokenizer files; the checkpoint records "
              "NullTokenizer with the model's ",
              mc.vocab_size, " ids");
    tc.tokenizer_type = "NullTokenizer";
    tc.null_tokenizer_vocab_size = mc.vocab_size - 1;  // NullTokenizer adds its end-of-document id
  }
  nlohmann::json config = tc.to_json();
  config["hf_torch_dtype"] = hf_config.value("torch_dtype", std::string("float32"));
  config["hf_model_type"] = ckpt::hf_arch_name(imp.arch);

  ckpt::CheckpointState state;
  state.iteration = 0;
  state.config = config;
  state.layout = {{"tp", 1},
                  {"pp", 1},
                  {"dp", 1},
                  {"virtual_chunks", 1},
                  {"first_stage_layers", -1},
                  {"last_stage_layers", -1},
                  {"zero_stage", 0}};
  state.coords = {{"tp", 0}, {"pp", 0}, {"dp", 0}};
  state.tables.push_back({&table, 0});
  state.numel = table.total_numel;
  std::vector<float> zeros(flat.size(), 0.0f);  // the optimizer's state (fine-tuning starts anew)
  state.params = {flat.data(), 0, table.total_numel};
  // The default rule's (AdamW) arrays, zeros; the config names no "optimizer", so any rule's
  // --finetune starts from it.
  for (const char* name : optim::make_update_rule({})->state_arrays()) {
    state.optimizer_state.push_back({name, {zeros.data(), 0, table.total_numel}});
  }
  const std::string tmp_dir =
      (fs::path(a.save) / (ckpt::iteration_dir_name(0) + ".tmp." + std::to_string(::getpid())))
          .string();
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  try {
    const std::string error = ckpt::write_shard(tmp_dir, 0, state);
    if (!error.empty()) throw ckpt::SaveError(error);
    ckpt::finish_save_local(a.save, tmp_dir, state, 1);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  log::info("convert: wrote ", a.save, "/", ckpt::iteration_dir_name(0), " (", tc.tokenizer_type,
            ")");
}

void export_to_hf(const HfExportArgs& a) {
  const nlohmann::json manifest = ckpt::read_manifest(a.load, a.iteration);
  const nlohmann::json& config = manifest.at("config");
  model::ModelConfig mc = ckpt::model_config_from_json(config);
  // Keep the trained padding of a tensor-parallel run (as `trident generate`).
  const std::int64_t padded = mc.padded_vocab_size(manifest.at("layout").value("tp", 1));
  mc.make_vocab_size_divisible_by = padded;
  const ckpt::HfArch arch = ckpt::hf_arch_of(mc);
  const ckpt::StDType dtype = dtype_named(
      a.dtype.empty() ? config.value("hf_torch_dtype", std::string("float32")) : a.dtype);
  const model::ParamTable table = model::build_gpt_param_table(mc);
  std::vector<float> flat(static_cast<std::size_t>(table.total_numel), 0.0f);
  ckpt::load_full_params(a.load, manifest.at("iteration").get<std::int64_t>(), table, flat.data());

  const fs::path out(a.to_hf);
  fs::create_directories(out);
  const std::vector<ckpt::HfTensor> tensors = ckpt::hf_tensors(mc, arch);
  ckpt::SafetensorsWriter writer(out.string(), a.max_shard_bytes);
  for (const ckpt::HfTensor& t : tensors) writer.declare({t.name, dtype, t.shape});
  const std::vector<std::string> files = writer.write([&](std::size_t i, std::span<float> dst) {
    const ckpt::HfTensor& t = tensors[i];
    const float* src = flat.data() + table.find(t.trident_name).offset;
    for (std::int64_t k = 0; k < t.numel(); ++k) dst[static_cast<std::size_t>(k)] = src[t.index(k)];
  });
  write_json(out / "config.json", ckpt::trident_to_hf_config(mc, arch, dtype));

  // Tokenizer: the files of an imported model as they were, else the ones the run trained with.
  const std::string type = config.value("tokenizer_type", std::string());
  const std::string model_file = config.value("tokenizer_model", std::string());
  const fs::path tok_dir = model_file.empty() ? fs::path() : fs::path(model_file).parent_path();
  if (!tok_dir.empty() && fs::exists(tok_dir / "tokenizer_config.json")) {
    for (const char* f : kTokenizerFiles) {
      if (fs::exists(tok_dir / f))
        fs::copy_file(tok_dir / f, out / f, fs::copy_options::overwrite_existing);
    }
  } else if (type == "GPT2BPETokenizer") {
    const std::string vocab = config.value("vocab_file", std::string());
    const std::string merges = config.value("merge_file", std::string());
    if (fs::path(vocab).parent_path() != "" &&
        fs::exists(fs::path(vocab).parent_path() / "tokenizer_config.json")) {
      for (const char* f : kTokenizerFiles) {
        const fs::path p = fs::path(vocab).parent_path() / f;
        if (fs::exists(p)) fs::copy_file(p, out / f, fs::copy_options::overwrite_existing);
      }
    } else {
      fs::copy_file(vocab, out / "vocab.json", fs::copy_options::overwrite_existing);
      fs::copy_file(merges, out / "merges.txt", fs::copy_options::overwrite_existing);
      write_json(out / "tokenizer_config.json", {{"tokenizer_class", "GPT2Tokenizer"},
                                                 {"bos_token", "<|endoftext|>"},
                                                 {"eos_token", "<|endoftext|>"},
                                                 {"unk_token", "<|endoftext|>"},
                                                 {"model_max_length", mc.max_positions()}});
    }
  } else if (type == "HuggingFaceTokenizer") {
    fs::copy_file(model_file, out / "tokenizer.json", fs::copy_options::overwrite_existing);
    write_json(out / "tokenizer_config.json", {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                               {"model_max_length", mc.max_positions()}});
  } else {
    log::warn("convert: the run's tokenizer (", type, ") has no transformers files; ", out.string(),
              " holds the model only");
  }
  log::info("convert: wrote ", out.string(), " (", ckpt::hf_arch_name(arch), ", ", files.size(),
            " weight file(s), ", ckpt::st_dtype_name(dtype), ") from ", a.load, " iteration ",
            manifest.at("iteration").get<std::int64_t>());
}

}  // namespace trident::tools
