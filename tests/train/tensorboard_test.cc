// trident's TensorBoard event files, read back by TensorBoard's own reader (pip tensorboard, in
// the reference venv made by scripts/install-python-deps).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "trident/train/tensorboard_writer.h"

namespace trident::train {
namespace {

namespace fs = std::filesystem;

std::string ref_python() {
  if (const char* p = std::getenv("TRIDENT_REF_PYTHON")) return p;
  return "/opt/trident-pyref/bin/python";
}

TEST(Crc32c, KnownValues) {
  // RFC 3720 (iSCSI) test vectors.
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  std::string ones(32, '\xFF');
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc += static_cast<char>(i);
  EXPECT_EQ(crc32c(inc.data(), inc.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
}

TEST(TensorBoardWriter, TensorBoardReadsTheScalars) {
  const fs::path dir = fs::temp_directory_path() / ("trident_tb_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    TensorBoardWriter w(dir.string());
    ASSERT_TRUE(w.enabled());
    for (int it = 1; it <= 5; ++it) {
      w.add_scalar("lm loss", 10.0 - it, it);
      w.add_scalar("lm loss vs samples", 10.0 - it, it * 16);
      w.add_scalar("learning-rate", 1e-4 * it, it);
    }
    w.add_scalar("lm loss validation", 3.25, 5);
  }
  const fs::path out = dir / "read.json";
  const std::string cmd = ref_python() + " " + TRIDENT_SOURCE_DIR +
                          "/tests/train/reference/read_tensorboard.py " + dir.string() + " " +
                          out.string() + " > " + (dir / "read.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << std::ifstream(dir / "read.log").rdbuf() << " (run scripts/install-python-deps)";
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["files"], 1);
  const nlohmann::json& t = j["tags"];
  ASSERT_TRUE(t.contains("lm loss")) << t.dump();
  ASSERT_EQ(t["lm loss"].size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(t["lm loss"][i][0], i + 1);
    EXPECT_FLOAT_EQ(t["lm loss"][i][1].get<float>(), static_cast<float>(9.0 - i));
    EXPECT_EQ(t["lm loss vs samples"][i][0], (i + 1) * 16);
    EXPECT_FLOAT_EQ(t["learning-rate"][i][1].get<float>(), static_cast<float>(1e-4 * (i + 1)));
  }
  EXPECT_FLOAT_EQ(t["lm loss validation"][0][1].get<float>(), 3.25f);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trident::train
