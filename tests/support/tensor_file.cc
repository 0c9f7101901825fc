// Tensor file ("TRTF") reader and writer; the byte table is in docs/formats/tensor_file.md.
// Integers are little-endian; the element data is copied as-is, so this host must be little-endian.
#include "tensor_file.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>

#include "trident/core/error.h"

namespace trident::testing {
namespace {

using core::DataError;
using core::str;

static_assert(std::endian::native == std::endian::little,
              "tensor files store raw little-endian element data");

constexpr char kMagic[8] = {'T', 'R', 'T', 'E', 'N', 'S', 'O', 'R'};
constexpr std::uint32_t kVersion = 1;
// Sanity limits: a corrupt length field fails with a clear message instead of a huge allocation.
constexpr std::uint32_t kMaxNameBytes = 1 << 16;
constexpr std::uint32_t kMaxNdim = 16;

template <class T>
std::vector<T> copy_elements(const NamedTensor& t, int want) {
  TRIDENT_CHECK(t.dtype == want, "tensor '", t.name, "' is ", tensor_dtype_name(t.dtype), ", not ",
                tensor_dtype_name(want));
  TRIDENT_CHECK(static_cast<std::int64_t>(t.data.size()) == t.numel() * std::int64_t{sizeof(T)},
                "tensor '", t.name, "' holds ", t.data.size(), " bytes for ", t.numel(),
                " elements");
  std::vector<T> out(static_cast<std::size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), t.data.data(), t.data.size());
  return out;
}

template <class T>
NamedTensor make_tensor(std::string name, std::vector<std::int64_t> shape, int dtype,
                        const std::vector<T>& values) {
  NamedTensor t{.name = std::move(name), .dtype = dtype, .shape = std::move(shape), .data = {}};
  TRIDENT_CHECK(t.numel() == static_cast<std::int64_t>(values.size()), "tensor '", t.name,
                "': shape has ", t.numel(), " elements but ", values.size(), " values were given");
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

void append_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

void append_i64(std::vector<unsigned char>& out, std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(u >> (8 * i)));
}

// Reads fields from the file image, throwing DataError with the path and offset when short.
class Cursor {
 public:
  Cursor(const std::string& path, const std::vector<unsigned char>& bytes)
      : path_(path), bytes_(bytes) {}

  std::size_t offset() const { return pos_; }
  std::size_t remaining() const { return bytes_.size() - pos_; }

  const unsigned char* take(std::size_t n, const char* what) {
    if (n > remaining()) {
      throw DataError(str(path_, ": truncated at byte ", pos_, ": need ", n, " bytes for ", what,
                          ", file has ", remaining(), " left"));
    }
    const unsigned char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::uint32_t u32(const char* what) {
    const unsigned char* p = take(4, what);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{p[i]} << (8 * i);
    return v;
  }
  std::int64_t i64(const char* what) {
    const unsigned char* p = take(8, what);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{p[i]} << (8 * i);
    return static_cast<std::int64_t>(v);
  }
  [[noreturn]] void fail(std::size_t at, const std::string& msg) const {
    throw DataError(str(path_, ": ", msg, " at byte ", at));
  }

 private:
  const std::string& path_;
  const std::vector<unsigned char>& bytes_;
  std::size_t pos_ = 0;
};

std::vector<unsigned char> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(str(path, ": cannot open tensor file"));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  if (in.bad()) throw DataError(str(path, ": read error"));
  return bytes;
}

NamedTensor read_record(Cursor& cur, std::size_t index) {
  NamedTensor t;
  const std::size_t name_at = cur.offset();
  const std::uint32_t name_len = cur.u32("name length");
  if (name_len == 0 || name_len > kMaxNameBytes) {
    cur.fail(name_at, str("record ", index, ": name length ", name_len, " outside [1, ",
                          kMaxNameBytes, "]"));
  }
  const unsigned char* name = cur.take(name_len, "name");
  t.name.assign(reinterpret_cast<const char*>(name), name_len);

  const std::size_t dtype_at = cur.offset();
  const std::uint32_t dtype = cur.u32("dtype");
  if (dtype > static_cast<std::uint32_t>(kTensorI64)) {
    cur.fail(dtype_at, str("tensor '", t.name, "': unknown dtype code ", dtype,
                           " (expected 0=f32, 1=i32, 2=f64, 3=i64)"));
  }
  t.dtype = static_cast<int>(dtype);

  const std::size_t ndim_at = cur.offset();
  const std::uint32_t ndim = cur.u32("ndim");
  if (ndim > kMaxNdim) {
    cur.fail(ndim_at, str("tensor '", t.name, "': ndim ", ndim, " exceeds ", kMaxNdim));
  }
  // numel is bounded by the bytes left in the file, so the product cannot overflow unnoticed.
  const auto max_numel = static_cast<std::int64_t>(cur.remaining());
  std::int64_t numel = 1;
  for (std::uint32_t d = 0; d < ndim; ++d) {
    const std::size_t dim_at = cur.offset();
    const std::int64_t dim = cur.i64("dim");
    if (dim < 0) cur.fail(dim_at, str("tensor '", t.name, "': negative dim ", dim));
    t.shape.push_back(dim);
    if (numel != 0 && dim > max_numel / numel) {
      cur.fail(dim_at, str("tensor '", t.name, "': shape larger than the file"));
    }
    numel *= dim;
  }
  const std::int64_t elem = tensor_dtype_size(t.dtype);
  if (numel > static_cast<std::int64_t>(cur.remaining()) / elem) {
    cur.fail(cur.offset(), str("truncated: tensor '", t.name, "' needs ", numel * elem,
                               " data bytes, file has ", cur.remaining(), " left"));
  }
  const auto nbytes = static_cast<std::size_t>(numel * elem);
  const unsigned char* data = cur.take(nbytes, "tensor data");
  t.data.assign(data, data + nbytes);
  return t;
}

}  // namespace

