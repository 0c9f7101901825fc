// Helpers for the data tests that compare with references nobody here wrote: where the shared
// data and the reference scripts are, running the reference Python (Hugging Face tokenizers,
// megatron-core) and reading what it writes. A missing reference is a test failure, never a skip.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace trident::data::testing {

// The repository root: from this header's own path (tests/data/reference/reference_util.h) when
// the compiler recorded it absolute, else the first folder above the working directory that
// holds this header.
inline std::string source_dir() {
  const std::filesystem::path here(__FILE__);
  if (here.is_absolute()) return here.parent_path().parent_path().parent_path().parent_path();
  for (auto p = std::filesystem::current_path(); !p.empty(); p = p.parent_path()) {
    if (std::filesystem::exists(p / "tests/data/reference/reference_util.h")) return p;
    if (p == p.root_path()) break;
  }
  ADD_FAILURE() << "cannot find the repository root from " << std::filesystem::current_path();
  return ".";
}

// shared/data: $TRIDENT_SHARED_DATA, else ../shared/data beside the repository, else
// /work/shared/data.
inline std::string shared_data() {
  if (const char* env = std::getenv("TRIDENT_SHARED_DATA")) return env;
  for (const std::string& p :
       {source_dir() + "/../shared/data", std::string("/work/shared/data")}) {
    if (std::filesystem::exists(p + "/README.md")) return std::filesystem::canonical(p);
  }
  ADD_FAILURE() << "shared data not found: set TRIDENT_SHARED_DATA to the shared/data folder";
  return "/nonexistent-shared-data";
}

// The reference interpreter: $TRIDENT_REF_PYTHON, else /opt/trident-pyref/bin/python (made by
// scripts/install-python-deps).
inline std::string ref_python() {
  if (const char* env = std::getenv("TRIDENT_REF_PYTHON")) return env;
  const std::string p = "/opt/trident-pyref/bin/python";
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << p << " not found: run scripts/install-python-deps (it installs Hugging Face "
                  << "tokenizers and megatron-core for the reference checks)";
  }
  return p;
}

inline std::string reference_script(const std::string& name) {
  return source_dir() + "/tests/data/reference/" + name;
}

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command; returns its exit status and puts stdout+stderr in *output.
inline int run_command(const std::string& cmd, std::string* output = nullptr) {
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs `ref_python() script args...` and fails the test (returning false) on a non-zero exit.
inline bool run_reference(const std::string& script, const std::vector<std::string>& args) {
  std::ostringstream os;  // (string += in a loop trips a GCC 12 -Wrestrict false positive)
  os << shell_quote(ref_python()) << ' ' << shell_quote(reference_script(script));
  for (const auto& a : args) os << ' ' << shell_quote(a);
  const std::string cmd = os.str();
  std::string out;
  const int rc = run_command(cmd, &out);
  EXPECT_EQ(rc, 0) << "reference command failed: " << cmd << "\n" << out;
  return rc == 0;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

inline std::vector<std::int32_t> read_int32s(const std::string& path) {
  const std::string b = read_bytes(path);
  std::vector<std::int32_t> v(b.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// A fresh directory under $TMPDIR (or /tmp), removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/trident-data-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs f and expects an exception of type E whose message contains every one of `pieces`.
template <class E, class F>
void expect_error(F f, const std::vector<std::string>& pieces) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown (expected one mentioning '"
                  << (pieces.empty() ? "" : pieces[0]) << "')";
  } catch (const E& e) {
    for (const auto& p : pieces) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
    }
  }
}

// Index and context of the first difference between two id sequences, for failure messages.
inline std::string first_difference(const std::vector<std::int32_t>& got,
                                    const std::vector<std::int32_t>& want) {
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return "identical";
  auto around = [&](const std::vector<std::int32_t>& v) {
    std::ostringstream os;
    for (std::size_t k = i >= 3 ? i - 3 : 0; k < v.size() && k < i + 5; ++k) {
      if (k == i) {
        os << '[' << v[k] << "] ";
      } else {
        os << v[k] << ' ';
      }
    }
    return os.str();
  };
  std::ostringstream os;
  os << "first difference at index " << i << " (lengths " << got.size() << " vs " << want.size()
     << "): trident " << around(got) << "| reference " << around(want);
  return os.str();
}

}  // namespace trident::data::testing
