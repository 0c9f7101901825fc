// Shared pieces of the libFuzzer targets (tests/fuzz/README.md): a per-process scratch directory,
// splitting one input into several files, and the rule every target enforces — a reader given bad
// bytes may only throw trident's DataError or InvalidArgument (whose messages name the file and
// the fix); any other exception, a crash or a sanitizer report is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident::fuzz {

// Separates the files of a multi-file input (seeds are written with it; libFuzzer learns it).
inline constexpr std::string_view kSeparator = "\n@@FILE@@\n";

// The scratch directory of this process: $TMPDIR/trident-fuzz-<pid>, created on first use and
// removed at exit. Every file a target writes lies in it.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path p = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
                              ("trident-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    static const std::string keep = p.string();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    trident::log::Settings quiet;  // readers log warnings per bad input; keep the run readable
    quiet.min_level = trident::log::Level::kError;
    trident::log::configure(quiet);
    return p.string();
  }();
  return dir;
}

inline std::string scratch_path(std::string_view name) {
  return scratch_dir() + "/" + std::string(name);
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// Splits `input` at kSeparator into exactly n parts (missing parts are empty; extra separators
// stay in the last part).
inline std::vector<std::string_view> split_input(const std::uint8_t* data, std::size_t size,
                                                 std::size_t n) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    const std::size_t at = rest.find(kSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kSeparator.size());
  }
  parts.push_back(rest);
  while (parts.size() < n) parts.emplace_back();
  return parts;
}

// Runs fn; DataError and InvalidArgument are the expected outcome of bad input. Anything else
// (InternalError — an assertion meant for bugs —, a std:: or library exception with no file
// name in it) aborts, so libFuzzer records the input as a crash. TRIDENT_FUZZ_VERBOSE=1 prints
// the expected errors too (to see what a reproducer or seed does).
template <class Fn>
void expect_clean_errors(const char* target, Fn&& fn) {
  static const bool verbose = std::getenv("TRIDENT_FUZZ_VERBOSE") != nullptr;
  try {
    fn();
  } catch (const trident::core::DataError& e) {
    if (verbose) std::fprintf(stderr, "%s: DataError: %s\n", target, e.what());
  } catch (const trident::core::InvalidArgument& e) {
    if (verbose) std::fprintf(stderr, "%s: InvalidArgument: %s\n", target, e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: bad input escaped as an unexpected exception: %s\n", target,
                 e.what());
    std::abort();
  }
}

}  // namespace trident::fuzz