std::int64_t tensor_dtype_size(int dtype) {
  switch (dtype) {
    case kTensorF32:
      return 4;
    case kTensorI32:
      return 4;
    case kTensorF64:
      return 8;
    case kTensorI64:
      return 8;
  }
  TRIDENT_CHECK(false, "unknown tensor dtype code ", dtype,
                " (expected 0=f32, 1=i32, 2=f64, 3=i64)");
  return 0;
}

std::string tensor_dtype_name(int dtype) {
  switch (dtype) {
    case kTensorF32:
      return "f32";
    case kTensorI32:
      return "i32";
    case kTensorF64:
      return "f64";
    case kTensorI64:
      return "i64";
  }
  return str("dtype(", dtype, ")");
}

std::int64_t NamedTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::vector<float> NamedTensor::f32() const { return copy_elements<float>(*this, kTensorF32); }
std::vector<std::int32_t> NamedTensor::i32() const {
  return copy_elements<std::int32_t>(*this, kTensorI32);
}
std::vector<double> NamedTensor::f64() const { return copy_elements<double>(*this, kTensorF64); }
std::vector<std::int64_t> NamedTensor::i64() const {
  return copy_elements<std::int64_t>(*this, kTensorI64);
}

std::vector<double> NamedTensor::to_f64() const {
  switch (dtype) {
    case kTensorF32: {
      const std::vector<float> v = f32();
      return {v.begin(), v.end()};
    }
    case kTensorI32: {
      const std::vector<std::int32_t> v = i32();
      return {v.begin(), v.end()};
    }
    case kTensorF64:
      return f64();
    case kTensorI64: {
      const std::vector<std::int64_t> v = i64();
      std::vector<double> out(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(v[i]);
      return out;
    }
  }
  TRIDENT_CHECK(false, "tensor '", name, "' has unknown dtype code ", dtype);
  return {};
}

double NamedTensor::scalar() const {
  TRIDENT_CHECK(numel() == 1, "tensor '", name, "' has ", numel(), " elements, not one");
  return to_f64()[0];
}

NamedTensor make_f32_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<float>& values) {
  return make_tensor(std::move(name), std::move(shape), kTensorF32, values);
}
NamedTensor make_i32_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<std::int32_t>& values) {
  return make_tensor(std::move(name), std::move(shape), kTensorI32, values);
}
NamedTensor make_f64_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<double>& values) {
  return make_tensor(std::move(name), std::move(shape), kTensorF64, values);
}
NamedTensor make_i64_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<std::int64_t>& values) {
  return make_tensor(std::move(name), std::move(shape), kTensorI64, values);
}

