// Tensor file ("TRTF") reader/writer: round trips, the exact byte layout, and every DataError the
// reader raises for a bad file (magic, version, dtype, truncation at every length, trailing bytes).
#include "tensor_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "trident/core/error.h"

namespace trident::testing {
namespace {

namespace fs = std::filesystem;

// A fresh path under the system temp dir, removed (with its .tmp sibling) at scope exit.
class TempPath {
 public:
  explicit TempPath(const std::string& stem)
      : path_((fs::temp_directory_path() /
               (stem + "_" + std::to_string(reinterpret_cast<std::uintptr_t>(this)) + ".trtf"))
                  .string()) {}
  ~TempPath() {
    std::error_code ec;
    fs::remove(path_, ec);
    fs::remove(path_ + ".tmp", ec);
  }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void put_u32(std::vector<unsigned char>& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_i64(std::vector<unsigned char>& b, std::int64_t v) {
  for (int i = 0; i < 8; ++i) {
    b.push_back(static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i)));
  }
}

// The file holding one i32 tensor "ab" of shape (2,) = {1, -2}, built byte by byte from the spec.
std::vector<unsigned char> handmade_file() {
  std::vector<unsigned char> b = {'T', 'R', 'T', 'E', 'N', 'S', 'O', 'R'};
  put_u32(b, 1);  // version
  put_u32(b, 1);  // record count
  put_u32(b, 2);  // name length
  b.push_back('a');
  b.push_back('b');
  put_u32(b, 1);  // dtype i32
  put_u32(b, 1);  // ndim
  put_i64(b, 2);  // dims[0]
  put_u32(b, 1);
  put_u32(b, 0xfffffffeu);  // -2
  return b;
}

// Expects read_tensor_file(path) to throw DataError whose message contains `needle`.
void expect_data_error(const std::string& path, const std::string& needle) {
  try {
    read_tensor_file(path);
    ADD_FAILURE() << "no DataError for " << path << " (expected '" << needle << "')";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

TEST(TensorFile, RoundTripsEveryDtypeScalarsAndEmptyTensors) {
  TempPath path("roundtrip");
  const std::vector<NamedTensor> written = {
      make_f32_tensor("w", {2, 3}, {1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f}),
      make_i32_tensor("tokens_0", {1, 2}, {7, -1}),
      make_f64_tensor("loss_0", {}, {2.718281828459045}),
      make_i64_tensor("config", {3}, {50304, -5, int64_t{1} << 40}),
      make_f32_tensor("empty", {0, 4}, {}),
      make_f64_tensor("layers.0.mlp.dense_h_to_4h.weight", {1, 1, 1, 1}, {-0.0}),
  };
  write_tensor_file(path.str(), written);
  EXPECT_FALSE(fs::exists(path.str() + ".tmp"));

  const std::vector<NamedTensor> list = read_tensor_list(path.str());
  ASSERT_EQ(list.size(), written.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    EXPECT_EQ(list[i].name, written[i].name);  // file order is kept
    EXPECT_EQ(list[i].dtype, written[i].dtype) << list[i].name;
    EXPECT_EQ(list[i].shape, written[i].shape) << list[i].name;
    EXPECT_EQ(list[i].data, written[i].data) << list[i].name;
  }

  const auto map = read_tensor_file(path.str());
  EXPECT_EQ(find_tensor(map, "w").f32(),
            (std::vector<float>{1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f}));
  EXPECT_EQ(find_tensor(map, "tokens_0").i32(), (std::vector<std::int32_t>{7, -1}));
  EXPECT_EQ(find_tensor(map, "loss_0").numel(), 1);
  EXPECT_EQ(find_tensor(map, "loss_0").scalar(), 2.718281828459045);
  EXPECT_EQ(find_tensor(map, "config").i64()[2], int64_t{1} << 40);
  EXPECT_EQ(find_tensor(map, "config").to_f64(), (std::vector<double>{50304, -5, 1099511627776.0}));
  EXPECT_EQ(find_tensor(map, "empty").numel(), 0);
  EXPECT_TRUE(find_tensor(map, "empty").f32().empty());
  EXPECT_EQ(find_tensor(map, "w").to_f64()[3], 3.25);
}

TEST(TensorFile, WritesTheDocumentedBytes) {
  TempPath path("layout");
  write_tensor_file(path.str(), {make_i32_tensor("ab", {2}, {1, -2})});
  EXPECT_EQ(read_bytes(path.str()), handmade_file());

  write_bytes(path.str(), handmade_file());
  const auto map = read_tensor_file(path.str());
  EXPECT_EQ(find_tensor(map, "ab").i32(), (std::vector<std::int32_t>{1, -2}));
}

TEST(TensorFile, EmptyFileListRoundTrips) {
  TempPath path("none");
  write_tensor_file(path.str(), {});
  EXPECT_EQ(read_bytes(path.str()).size(), 16u);
  EXPECT_TRUE(read_tensor_file(path.str()).empty());
}

TEST(TensorFile, TypedAccessorRejectsOtherDtype) {
  const NamedTensor t = make_i32_tensor("labels_0", {2}, {1, 2});
  EXPECT_THROW(t.f32(), core::InvalidArgument);
  EXPECT_THROW(t.f64(), core::InvalidArgument);
  EXPECT_THROW(t.i64(), core::InvalidArgument);
  EXPECT_THROW(t.scalar(), core::InvalidArgument);
  EXPECT_EQ(t.to_f64(), (std::vector<double>{1.0, 2.0}));
}

TEST(TensorFile, MakerRejectsWrongValueCount) {
  EXPECT_THROW(make_f32_tensor("x", {2, 2}, {1.0f, 2.0f, 3.0f}), core::InvalidArgument);
}

TEST(TensorFile, WriterRejectsMalformedTensors) {
  TempPath path("bad_write");
  EXPECT_THROW(write_tensor_file(path.str(), {make_f32_tensor("", {1}, {1.0f})}),
               core::InvalidArgument);
  EXPECT_THROW(write_tensor_file(
                   path.str(), {make_f32_tensor("a", {1}, {1.0f}), make_i32_tensor("a", {1}, {1})}),
               core::InvalidArgument);
  NamedTensor short_data = make_f32_tensor("a", {2}, {1.0f, 2.0f});
  short_data.data.pop_back();
  EXPECT_THROW(write_tensor_file(path.str(), {short_data}), core::InvalidArgument);
  NamedTensor bad_dtype = make_f32_tensor("a", {1}, {1.0f});
  bad_dtype.dtype = 9;
  EXPECT_THROW(write_tensor_file(path.str(), {bad_dtype}), core::InvalidArgument);
  EXPECT_FALSE(fs::exists(path.str()));
}

TEST(TensorFile, MissingFileIsDataError) {
  expect_data_error("/nonexistent/dir/x.trtf", "cannot open");
}

TEST(TensorFile, BadMagicIsDataError) {
  TempPath path("magic");
  std::vector<unsigned char> b = handmade_file();
  b[0] = 'X';
  write_bytes(path.str(), b);
  expect_data_error(path.str(), "bad magic: expected TRTENSOR, found 'XRTENSOR' at byte 0");
}

TEST(TensorFile, UnsupportedVersionIsDataError) {
  TempPath path("version");
  std::vector<unsigned char> b = handmade_file();
  b[8] = 2;
  write_bytes(path.str(), b);
  expect_data_error(path.str(), "unsupported version 2");
}

TEST(TensorFile, UnknownDtypeIsDataError) {
  TempPath path("dtype");
  std::vector<unsigned char> b = handmade_file();
  b[16 + 4 + 2] = 7;  // dtype field of the first record
  write_bytes(path.str(), b);
  expect_data_error(path.str(), "unknown dtype code 7");
}

TEST(TensorFile, NegativeDimIsDataError) {
  TempPath path("negdim");
  std::vector<unsigned char> b = handmade_file();
  for (int i = 0; i < 8; ++i) b[16 + 4 + 2 + 8 + i] = 0xff;  // dims[0] = -1
  write_bytes(path.str(), b);
  expect_data_error(path.str(), "negative dim -1");
}

TEST(TensorFile, HugeShapeIsDataErrorNotAllocation) {
  TempPath path("huge");
  std::vector<unsigned char> b = handmade_file();
  for (int i = 0; i < 7; ++i) b[16 + 4 + 2 + 8 + i] = 0xff;  // dims[0] = 2^56 - 1
  write_bytes(path.str(), b);
  expect_data_error(path.str(), "larger than the file");
}

TEST(TensorFile, EveryTruncationIsDataError) {
  TempPath path("trunc");
  const std::vector<unsigned char> full = handmade_file();
  for (std::size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE("file cut to " + std::to_string(n) + " bytes");
    write_bytes(path.str(), std::vector<unsigned char>(full.begin(), full.begin() + n));
    expect_data_error(path.str(), "truncated");
  }
}

TEST(TensorFile, TrailingBytesAreDataError) {
  TempPath path("trailing");
  std::vector<unsigned char> b = handmade_file();
  b.push_back(0);
  write_bytes(path.str(), b);
  expect_data_error(path.str(), "1 trailing bytes after 1 records");
}

TEST(TensorFile, DuplicateNamesAreDataError) {
  TempPath path("dup");
  std::vector<unsigned char> b = handmade_file();
  const std::vector<unsigned char> record(b.begin() + 16, b.end());
  b.insert(b.end(), record.begin(), record.end());
  b[12] = 2;  // record count
  write_bytes(path.str(), b);
  expect_data_error(path.str(), "duplicate tensor name 'ab'");
}

TEST(TensorFile, FindTensorNamesWhatIsHeld) {
  std::map<std::string, NamedTensor> map;
  map.emplace("loss_0", make_f64_tensor("loss_0", {}, {1.0}));
  try {
    find_tensor(map, "loss_1");
    ADD_FAILURE() << "no DataError";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named 'loss_1' (1 held: loss_0)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trident::testing
