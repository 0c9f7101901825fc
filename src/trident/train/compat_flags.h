// Every argument of Megatron-LM's pretrain_gpt.py (2021-2026), Megatron-DeepSpeed's and
// DeepSpeed's launcher arguments, each with what trident does with it: implemented (a trident
// flag of the same name), mapped (translated into trident settings), a no-op (accepted, one
// warning line naming it: Megatron's run with it is trident's without it), a no-op that differs
// (accepted, one warning line naming what differs from Megatron's run) or refused (an error giving
// the reason). The table is docs/flags.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace CLI {
class App;
}

namespace trident::train {

struct TrainConfig;

enum class FlagStatus : std::uint8_t { kImplemented, kMapped, kNoOp, kNoOpDiffers, kRefused };
const char* flag_status_name(FlagStatus s);

struct CompatFlag {
  std::string_view name;
  FlagStatus status;
  int values;  // 0 flag, n > 0 exactly n, -1 one or more, -2 any number, -3 zero or one
  std::string_view meaning;
  std::string_view note;  // trident's behaviour
};

std::span<const CompatFlag> megatron_flag_table();
const CompatFlag* find_compat_flag(std::string_view name);

// docs/flags.md: the table with its counts.
std::string flag_table_markdown();

// Registers every table flag that is not a trident flag; what is given lands in cfg.compat.
void add_compat_options(CLI::App& app, TrainConfig& cfg);

// Applies cfg.compat: mapped flags set trident settings, no-ops add one line each to
// cfg.warnings, refused flags (or refused values) throw InvalidArgument with the reason.
// Megatron-DeepSpeed's mixture-of-experts flags are applied together, with its defaults where a
// script of it relies on them (docs/moe.md). Runs in TrainConfig::finalize before the checks.
void apply_compat_flags(TrainConfig& cfg);

// The compatibility flags refused only in combination with the final settings (after the model
// presets). None at present (--add-qkv-bias with --disable-bias-linear, refused before, is
// implemented: ModelConfig::add_qkv_bias); the hook stays for the next. Runs in
// TrainConfig::finalize.
void check_compat_combinations(const TrainConfig& cfg);

// "9_765_625" -> "9765625" (Python's int() accepts underscores between digits); other text is
// returned unchanged.
std::string strip_digit_underscores(const std::string& s);

}  // namespace trident::train
