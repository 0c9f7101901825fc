// .npy reading (mmap) and writing, MD5, Python-compatible JSON text and numpy's pairwise sum; see
// index_cache.h. The .npy layout: "\x93NUMPY", major, minor, header length (u16 for 1.0, u32 for
// 2.0/3.0), then a Python dict literal padded with spaces and ended by '\n', then the raw data.
#include "trident/data/index_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "trident/core/error.h"

namespace trident::data {

using core::DataError;
using core::str;

static_assert(std::endian::native == std::endian::little,
              "index arrays are stored little-endian and mapped as they are");

std::int64_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::kI16:
      return 2;
    case IndexDType::kI32:
      return 4;
    case IndexDType::kU32:
      return 4;
    case IndexDType::kI64:
      return 8;
  }
  return 0;
}

const char* index_dtype_descr(IndexDType t) {
  switch (t) {
    case IndexDType::kI16:
      return "<i2";
    case IndexDType::kI32:
      return "<i4";
    case IndexDType::kU32:
      return "<u4";
    case IndexDType::kI64:
      return "<i8";
  }
  return "?";
}

std::int64_t IndexArray::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape_) n *= d;
  return n;
}

void IndexArray::check_shape(std::int64_t numel_stored) const {
  TRIDENT_ASSERT(shape_.size() == 1 || shape_.size() == 2, "index arrays have rank 1 or 2");
  TRIDENT_ASSERT(numel() == numel_stored, "shape does not match ", numel_stored, " elements");
}

