#include "trident/core/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    if (const char* all = std::getenv("TRIDENT_LOG_ALL_RANKS")) {
      d.all_ranks = std::strcmp(all, "0") != 0 && *all != '\0';
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

std::string short_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  std::string s = name;
  if (const auto dot = s.find('.'); dot != std::string::npos && dot > 0) s.resize(dot);
  return s.empty() ? "?" : s;
}

void configure(const Settings& s) {
  const Settings old = mutable_settings();
  mutable_settings() = s;
  if (std::getenv("TRIDENT_LOG_LEVEL")) mutable_settings().min_level = old.min_level;
  if (std::getenv("TRIDENT_LOG_ALL_RANKS")) mutable_settings().all_ranks = old.all_ranks;
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
  static const std::string this_host = short_hostname();
  const std::string coords = core::str(s.coords.empty() ? core::str("r", s.rank) : s.coords, " @",
                                       s.host.empty() ? this_host : s.host);
  std::FILE* out = level >= Level::kWarn ? stderr : stdout;
  std::lock_guard<std::mutex> lock(log_mutex());
  std::fprintf(out, "%s.%03dZ %c [%s] %s\n", stamp, static_cast<int>(ms), tag, coords.c_str(),
               msg.c_str());
  std::fflush(out);
}

}  // namespace trident::log
