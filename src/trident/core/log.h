// Rank-aware logging. Every line carries a timestamp, level, the rank's coordinates and its host:
//   2026-01-01T12:00:00.123Z I [r5 tp1 dp2 pp0 @node17] ckpt: wrote iteration 1000
// info goes to stdout on rank 0 only (unless all_ranks, or TRIDENT_LOG_ALL_RANKS=1 in the
// environment); warn and error come from every rank (stderr). The process-wide log settings are
// the one piece of global state, set once at startup.
#pragma once

#include <string>

#include "trident/core/error.h"

namespace trident::log {

enum class Level { kDebug, kInfo, kWarn, kError };

struct Settings {
  int rank = 0;
  std::string coords;  // e.g. "r5 tp1 dp2 pp0"; empty -> "r<rank>"
  std::string host;    // e.g. "node17"; empty -> this machine's short host name
  bool all_ranks = false;
  Level min_level = Level::kInfo;
};
void configure(const Settings& s);
const Settings& settings();

// This machine's host name up to the first '.', as gethostname() reports it (inside a UTS
// namespace: the namespace's name).
std::string short_hostname();

void write(Level level, const std::string& msg);

template <class... Args>
void debug(const Args&... a) {
  write(Level::kDebug, core::str(a...));
}
template <class... Args>
void info(const Args&... a) {
  write(Level::kInfo, core::str(a...));
}
template <class... Args>
void warn(const Args&... a) {
  write(Level::kWarn, core::str(a...));
}
template <class... Args>
void error(const Args&... a) {
  write(Level::kError, core::str(a...));
}

}  // namespace trident::log