std::int64_t IndexArray::at(std::int64_t i) const {
  const std::byte* p = data_.get() + i * index_dtype_size(dtype_);
  switch (dtype_) {
    case IndexDType::kI16: {
      std::int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case IndexDType::kI32: {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case IndexDType::kU32: {
      std::uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case IndexDType::kI64: {
      std::int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// .npy

namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr std::size_t kNpyMagicLen = 6;

// Parses the header dict numpy writes: {'descr': '<i4', 'fortran_order': False, 'shape': (N, 2), }
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

std::optional<std::string> dict_value(const std::string& h, const std::string& key) {
  const std::string quoted = "'" + key + "'";
  std::size_t p = h.find(quoted);
  if (p == std::string::npos) return std::nullopt;
  p = h.find(':', p + quoted.size());
  if (p == std::string::npos) return std::nullopt;
  ++p;
  while (p < h.size() && h[p] == ' ') ++p;
  if (p >= h.size()) return std::nullopt;
  std::size_t end = p;
  if (h[p] == '\'') {
    end = h.find('\'', p + 1);
    if (end == std::string::npos) return std::nullopt;
    return h.substr(p + 1, end - p - 1);
  }
  if (h[p] == '(') {
    end = h.find(')', p);
    if (end == std::string::npos) return std::nullopt;
    return h.substr(p, end - p + 1);
  }
  while (end < h.size() && h[end] != ',' && h[end] != '}') ++end;
  return h.substr(p, end - p);
}

NpyHeader parse_npy_header(const std::string& path, const std::string& h) {
  NpyHeader out;
  auto descr = dict_value(h, "descr");
  auto fortran = dict_value(h, "fortran_order");
  auto shape = dict_value(h, "shape");
  if (!descr || !fortran || !shape) {
    throw DataError(str(path, ": .npy header is not a numpy array header: ", h));
  }
  out.descr = *descr;
  if (*fortran != "True" && *fortran != "False") {
    throw DataError(str(path, ": fortran_order ", *fortran, " in .npy header is not True/False"));
  }
  out.fortran_order = (*fortran == "True");
  // shape: "(N,)" or "(N, M)" or "()"
  if (shape->size() < 2 || shape->front() != '(' || shape->back() != ')') {
    throw DataError(str(path, ": shape ", *shape, " in .npy header is not a tuple"));
  }
  std::string s = shape->substr(1, shape->size() - 2);
  std::size_t p = 0;
  while (p < s.size()) {
    while (p < s.size() && (s[p] == ' ' || s[p] == ',')) ++p;
    if (p >= s.size()) break;
    std::int64_t v = 0;
    auto [ptr, ec] = std::from_chars(s.data() + p, s.data() + s.size(), v);
    if (ec != std::errc() || v < 0) {
      throw DataError(str(path, ": bad shape ", *shape, " in .npy header"));
    }
    out.shape.push_back(v);
    p = static_cast<std::size_t>(ptr - s.data());
  }
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string t = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + (shape.size() == 1 ? ",)" : ")");
}

std::optional<IndexDType> dtype_from_descr(const std::string& d) {
  for (IndexDType t : {IndexDType::kI16, IndexDType::kI32, IndexDType::kI64, IndexDType::kU32}) {
    if (d == index_dtype_descr(t)) return t;
  }
  return std::nullopt;
}

std::string temp_name_for(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  return str(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
}

// Writes the pieces to a temporary file next to `path`, then renames it over `path`.
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  const std::string tmp = temp_name_for(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    throw DataError(str("cannot write ", path, ": ", std::strerror(errno),
                        " (set --data-cache-path to a writable directory)"));
  }
  bool ok = true;
  for (std::string_view p : pieces) {
    if (!p.empty() && std::fwrite(p.data(), 1, p.size(), f) != p.size()) ok = false;
  }
  if (std::fclose(f) != 0) ok = false;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw DataError(str("cannot write ", path, ": ", why));
  }
}

}  // namespace

IndexArray IndexArray::map_npy(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(str("cannot open ", path, ": ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError(str("cannot stat ", path, ": ", std::strerror(errno)));
  }
  const auto file_bytes = static_cast<std::size_t>(st.st_size);
  void* map = file_bytes > 0 ? ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  ::close(fd);
  if (file_bytes == 0 || map == MAP_FAILED) {
    throw DataError(str("cannot map ", path, file_bytes == 0 ? ": empty file" : ": mmap failed"));
  }
  std::shared_ptr<const std::byte> region(
      static_cast<const std::byte*>(map),
      [file_bytes](const std::byte* p) { ::munmap(const_cast<std::byte*>(p), file_bytes); });
  const std::byte* b = region.get();
  if (file_bytes < kNpyMagicLen + 4 || std::memcmp(b, kNpyMagic, kNpyMagicLen) != 0) {
    throw DataError(str(path, ": not a .npy file (bad magic at byte 0)"));
  }
  const auto major = static_cast<std::uint8_t>(b[6]);
  std::size_t header_len = 0, prefix = 0;
  if (major == 1) {
    std::uint16_t len;
    std::memcpy(&len, b + 8, 2);
    header_len = len;
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (file_bytes < 12) throw DataError(str(path, ": truncated .npy header"));
    std::uint32_t len;
    std::memcpy(&len, b + 8, 4);
    header_len = len;
    prefix = 12;
  } else {
    throw DataError(str(path, ": unsupported .npy format version ", int(major)));
  }
  if (prefix + header_len > file_bytes) throw DataError(str(path, ": truncated .npy header"));
  const std::string header(reinterpret_cast<const char*>(b + prefix), header_len);
  const NpyHeader h = parse_npy_header(path, header);
  const auto dtype = dtype_from_descr(h.descr);
  if (!dtype) {
    throw DataError(
        str(path, ": dtype '", h.descr, "' is not an index dtype (<i2, <i4, <i8, <u4)"));
  }
  if (h.fortran_order) throw DataError(str(path, ": Fortran-order arrays are not supported"));
  if (h.shape.size() != 1 && h.shape.size() != 2) {
    throw DataError(str(path, ": expected a 1-D or 2-D array, found rank ", h.shape.size()));
  }
  // The element count, without overflow: a shape with more elements than the file has bytes is
  // corrupt whatever the product would wrap to.
  std::uint64_t elements = 1;
  for (const std::int64_t d : h.shape) {
    if (d == 0) {
      elements = 0;
      break;
    }
  }
  for (const std::int64_t d : h.shape) {
    if (elements == 0) break;
    if (static_cast<std::uint64_t>(d) > file_bytes / elements) {
      throw DataError(str(path, ": shape ", shape_text(h.shape), " holds more elements than the ",
                          file_bytes, "-byte file (truncated or corrupt cache file)"));
    }
    elements *= static_cast<std::uint64_t>(d);
  }
  IndexArray a;
  a.dtype_ = *dtype;
  a.shape_ = h.shape;
  const std::size_t data_bytes =
      static_cast<std::size_t>(elements) * static_cast<std::size_t>(index_dtype_size(*dtype));
  if (prefix + header_len + data_bytes != file_bytes) {
    throw DataError(str(path, ": file has ", file_bytes, " bytes, expected ",
                        prefix + header_len + data_bytes, " for shape and dtype ", h.descr,
                        " (truncated or corrupt cache file)"));
  }
  a.data_ = std::shared_ptr<const std::byte>(region, b + prefix + header_len);
  return a;
}

void write_npy(const std::string& path, const IndexArray& a) {
  // numpy.lib.format: dict repr, then spaces so the first axis can grow to 21 digits in place,
  // then spaces and '\n' so that magic + length + header is a multiple of 64 bytes.
  std::string shape = "(";
  for (std::size_t i = 0; i < a.shape().size(); ++i) {
    if (i > 0) shape += ", ";
    shape += std::to_string(a.shape()[i]);
  }
  shape += a.shape().size() == 1 ? ",)" : ")";
  std::string header = str("{'descr': '", index_dtype_descr(a.dtype()),
                           "', 'fortran_order': False, 'shape': ", shape, ", }");
  const std::size_t first_digits = std::to_string(a.shape()[0]).size();
  header.append(first_digits < 21 ? 21 - first_digits : 0, ' ');
  const std::size_t hlen = header.size() + 1;
  const std::size_t pad = 64 - ((kNpyMagicLen + 2 + 2 + hlen) % 64);
  header.append(pad, ' ');
  header += '\n';
  TRIDENT_ASSERT(header.size() <= 65535, "npy header too long");
  std::string prefix(kNpyMagic, kNpyMagicLen);
  prefix += '\x01';
  prefix += '\x00';
  const auto len = static_cast<std::uint16_t>(header.size());
  prefix += static_cast<char>(len & 0xff);
  prefix += static_cast<char>(len >> 8);
  const auto data_bytes = static_cast<std::size_t>(a.numel() * index_dtype_size(a.dtype()));
  write_file_atomic(path, {prefix, header,
                           std::string_view(reinterpret_cast<const char*>(a.bytes()), data_bytes)});
}

void write_text_file(const std::string& path, std::string_view text) {
  write_file_atomic(path, {text});
}

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// MD5 (RFC 1321)

std::string md5_hex(std::string_view s) {
  // Per-round left-rotation amounts and the sine-derived constants of RFC 1321 §3.4.
  static const std::array<std::uint32_t, 64> kRotate = [] {
    const std::uint32_t r[4][4] = {
        {7, 12, 17, 22}, {5, 9, 14, 20}, {4, 11, 16, 23}, {6, 10, 15, 21}};
    std::array<std::uint32_t, 64> out{};
    for (int i = 0; i < 64; ++i) out[static_cast<std::size_t>(i)] = r[i / 16][i % 4];
    return out;
  }();
  static const std::array<std::uint32_t, 64> kSine = [] {
    std::array<std::uint32_t, 64> out{};
    for (int i = 0; i < 64; ++i) {
      out[static_cast<std::size_t>(i)] =
          static_cast<std::uint32_t>(std::floor(std::fabs(std::sin(i + 1.0)) * 4294967296.0));
    }
    return out;
  }();

  std::string msg(s);
  const std::uint64_t bit_len = static_cast<std::uint64_t>(s.size()) * 8;
  msg += '\x80';
  while (msg.size() % 64 != 56) msg += '\0';
  for (int i = 0; i < 8; ++i) msg += static_cast<char>((bit_len >> (8 * i)) & 0xff);

  std::uint32_t a0 = 0x67452301u, b0 = 0xefcdab89u, c0 = 0x98badcfeu, d0 = 0x10325476u;
  for (std::size_t block = 0; block < msg.size(); block += 64) {
    std::uint32_t m[16];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(msg.data() + block + 4 * i);
      m[i] = std::uint32_t(p[0]) | (std::uint32_t(p[1]) << 8) | (std::uint32_t(p[2]) << 16) |
             (std::uint32_t(p[3]) << 24);
    }
    std::uint32_t a = a0, b = b0, c = c0, d = d0;
    for (int i = 0; i < 64; ++i) {
      std::uint32_t f = 0;
      int g = 0;
      if (i < 16) {
        f = (b & c) | (~b & d);
        g = i;
      } else if (i < 32) {
        f = (d & b) | (~d & c);
        g = (5 * i + 1) % 16;
      } else if (i < 48) {
        f = b ^ c ^ d;
        g = (3 * i + 5) % 16;
      } else {
        f = c ^ (b | ~d);
        g = (7 * i) % 16;
      }
      const std::uint32_t sum = a + f + kSine[static_cast<std::size_t>(i)] + m[g];
      a = d;
      d = c;
      c = b;
      b = b + std::rotl(sum, static_cast<int>(kRotate[static_cast<std::size_t>(i)]));
    }
    a0 += a;
    b0 += b;
    c0 += c;
    d0 += d;
  }
  std::string hex;
  static const char* kDigits = "0123456789abcdef";
  for (std::uint32_t w : {a0, b0, c0, d0}) {
    for (int i = 0; i < 4; ++i) {
      const auto byte = (w >> (8 * i)) & 0xff;
      hex += kDigits[byte >> 4];
      hex += kDigits[byte & 0xf];
    }
  }
  return hex;
}

// ---------------------------------------------------------------------------------------------
// Python json.dumps(indent=4)

namespace {

// Python's repr(float): shortest round-trip digits; fixed notation when the decimal exponent is
// in [-4, 16), else d.ddde[+-]XX; always shows a '.' or an exponent.
std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const std::size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // digits d1 d2 ... mean 0.d1d2... * 10^decpt
  const int nd = static_cast<int>(digits.size());
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
    } else if (decpt < nd) {
      out = digits.substr(0, static_cast<std::size_t>(decpt)) + "." +
            digits.substr(static_cast<std::size_t>(decpt));
    } else {
      out = digits + std::string(static_cast<std::size_t>(decpt - nd), '0') + ".0";
    }
  } else {
    out = digits.substr(0, 1);
    if (nd > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    out += eb;
  }
  return sign + out;
}

void append_u_escape(std::string& out, std::uint32_t unit) {
  char b[8];
  std::snprintf(b, sizeof(b), "\\u%04x", unit);
  out += b;
}

std::string python_json_string(const std::string& s) {
  std::string out = "\"";
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20 || c == 0x7f) {
            append_u_escape(out, c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence; on any error emit the byte as a lone surrogate (surrogateescape).
    int len = (c >= 0xf0 && c <= 0xf4) ? 4 : (c >= 0xe0) ? 3 : (c >= 0xc2 && c < 0xe0) ? 2 : 0;
    if (c >= 0xf5) len = 0;
    std::uint32_t cp = 0;
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= s.size();
    if (ok) {
      cp = c & (0xffu >> (len + 1));
      for (int k = 1; k < len; ++k) {
        const auto cc = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
        if ((cc & 0xc0) != 0x80) {
          ok = false;
          break;
        }
        cp = (cp << 6) | (cc & 0x3f);
      }
      const std::uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
      if (ok && (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) ok = false;
    }
    if (!ok) {
      append_u_escape(out, 0xdc00u + c);
      ++i;
      continue;
    }
    if (cp >= 0x10000) {
      const std::uint32_t v = cp - 0x10000;
      append_u_escape(out, 0xd800 + (v >> 10));
      append_u_escape(out, 0xdc00 + (v & 0x3ff));
    } else {
      append_u_escape(out, cp);
    }
    i += static_cast<std::size_t>(len);
  }
  out += '"';
  return out;
}

void dump_value(const nlohmann::ordered_json& v, int depth, std::string& out) {
  const std::string inner(static_cast<std::size_t>(4 * (depth + 1)), ' ');
  const std::string outer(static_cast<std::size_t>(4 * depth), ' ');
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::null:
      out += "null";
      break;
    case nlohmann::ordered_json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case nlohmann::ordered_json::value_t::number_integer:
      out += std::to_string(v.get<std::int64_t>());
      break;
    case nlohmann::ordered_json::value_t::number_unsigned:
      out += std::to_string(v.get<std::uint64_t>());
      break;
    case nlohmann::ordered_json::value_t::number_float:
      out += python_float_repr(v.get<double>());
      break;
    case nlohmann::ordered_json::value_t::string:
      out += python_json_string(v.get_ref<const std::string&>());
      break;
    case nlohmann::ordered_json::value_t::array: {
      if (v.empty()) {
        out += "[]";
        break;
      }
      out += "[\n";
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ",\n";
        first = false;
        out += inner;
        dump_value(item, depth + 1, out);
      }
      out += "\n" + outer + "]";
      break;
    }
    case nlohmann::ordered_json::value_t::object: {
      if (v.empty()) {
        out += "{}";
        break;
      }
      out += "{\n";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ",\n";
        first = false;
        out += inner + python_json_string(it.key()) + ": ";
        dump_value(it.value(), depth + 1, out);
      }
      out += "\n" + outer + "}";
      break;
    }
    default:
      TRIDENT_ASSERT(false, "unsupported JSON value in a dataset description");
  }
}

double pairwise_sum(const double* a, std::size_t n) {
  if (n < 8) {
    double res = 0.0;
    for (std::size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (std::size_t j = 0; j < 8; ++j) r[j] = a[j];
    std::size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (std::size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  std::size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump_value(value, 0, out);
  return out;
}

double numpy_sum(const std::vector<double>& v) { return pairwise_sum(v.data(), v.size()); }

}  // namespace trident::data
