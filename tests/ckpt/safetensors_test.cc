// safetensors files: written in shards and read back (F32, BF16, F16, values exact where the
// dtype holds them, rounding to nearest even where not), the index transformers reads, and every
// malformed file refused with an error naming the file and the fault.
#include "trident/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "trident/core/error.h"

namespace trident::ckpt {
namespace {

namespace fs = std::filesystem;

fs::path tmp_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("trident_st_" + name + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(Safetensors, ShardsRoundTripEveryDtype) {
  const fs::path d = tmp_dir("rt");
  SafetensorsWriter w(d.string(), 64);  // 64 bytes per shard: several shards
  w.declare({"a", StDType::kF32, {3, 4}});
  w.declare({"b", StDType::kBF16, {5}});
  w.declare({"c", StDType::kF16, {2, 3}});
  w.declare({"d", StDType::kF32, {0}});
  // Values exact in every dtype, plus ones that must round.
  const std::vector<std::vector<float>> vals = {
      {1, -2, 0.5f, 3.25f, -0.0f, 1e-3f, 7, 8, 9, 10, 11, 12},
      {1.0f, -1.5f, 3.0f + 1.0f / 256, 65504.0f, 1.0f + 1.0f / 256},  // last: a tie
      {0.099976f, -65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1e6f,
       2.0f + 1.0f / 1024},  // last: a tie
      {}};
  const auto files = w.write([&](std::size_t i, std::span<float> out) {
    ASSERT_EQ(out.size(), vals[i].size());
    std::copy(vals[i].begin(), vals[i].end(), out.begin());
  });
  EXPECT_GT(files.size(), 2u);  // shards + index
  ASSERT_TRUE(fs::exists(d / "model.safetensors.index.json"));
  const SafetensorsModel m(d.string());
  EXPECT_EQ(m.names().size(), 4u);
  std::vector<float> a(12);
  m.file_of("a").read_f32("a", a.data());
  EXPECT_EQ(a, vals[0]);
  EXPECT_TRUE(std::signbit(a[4]));
  std::vector<float> b(5);
  m.file_of("b").read_f32("b", b.data());
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[2], 3.0f);      // 3 + 1/256 needs 10 mantissa bits: rounds to even
  EXPECT_EQ(b[3], 65536.0f);  // 65504 rounds up in BF16
  EXPECT_EQ(b[4], 1.0f);      // the tie goes to the even neighbour
  std::vector<float> c(6);
  m.file_of("c").read_f32("c", c.data());
  EXPECT_EQ(c[1], -65504.0f);
  EXPECT_EQ(c[2], 6.1035156e-05f);  // the smallest normal half
  EXPECT_EQ(c[3], 5.9604645e-08f);  // the smallest subnormal half
  EXPECT_TRUE(std::isinf(c[4]));    // beyond the half range
  EXPECT_EQ(c[5], 2.0f);            // tie -> even
  EXPECT_NEAR(c[0], 0.099976f, 1e-4);
  EXPECT_EQ(m.file_of("b").info("b").dtype, StDType::kBF16);
  fs::remove_all(d);
}

TEST(Safetensors, OneFileWhenItFits) {
  const fs::path d = tmp_dir("one");
  SafetensorsWriter w(d.string(), 1 << 20);
  w.declare({"x", StDType::kF32, {2}});
  w.write([](std::size_t, std::span<float> out) { out[0] = out[1] = 2; });
  EXPECT_TRUE(fs::exists(d / "model.safetensors"));
  EXPECT_FALSE(fs::exists(d / "model.safetensors.index.json"));
  const SafetensorsFile f((d / "model.safetensors").string());
  EXPECT_EQ(f.metadata().value("format", ""), "pt");  // transformers requires it
  fs::remove_all(d);
}

void write_raw(const fs::path& p, const std::string& header, std::size_t data_bytes,
               std::uint64_t claimed = 0) {
  std::ofstream out(p, std::ios::binary);
  const std::uint64_t n = claimed ? claimed : header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

void expect_refused(const fs::path& p, const std::string& fragment) {
  try {
    SafetensorsFile f(p.string());
    ADD_FAILURE() << p << " was accepted";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
}

TEST(Safetensors, MalformedFilesAreRefused) {
  const fs::path d = tmp_dir("bad");
  write_raw(d / "short", "", 0, 1);
  expect_refused(d / "short", "exceeds the file");
  write_raw(d / "json", "{not json", 0);
  expect_refused(d / "json", "malformed safetensors header");
  write_raw(d / "range", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_refused(d / "range", "data_offsets outside");
  write_raw(d / "size", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  expect_refused(d / "size", "bytes for shape");
  write_raw(d / "dtype", R"({"x":{"dtype":"I8","shape":[3],"data_offsets":[0,3]}})", 3);
  expect_refused(d / "dtype", "dtype I8 is not supported");
  EXPECT_THROW(SafetensorsModel(d.string()), core::DataError);  // neither file nor index
  fs::remove_all(d);
}

// Found by fuzz_safetensors (inputs in tests/fuzz/regressions/fuzz_safetensors/): each of these
// was undefined behaviour or a bare JSON exception naming no file before.
TEST(Safetensors, HostileHeadersAreRefusedNamingTheFault) {
  const fs::path d = tmp_dir("hostile");
  // A shape whose element count overflows int64 (with a zero dimension: 0 bytes claimed).
  write_raw(d / "overflow",
            R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0);
  expect_refused(d / "overflow", "bytes for shape");
  // Floats and negatives where integers belong (converting 1e300 to int64 is undefined).
  write_raw(d / "float", R"({"x":{"dtype":"F32","shape":[1e300],"data_offsets":[0,4]}})", 4);
  expect_refused(d / "float", "shape [1e+300] must hold non-negative integers");
  write_raw(d / "neg", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4);
  expect_refused(d / "neg", "data_offsets [-4,0] must hold non-negative integers");
  write_raw(d / "entry", R"({"x":[1,2]})", 0);
  expect_refused(d / "entry", "tensor x: the entry is not an object");
  // Two tensors sharing bytes.
  write_raw(d / "overlap",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8);
  expect_refused(d / "overlap", "tensors a and b overlap");
  // A tensor named twice: the JSON reader kept the second entry, and the first was lost silently.
  write_raw(d / "twice",
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            8);
  expect_refused(d / "twice", "the key \"a\" appears twice");
  fs::remove_all(d);
}

// An empty tensor read into an empty buffer (whose data() may be null): memcpy(nullptr, ..., 0)
// was undefined behaviour (found by fuzz_safetensors; fails under scripts/test-sanitizers).
TEST(Safetensors, EmptyTensorReadsNothing) {
  const fs::path d = tmp_dir("empty");
  for (const char* dtype : {"F32", "BF16", "F16"}) {
    write_raw(
        d / "e",
        std::string(R"({"e":{"dtype":")") + dtype + R"(","shape":[0,5],"data_offsets":[0,0]}})", 0);
    const SafetensorsFile f((d / "e").string());
    EXPECT_EQ(f.info("e").numel(), 0);
    f.read_f32("e", nullptr);
  }
  fs::remove_all(d);
}

TEST(Safetensors, IndexWithAWeightMapEntryThatIsNoFileName) {
  const fs::path d = tmp_dir("index");
  write_raw(d / "model-00001-of-00001.safetensors",
            R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  for (const char* map : {R"({"x": 7})", R"({"x": ".."})", R"({"x": "../model.safetensors"})"}) {
    std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": )" << map << "}";
    try {
      SafetensorsModel m(d.string());
      ADD_FAILURE() << map << " was accepted";
    } catch (const core::DataError& e) {
      EXPECT_NE(std::string(e.what()).find("model.safetensors.index.json"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("x"), std::string::npos) << e.what();
    }
  }
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map": {"x": "model-00001-of-00001.safetensors"}})";
  EXPECT_TRUE(SafetensorsModel(d.string()).has("x"));
  fs::remove_all(d);
}

}  // namespace
}  // namespace trident::ckpt
