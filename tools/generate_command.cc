// `trident generate`: sample text from a checkpoint with a KV cache (greedy at temperature 0).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/core/arena.h"
#include "trident/core/error.h"
#include "trident/data/tokenizer.h"
#include "trident/kernels/memory.h"
#include "trident/model/generate.h"
#include "trident/model/param_table.h"

namespace trident::tools {

namespace {

struct GenerateOptions {
  std::string load, prompt, vocab_file, merge_file, tokenizer_type, device = "auto";
  std::int64_t max_new_tokens = 64;
  std::int64_t iteration = -1;
  model::SamplingConfig sampling;
};

void run_generate(const GenerateOptions& o) {
  const nlohmann::json manifest = ckpt::read_manifest(o.load, o.iteration);
  const nlohmann::json& config = manifest.at("config");
  model::ModelConfig mc = ckpt::model_config_from_json(config);
  // A tensor-parallel run padded the vocabulary to a multiple of divisible-by x tp: keep that
  // padding so every parameter has its trained shape.
  mc.make_vocab_size_divisible_by *= manifest.at("layout").value("tp", 1);
  auto tokenizer = data::make_tokenizer(
      {.type = o.tokenizer_type.empty() ? config.at("tokenizer_type").get<std::string>()
                                        : o.tokenizer_type,
       .vocab_file =
           o.vocab_file.empty() ? config.at("vocab_file").get<std::string>() : o.vocab_file,
       .merge_file =
           o.merge_file.empty() ? config.at("merge_file").get<std::string>() : o.merge_file,
       .model_file = config.value("tokenizer_model", std::string()),
       .vocab_size = config.value("null_tokenizer_vocab_size", std::int64_t{0})});
  TRIDENT_CHECK(tokenizer->vocab_size() == mc.vocab_size, "the tokenizer has ",
                tokenizer->vocab_size(), " tokens but the checkpoint's model has ", mc.vocab_size,
                ": pass the --vocab-file/--merge-file it was trained with");

  // --device: as train's (auto: the first visible GPU when the build has CUDA, else the host).
  std::string device = o.device;
  TRIDENT_CHECK(device == "auto" || device == "cpu" || device == "cuda",
                "--device must be cpu, cuda or auto, got '", device, "'");
  const int gpus = kernels::cuda_device_count();
  if (device == "auto") device = gpus > 0 ? "cuda" : "cpu";
  core::ExecContext ctx;
  if (device == "cuda") {
    TRIDENT_CHECK(gpus > 0, "--device cuda: no GPU: ", kernels::cuda_no_device_reason(),
                  " (check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu)");
    ctx = kernels::make_cuda_context(0);
    std::fprintf(stderr, "generate: device cuda:0 (%s)\n", kernels::cuda_device_name(0).c_str());
  }

  const model::ParamTable table = model::build_gpt_param_table(mc);
  const std::int64_t bytes = table.total_numel * static_cast<std::int64_t>(sizeof(float));
  core::Arena host(bytes);
  float* flat = host.alloc(core::DType::kF32, {table.total_numel}).as<float>();
  // Any training layout: tensor-parallel slices and pipeline stages are reassembled.
  ckpt::load_full_params(o.load, manifest.at("iteration").get<std::int64_t>(), table, flat);
  core::Arena on_device;
  if (device == "cuda") {  // the weights on the GPU, the host copy freed
    on_device = core::Arena(bytes, kernels::memory_for(ctx));
    float* d = on_device.alloc(core::DType::kF32, {table.total_numel}).as<float>();
    kernels::copy_to_device(ctx, d, flat, bytes);
    kernels::synchronize(ctx);
    host = core::Arena();
    flat = d;
  }

  const model::GptParams params = model::gpt_param_views(mc, table, flat);
  model::Generator gen(mc, params, ctx);
  std::vector<std::int32_t> ids = tokenizer->encode(o.prompt);
  if (ids.empty()) ids.push_back(tokenizer->eod());
  TRIDENT_CHECK(static_cast<std::int64_t>(ids.size()) + o.max_new_tokens <= mc.max_positions(),
                "prompt (", ids.size(), " tokens) + --max-new-tokens (", o.max_new_tokens,
                ") exceeds the model's ", mc.max_positions(), " positions");
  const float* logits = nullptr;
  for (std::int32_t id : ids) logits = gen.step(ctx, id);
  std::printf("%s", o.prompt.c_str());
  std::fflush(stdout);
  for (std::int64_t i = 0; i < o.max_new_tokens; ++i) {
    const std::int32_t next =
        model::sample_token(logits, mc.vocab_size, o.sampling, static_cast<std::uint64_t>(i));
    if (next == tokenizer->eod()) break;
    std::printf("%s", tokenizer->decode({next}).c_str());
    std::fflush(stdout);
    logits = gen.step(ctx, next);
  }
  std::printf("\n");
}

}  // namespace

void register_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand("generate", "Sample text from a checkpoint");
  sub->add_option("--load", o->load, "Checkpoint directory")->required();
  sub->add_option("--prompt", o->prompt, "Text to continue")->required();
  sub->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate")
      ->capture_default_str();
  sub->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-k", o->sampling.top_k, "Keep the k most likely tokens (0 = all)")
      ->capture_default_str();
  sub->add_option("--top-p", o->sampling.top_p, "Nucleus sampling mass")->capture_default_str();
  sub->add_option("--seed", o->sampling.seed, "Sampling seed")->capture_default_str();
  sub->add_option("--iteration", o->iteration, "Checkpoint iteration (default: latest)");
  sub->add_option("--device", o->device,
                  "cpu, cuda (the KV caches and the forward on the GPU) or auto (cuda when a GPU "
                  "is visible)")
      ->capture_default_str();
  sub->add_option("--tokenizer-type", o->tokenizer_type, "Override the checkpoint's tokenizer");
  sub->add_option("--vocab-file", o->vocab_file, "Override the checkpoint's vocabulary file");
  sub->add_option("--merge-file", o->merge_file, "Override the checkpoint's merges file");
  sub->callback([o] { run_generate(*o); });
}

}  // namespace trident::tools
