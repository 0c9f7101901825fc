// `trident convert --load A --save B [layout flags]`: reshards a trident checkpoint offline into
// another parallel layout (TP, PP with uneven or interleaved splits, DP, ZeRO stage, sequence
// parallelism), without training: every target rank's shard (weights, FP32 master weights, Adam
// moments) is assembled by global parameter names and indices (ckpt/reshard.h), and the
// iteration, consumed samples, data position and loss-scaler state are carried over. Layout flags
// not given keep the source's values. The result loads bitwise-directly into a run of the new
// layout (it could also be loaded resharded on the fly: --load reshards any layout by itself).
//
// Hugging Face model directories are other sources and sinks of the same command: --from-hf DIR
// (with --save and, optionally, the layout flags) and --to-hf DIR (with --load); convert_hf.cc.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "convert_hf.h"
#include "trident/ckpt/checkpoint.h"
#include "trident/ckpt/model_config_json.h"
#include "trident/ckpt/reshard.h"
#include "trident/ckpt/save_lock.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/optim/update_rule.h"
#include "trident/parallel/layout.h"
#include "trident/train/rank_model.h"
#include "trident/train/zero_optimizer.h"

namespace trident::tools {

namespace {

namespace fs = std::filesystem;
using core::str;

struct ConvertArgs {
  std::string load, save;
  std::int64_t iteration = -1;
  // Target layout; -2 (or "") keeps the source's value.
  int tp = -2, pp = -2, dp = -2, zero_stage = -2;
  std::int64_t layers_per_virtual_stage = -2, first_stage_layers = -2, last_stage_layers = -2;
  std::string sequence_parallel;  // "", "on", "off"
  // The vocabulary's padding: 0 keeps the checkpoint's rows when the target TP splits them, else
  // pads as Megatron does (a multiple of 128 x TP); > 0 pads to a multiple of this x TP.
  std::int64_t make_vocab_size_divisible_by = 0;
  std::int64_t true_vocab_size = 0;  // Megatron's converters' flag: checked against the checkpoint
};

void convert(const ConvertArgs& a) {
  TRIDENT_CHECK(!a.load.empty() && !a.save.empty(), "convert needs --load DIR and --save DIR");
  TRIDENT_CHECK(fs::weakly_canonical(a.load) != fs::weakly_canonical(a.save),
                "convert: --save must differ from --load (", a.load, ")");
  const nlohmann::json src = ckpt::read_manifest(a.load, a.iteration);
  const std::int64_t it = src.at("iteration");
  const nlohmann::json& sl = src.at("layout");
  nlohmann::json config = src.at("config");
  auto keep = [](auto v, const nlohmann::json& old) {
    return v == -2 ? old.get<decltype(v)>() : v;
  };
  const int tp = keep(a.tp, sl.at("tp")), pp = keep(a.pp, sl.at("pp"));
  const int dp = keep(a.dp, sl.at("dp")), stage = keep(a.zero_stage, sl.at("zero_stage"));
  const std::int64_t per_virtual =
      keep(a.layers_per_virtual_stage, config.at("num_layers_per_virtual_pipeline_stage"));
  const std::int64_t first = keep(a.first_stage_layers, sl.at("first_stage_layers"));
  const std::int64_t last = keep(a.last_stage_layers, sl.at("last_stage_layers"));
  const bool sp = a.sequence_parallel.empty() ? config.value("sequence_parallel", false)
                                              : a.sequence_parallel == "on";
  TRIDENT_CHECK(
      a.sequence_parallel.empty() || a.sequence_parallel == "on" || a.sequence_parallel == "off",
      "--sequence-parallel takes on or off");
  TRIDENT_CHECK(tp >= 1 && pp >= 1 && dp >= 1, "parallel sizes must be >= 1");
  TRIDENT_CHECK(stage >= 0 && stage <= 3, "--zero-stage must be 0, 1, 2 or 3");
  model::ModelConfig mc = ckpt::model_config_from_json(config);
  // The update rule whose state the checkpoint holds (older checkpoints: AdamW).
  const std::unique_ptr<optim::UpdateRule> rule = optim::make_update_rule(
      {.kind = optim::parse_optimizer(config.value("optimizer", std::string("adam")))});
  // The true vocabulary is in the checkpoint; Megatron's converters take it as --true-vocab-size.
  TRIDENT_CHECK(a.true_vocab_size == 0 || a.true_vocab_size == mc.vocab_size,
                "convert: --true-vocab-size ", a.true_vocab_size,
                " differs from the checkpoint's "
                "vocabulary of ",
                mc.vocab_size,
                " tokens (trident records it; leave the flag out, or check the checkpoint)");
  TRIDENT_CHECK(a.make_vocab_size_divisible_by >= 0,
                "--make-vocab-size-divisible-by must be positive");
  // The padded vocabulary stays the checkpoint's (its rows are trained weights) when the target's
  // tensor-parallel size splits it: the target's make_vocab_size_divisible_by is chosen to give
  // the same rows. Otherwise (or when --make-vocab-size-divisible-by is given) the rows are padded
  // for the target, dropping padding rows or adding copies of the last row (ckpt/reshard.h).
  const std::int64_t padded = mc.padded_vocab_size(sl.at("tp").get<int>());
  if (a.make_vocab_size_divisible_by == 0 && padded % tp == 0) {
    mc.make_vocab_size_divisible_by = padded / tp;
  } else {
    mc.make_vocab_size_divisible_by =
        a.make_vocab_size_divisible_by > 0 ? a.make_vocab_size_divisible_by : 128;
    const std::int64_t target = mc.padded_vocab_size(tp);
    if (target != padded) {
      log::warn("convert: *** the checkpoint's vocabulary is padded to ", padded,
                " rows, the "
                "target's to ",
                target, " (",
                a.make_vocab_size_divisible_by > 0
                    ? str("--make-vocab-size-divisible-by ", a.make_vocab_size_divisible_by)
                    : str("--tensor-model-parallel-size ", tp, " does not split ", padded,
                          "; Megatron's padding to a multiple of 128 x ", tp),
                "): ",
                padded > target ? str("padding rows ", target, "..", padded - 1, " are dropped")
                                : str("rows ", padded, "..", target - 1,
                                      " are added as copies of row ", padded - 1),
                " (the ", mc.vocab_size,
                " real tokens are kept; padding rows take no probability in the loss) ***");
    }
  }
  config["make_vocab_size_divisible_by"] = mc.make_vocab_size_divisible_by;
  const int chunks = per_virtual > 0 ? static_cast<int>(mc.num_layers / (per_virtual * pp)) : 1;
  TRIDENT_CHECK(per_virtual <= 0 || per_virtual * pp * chunks == mc.num_layers,
                "--num-layers-per-virtual-pipeline-stage ", per_virtual, " x pp ", pp,
                " does not divide the ", mc.num_layers, " layers");
  const parallel::ParallelLayout layout{.tp_size = tp, .dp_size = dp, .pp_size = pp};
  const train::PipelineSplit split{
      .pp_size = pp, .num_chunks = chunks, .first_stage_layers = first, .last_stage_layers = last};
  config["tensor_model_parallel_size"] = tp;
  config["pipeline_model_parallel_size"] = pp;
  config["zero_stage"] = stage;
  config["sequence_parallel"] = sp;
  config["num_layers_per_virtual_pipeline_stage"] = per_virtual;
  config["decoder_first_pipeline_num_layers"] = first;
  config["decoder_last_pipeline_num_layers"] = last;
  if (chunks > 1) config["pipeline_schedule"] = "interleaved";
  // The same keys as the trainer's layout record (trainer.cc), so the result loads directly.
  const nlohmann::json layout_json = {{"tp", tp},
                                      {"pp", pp},
                                      {"dp", dp},
                                      {"virtual_chunks", chunks},
                                      {"first_stage_layers", first},
                                      {"last_stage_layers", last},
                                      {"zero_stage", stage}};

  ckpt::SaveLock lock(a.save);
  const fs::path it_dir = fs::path(a.load) / ckpt::iteration_dir_name(it);
  const std::string tmp_dir =
      (fs::path(a.save) / (ckpt::iteration_dir_name(it) + ".tmp." + std::to_string(::getpid())))
          .string();
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  log::info("convert: ", a.load, " iteration ", it, " (layout ", sl.dump(), ") -> ", a.save,
            " (layout ", layout_json.dump(), ")");
  ckpt::CheckpointState state;
  try {
    for (int r = 0; r < layout.world_size(); ++r) {
      const parallel::Coord c = layout.coord_of(r);
      const train::RankModel rank_model(mc, split, tp, c.tp, c.pp, sp);
      const std::int64_t n = rank_model.total_numel();
      state = {};
      state.iteration = it;
      state.consumed_train_samples = src.at("consumed_train_samples");
      state.consumed_valid_samples = src.value("consumed_valid_samples", 0);
      state.config = config;
      state.layout = layout_json;
      state.trainer_state = src.value("trainer_state", nlohmann::json::object());
      state.coords = {{"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}};
      state.tp_rank = c.tp;
      for (const train::ModelChunk& ch : rank_model.chunks())
        state.tables.push_back({&ch.table, ch.base});
      state.numel = n;
      const parallel::Range pr = train::ZeroOptimizer::stored_range(stage, false, n, dp, c.dp);
      const parallel::Range mr = train::ZeroOptimizer::stored_range(stage, true, n, dp, c.dp);
      std::vector<float> params(static_cast<std::size_t>(pr.size()));
      state.params = {params.data(), pr.begin, pr.end};
      // The optimizer's state arrays (the saved rule's names), each over the state's range.
      std::vector<std::vector<float>> arrays;
      state.optimizer_state.clear();
      for (const char* name : rule->state_arrays()) {
        arrays.emplace_back(static_cast<std::size_t>(mr.size()));
        state.optimizer_state.push_back({name, {arrays.back().data(), mr.begin, mr.end}});
      }
      ckpt::load_resharded(it_dir, src, state);
      const std::string error = ckpt::write_shard(tmp_dir, r, state);
      if (!error.empty()) throw ckpt::SaveError(error);
      state.tables.clear();  // they point into rank_model
    }
    ckpt::finish_save_local(a.save, tmp_dir, state, layout.world_size());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  log::info("convert: wrote ", a.save, "/", ckpt::iteration_dir_name(it), " for ",
            layout.world_size(), " ranks (tp ", tp, " x pp ", pp, " x dp ", dp, ", ZeRO stage ",
            stage, chunks > 1 ? str(", ", chunks, " virtual stages") : std::string(),
            sp ? ", sequence parallel" : "", ")");
}

}  // namespace

void register_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* sub = app.add_subcommand(
      "convert", "Reshard a checkpoint into another parallel layout (offline, no training)");
  auto hf_in = std::make_shared<HfImportArgs>();
  auto hf_out = std::make_shared<HfExportArgs>();
  sub->add_option("--load", a->load, "Checkpoint directory to read");
  sub->add_option("--save", a->save, "Checkpoint directory to write");
  sub->add_option("--from-hf", hf_in->from_hf,
                  "Hugging Face model directory to read (config.json, safetensors, tokenizer)");
  sub->add_option("--to-hf", hf_out->to_hf,
                  "Hugging Face model directory to write from the --load checkpoint");
  sub->add_option("--seq-length", hf_in->seq_length,
                  "--from-hf: the training sequence length to record (default: the model's "
                  "max_position_embeddings; BLOOM 2048)");
  sub->add_option("--max-shard-size", hf_out->max_shard_bytes,
                  "--to-hf: bytes per safetensors shard (default 5 GiB)");
  sub->add_option("--hf-dtype", hf_out->dtype,
                  "--to-hf: float32, bfloat16 or float16 (default: as imported, else float32)");
  sub->add_option("--iteration", a->iteration, "Iteration to convert (default: the latest)");
  sub->add_option("--tensor-model-parallel-size", a->tp, "Target TP size");
  sub->add_option("--pipeline-model-parallel-size", a->pp, "Target PP size");
  sub->add_option("--data-parallel-size", a->dp, "Target DP size");
  sub->add_option("--zero-stage", a->zero_stage, "Target ZeRO stage (0-3)");
  sub->add_option("--num-layers-per-virtual-pipeline-stage", a->layers_per_virtual_stage,
                  "Target interleaved split (0: not interleaved)");
  sub->add_option("--decoder-first-pipeline-num-layers", a->first_stage_layers,
                  "Target layers of the first stage (-1: even split)");
  sub->add_option("--decoder-last-pipeline-num-layers", a->last_stage_layers,
                  "Target layers of the last stage (-1: even split)");
  sub->add_option("--sequence-parallel", a->sequence_parallel, "on or off");
  sub->add_option("--make-vocab-size-divisible-by", a->make_vocab_size_divisible_by,
                  "Pad the target's vocabulary to a multiple of this x its tensor-parallel size "
                  "(default: keep the checkpoint's rows when the target splits them, else 128)");
  sub->add_option("--true-vocab-size", a->true_vocab_size,
                  "The real vocabulary size (Megatron's converters' flag); trident reads it from "
                  "the checkpoint, this only checks it");
  sub->callback([a, hf_in, hf_out] {
    TRIDENT_CHECK(hf_in->from_hf.empty() || hf_out->to_hf.empty(),
                  "convert: --from-hf and --to-hf exclude each other");
    if (!hf_out->to_hf.empty()) {
      TRIDENT_CHECK(!a->load.empty() && a->save.empty(),
                    "convert --to-hf DIR needs --load CHECKPOINT (and no --save)");
      hf_out->load = a->load;
      hf_out->iteration = a->iteration;
      return export_to_hf(*hf_out);
    }
    if (hf_in->from_hf.empty()) return convert(*a);
    TRIDENT_CHECK(!a->save.empty() && a->load.empty(),
                  "convert --from-hf DIR needs --save CHECKPOINT (and no --load)");
    const bool relayout = a->tp != -2 || a->pp != -2 || a->dp != -2 || a->zero_stage != -2 ||
                          a->layers_per_virtual_stage != -2 || a->first_stage_layers != -2 ||
                          a->last_stage_layers != -2 || !a->sequence_parallel.empty() ||
                          a->make_vocab_size_divisible_by != 0;
    hf_in->save = a->save;
    if (!relayout) return import_from_hf(*hf_in);
    // Import as one rank, then reshard into the layout asked for.
    const std::string one_rank = a->save + ".hf-import." + std::to_string(::getpid());
    hf_in->save = one_rank;
    hf_in->tokenizer_dir = a->save + "/hf_tokenizer";
    try {
      import_from_hf(*hf_in);
      ConvertArgs c = *a;
      c.load = one_rank;
      convert(c);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(one_rank, ec);
      throw;
    }
    fs::remove_all(one_rank);
  });
}

}  // namespace trident::tools