void write_tensor_file(const std::string& path, const std::vector<NamedTensor>& tensors) {
  TRIDENT_CHECK(tensors.size() <= std::numeric_limits<std::uint32_t>::max(),
                "too many tensors for one file: ", tensors.size());
  std::vector<unsigned char> out(std::begin(kMagic), std::end(kMagic));
  append_u32(out, kVersion);
  append_u32(out, static_cast<std::uint32_t>(tensors.size()));
  std::set<std::string> names;
  for (const NamedTensor& t : tensors) {
    TRIDENT_CHECK(!t.name.empty() && t.name.size() <= kMaxNameBytes, "tensor name length ",
                  t.name.size(), " outside [1, ", kMaxNameBytes, "]");
    TRIDENT_CHECK(names.insert(t.name).second, "duplicate tensor name '", t.name, "'");
    TRIDENT_CHECK(t.shape.size() <= kMaxNdim, "tensor '", t.name, "' has ", t.shape.size(),
                  " dims, at most ", kMaxNdim, " allowed");
    for (std::int64_t d : t.shape) TRIDENT_CHECK(d >= 0, "tensor '", t.name, "' has dim ", d);
    TRIDENT_CHECK(
        static_cast<std::int64_t>(t.data.size()) == t.numel() * tensor_dtype_size(t.dtype),
        "tensor '", t.name, "' (", tensor_dtype_name(t.dtype), ", ", t.numel(), " elements) holds ",
        t.data.size(), " bytes");
    append_u32(out, static_cast<std::uint32_t>(t.name.size()));
    out.insert(out.end(), t.name.begin(), t.name.end());
    append_u32(out, static_cast<std::uint32_t>(t.dtype));
    append_u32(out, static_cast<std::uint32_t>(t.shape.size()));
    for (std::int64_t d : t.shape) append_i64(out, d);
    out.insert(out.end(), t.data.begin(), t.data.end());
  }

  const std::string tmp = path + ".tmp";
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    if (!file) throw DataError(str(tmp, ": cannot open for writing"));
    file.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    file.close();
    if (!file) throw DataError(str(tmp, ": write failed (", out.size(), " bytes)"));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw DataError(str(path, ": cannot rename from ", tmp, ": ", ec.message()));
}

std::vector<NamedTensor> read_tensor_list(const std::string& path) {
  const std::vector<unsigned char> bytes = read_whole_file(path);
  Cursor cur(path, bytes);
  const unsigned char* magic = cur.take(sizeof(kMagic), "magic");
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    std::string found;
    for (std::size_t i = 0; i < sizeof(kMagic); ++i) {
      const unsigned char c = magic[i];
      found += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
    }
    cur.fail(0, str("bad magic: expected TRTENSOR, found '", found, "'"));
  }
  const std::uint32_t version = cur.u32("version");
  if (version != kVersion) {
    cur.fail(8, str("unsupported version ", version, " (this reader knows ", kVersion, ")"));
  }
  const std::uint32_t count = cur.u32("record count");
  std::vector<NamedTensor> tensors;
  std::set<std::string> names;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t record_at = cur.offset();
    NamedTensor t = read_record(cur, i);
    if (!names.insert(t.name).second) {
      cur.fail(record_at, str("duplicate tensor name '", t.name, "'"));
    }
    tensors.push_back(std::move(t));
  }
  if (cur.remaining() != 0) {
    cur.fail(cur.offset(), str(cur.remaining(), " trailing bytes after ", count, " records"));
  }
  return tensors;
}

std::map<std::string, NamedTensor> read_tensor_file(const std::string& path) {
  std::map<std::string, NamedTensor> out;
  for (NamedTensor& t : read_tensor_list(path)) {
    std::string name = t.name;
    out.emplace(std::move(name), std::move(t));
  }
  return out;
}

const NamedTensor& find_tensor(const std::map<std::string, NamedTensor>& tensors,
                               const std::string& name) {
  const auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  std::string held;
  std::size_t shown = 0;
  for (const auto& [key, _] : tensors) {
    if (shown++ == 20) {
      held += ", ...";
      break;
    }
    held += (held.empty() ? "" : ", ") + key;
  }
  throw DataError(str("no tensor named '", name, "' (", tensors.size(), " held: ", held, ")"));
}

}  // namespace trident::testing
