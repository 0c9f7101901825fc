// Mt19937 against numpy.random.RandomState: numpy writes its outputs in this test run
// (tests/data/reference/numpy_mt19937.py), and every shuffle, raw draw and bounded draw must match
// bit for bit. Also the .npy writer, MD5 and Python-JSON helpers of index_cache.h.
#include "trident/data/mt19937.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "reference/reference_util.h"
#include "trident/core/error.h"
#include "trident/data/index_cache.h"

namespace trident::data {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

TEST(Mt19937, MatchesNumpyRandomState) {
  const TempDir tmp;
  const fs::path dir(tmp.path());
  ASSERT_TRUE(testing::run_reference("numpy_mt19937.py", {dir.string()}));
  std::ifstream in(dir / "manifest.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json manifest = nlohmann::json::parse(in);
  const auto& cases = manifest.at("cases");
  ASSERT_GE(cases.size(), 100u) << "the reference wrote too few cases to mean anything";
  std::int64_t checked = 0;
  for (const auto& c : cases) {
    const std::string file = c.at("file");
    const IndexArray expected = IndexArray::map_npy((dir / file).string());
    Mt19937 rng(c.at("seed").get<std::uint32_t>());
    std::vector<std::int64_t> got;
    const std::string kind = c.at("kind");
    if (kind == "shuffle") {
      const std::string dtype = c.at("dtype");
      for (std::int64_t n : c.at("lengths").get<std::vector<std::int64_t>>()) {
        auto run = [&](auto zero) {
          using T = decltype(zero);
          std::vector<T> a(static_cast<std::size_t>(n));
          std::iota(a.begin(), a.end(), T{0});
          rng.shuffle(std::span<T>(a));
          got.insert(got.end(), a.begin(), a.end());
        };
        if (dtype == "int32") run(std::int32_t{0});
        if (dtype == "uint32") run(std::uint32_t{0});
        if (dtype == "int64") run(std::int64_t{0});
      }
    } else if (kind == "raw32") {
      for (int k = 0; k < c.at("count").get<int>(); ++k) got.push_back(rng.next_uint32());
    } else if (kind == "interval") {
      const auto max = c.at("max").get<std::uint64_t>();
      for (int k = 0; k < c.at("count").get<int>(); ++k) {
        got.push_back(static_cast<std::int64_t>(rng.random_interval(max)));
      }
    } else {
      FAIL() << "unknown case kind " << kind;
    }
    ASSERT_EQ(static_cast<std::int64_t>(got.size()), expected.numel()) << file;
    for (std::int64_t i = 0; i < expected.numel(); ++i) {
      ASSERT_EQ(got[static_cast<std::size_t>(i)], expected.at(i)) << file << " element " << i;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<std::int64_t>(cases.size()));
}

TEST(Mt19937, FirstOutputsOfTheReferenceGenerator) {
  // init_genrand(5489) is the reference implementation's default seed; its first outputs are
  // published with mt19937ar.c and are independent of numpy.
  Mt19937 rng(5489);
  EXPECT_EQ(rng.next_uint32(), 3499211612u);
  EXPECT_EQ(rng.next_uint32(), 581869302u);
  EXPECT_EQ(rng.next_uint32(), 3890346734u);
  EXPECT_EQ(rng.random_interval(0), 0u);  // no draw for max == 0
}

TEST(IndexCache, Md5KnownVectors) {
  // RFC 1321 appendix A.5.
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_hex("message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
  EXPECT_EQ(
      md5_hex("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
      "57edf4a22be3c955ac49da2e2107b67a");
}

TEST(IndexCache, PythonJsonDumps) {
  nlohmann::ordered_json v;
  v["class"] = "GPTDataset";
  v["n"] = nullptr;
  v["m"] = nlohmann::ordered_json::array({nlohmann::ordered_json::array({0, 0.969}), nullptr, 1.0,
                                          1e-05, 1e16, 123456789012345.0, 0.1 + 0.2});
  v["empty"] = nlohmann::ordered_json::array();
  v["s"] = "a\"b\\c\n\x7f\xc3\xa9\xf0\x9f\x98\x80\xff";
  EXPECT_EQ(python_json_dumps(v),
            "{\n"
            "    \"class\": \"GPTDataset\",\n"
            "    \"n\": null,\n"
            "    \"m\": [\n"
            "        [\n"
            "            0,\n"
            "            0.969\n"
            "        ],\n"
            "        null,\n"
            "        1.0,\n"
            "        1e-05,\n"
            "        1e+16,\n"
            "        123456789012345.0,\n"
            "        0.30000000000000004\n"
            "    ],\n"
            "    \"empty\": [],\n"
            "    \"s\": \"a\\\"b\\\\c\\n\\u007f\\u00e9\\ud83d\\ude00\\udcff\"\n"
            "}");
}

TEST(IndexCache, NpyRoundTripAndCorruption) {
  const TempDir tmp;
  const std::string path = tmp / "a.npy";
  write_npy(path, IndexArray::from_vector(std::vector<std::int32_t>{1, -2, 3, 4, 5, 6}, {3, 2}));
  const IndexArray a = IndexArray::map_npy(path);
  EXPECT_EQ(a.dtype(), IndexDType::kI32);
  EXPECT_EQ(a.shape(), (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(a.at(1), -2);
  EXPECT_EQ(fs::file_size(path), 128u + 24u);  // numpy pads this header to 128 bytes
  fs::resize_file(path, fs::file_size(path) - 4);
  EXPECT_THROW(IndexArray::map_npy(path), core::DataError);
  std::ofstream(path) << "not numpy";
  EXPECT_THROW(IndexArray::map_npy(path), core::DataError);
}

// A shape that is no tuple made the header parser throw std::out_of_range (found by fuzz_npy,
// tests/fuzz), and a shape whose element count overflows int64 could wrap to the file size and
// map an array larger than the file (found while fixing the first). Both must be DataError naming
// the file.
TEST(IndexCache, NpyHeaderShapeIsValidated) {
  const TempDir tmp;
  const std::string path = tmp / "h.npy";
  auto write_header = [&](const std::string& dict, std::size_t data_bytes) {
    std::string header = dict;
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string file = std::string("\x93NUMPY\x01\x00", 8);
    file += static_cast<char>(header.size() & 0xff);
    file += static_cast<char>(header.size() >> 8);
    file += header + std::string(data_bytes, '\0');
    std::ofstream(path, std::ios::binary) << file;
  };
  auto error_of = [&] {
    try {
      IndexArray::map_npy(path);
    } catch (const core::DataError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  write_header("{'descr': '<i4', 'fortran_order': False, 'shape': }", 16);
  EXPECT_NE(error_of().find("is not a tuple"), std::string::npos) << error_of();
  write_header("{'descr': '<i4', 'fortran_order': False, 'shape': 7, }", 28);
  EXPECT_NE(error_of().find("is not a tuple"), std::string::npos) << error_of();
  // 2^62 * 4 elements of 4 bytes wrap to 0 bytes in 64 bits.
  write_header("{'descr': '<i4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 0);
  EXPECT_NE(error_of().find("holds more elements than the"), std::string::npos) << error_of();
  write_header("{'descr': '<i4', 'fortran_order': Maybe, 'shape': (2,), }", 8);
  EXPECT_NE(error_of().find("is not True/False"), std::string::npos) << error_of();
  write_header("{'descr': '<i4', 'fortran_order': False, 'shape': (0, 4611686018427387904), }", 0);
  EXPECT_EQ(IndexArray::map_npy(path).numel(), 0);  // an empty array is fine
}

}  // namespace
}  // namespace trident::data
