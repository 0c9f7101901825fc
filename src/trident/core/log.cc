#include "trident/core/log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace trident::log {

namespace {
Settings& mutable_settings() {
  static Settings s = [] {
    Settings d;
    if (const char* lvl = std::getenv("TRIDENT_LOG_LEVEL")) {
      const std::string v = lvl;
      if (v == "debug") d.min_level = Level::kDebug;
      if (v == "warn") d.min_level = Level::kWarn;
      if (v == "error") d.min_level = Level::kError;
    }
    return d;
  }();
  return s;
}
std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

void configure(const Settings& s) {
  const Level keep = mutable_settings().min_level;
  mutable_settings() = s;
  if (std::getenv("TRIDENT_LOG_LEVEL")) mutable_settings().min_level = keep;
}
const Settings& settings() { return mutable_settings(); }

void write(Level level, const std::string& msg) {
  const Settings& s = settings();
  if (level < s.min_level) return;
  if (level <= Level::kInfo && s.rank != 0 && !s.all_ranks) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  const char tag = level == Level::kDebug  ? 'D'
                   : level == Level::kInfo ? 'I'
                   : level == Level::kWarn ? 'W'
                                           : 'E';
  const std::string coords = s.coords.empty() ? core::str("r", s.rank) : s.coords;
  std::FILE* out = level >= Level::kWarn ? stderr : stdout;
  std::lock_guard<std::mutex> lock(log_mutex());
  std::fprintf(out, "%s.%03dZ %c [%s] %s\n", stamp, static_cast<int>(ms), tag, coords.c_str(),
               msg.c_str());
  std::fflush(out);
}

}  // namespace trident::log
