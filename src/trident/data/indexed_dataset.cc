// Megatron indexed dataset: validating mmap reader and streaming writer (byte layout in
// docs/formats/indexed_dataset.md).
#include "trident/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "trident/core/error.h"

namespace trident::data {

using core::DataError;
using core::str;

namespace {

constexpr unsigned char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr std::int64_t kHeaderBytes = 34;  // magic 9 + version 8 + dtype 1 + counts 8 + 8

template <class T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string hex_bytes(const unsigned char* p, std::size_t n) {
  static const char* digits = "0123456789ABCDEF";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

// Maps a whole file read-only. An empty file maps to nullptr with size 0.
const unsigned char* map_file(const std::string& path, std::size_t& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw DataError(str("cannot open ", path, ": ", std::strerror(errno),
                        " (an indexed dataset prefix P needs both P.idx and P.bin)"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw DataError(str("cannot stat ", path, ": ", std::strerror(e)));
  }
  bytes = static_cast<std::size_t>(st.st_size);
  if (bytes == 0) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw DataError(str("cannot mmap ", path, ": ", std::strerror(e)));
  return static_cast<const unsigned char*>(p);
}

bool is_token_dtype(std::uint8_t code) { return (code >= 1 && code <= 5) || code == 8; }

}  // namespace

std::int64_t token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::kU8:
    case TokenDType::kI8:
      return 1;
    case TokenDType::kI16:
    case TokenDType::kU16:
      return 2;
    case TokenDType::kI32:
    case TokenDType::kF32:
      return 4;
    case TokenDType::kI64:
    case TokenDType::kF64:
      return 8;
  }
  TRIDENT_CHECK(false, "unknown token dtype code ", static_cast<int>(t));
  return 0;
}

TokenDType optimal_token_dtype(std::int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::kU16 : TokenDType::kI32;
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

template <class E, class F>
[[noreturn]] void fail(const std::string& path, std::int64_t offset, std::string_view what,
                       const E& expected, const F& found) {
  throw DataError(
      str(path, ": byte offset ", offset, ": ", what, ": expected ", expected, ", found ", found));
}

struct Header {
  TokenDType dtype;
  std::int64_t n, d;  // sequence count, document-index count
};

// Magic, version, dtype, and counts whose arrays exactly fill the file.
Header check_header(const unsigned char* idx, std::int64_t size, const std::string& path) {
  if (size < kHeaderBytes) {
    fail(path, size, "file ends inside the 34-byte header (truncated or not an index)",
         "at least 34 bytes", str(size, " bytes"));
  }
  if (std::memcmp(idx, kMagic, sizeof kMagic) != 0) {
    const bool legacy = std::memcmp(idx, "TNTIDX\0\0", 8) == 0;
    fail(path, 0,
         legacy ? "legacy 'lazy/cached' index (magic TNTIDX), not supported; re-run "
                  "preprocessing to get the mmap format"
                : "not a Megatron mmap index (bad magic)",
         "4D 4D 49 44 49 44 58 00 00 (\"MMIDIDX\\0\\0\")", hex_bytes(idx, 9));
  }
  const auto version = load<std::uint64_t>(idx + 9);
  if (version != 1) fail(path, 9, "unsupported index version", 1, version);
  const std::uint8_t code = idx[17];
  if (code == 6 || code == 7) {
    fail(path, 17, "floating-point token dtype (6 = float64, 7 = float32) cannot hold token ids",
         "1-5 or 8", static_cast<int>(code));
  }
  if (!is_token_dtype(code)) {
    fail(path, 17, "unknown dtype code",
         "1 (uint8), 2 (int8), 3 (int16), 4 (int32), 5 (int64) or 8 (uint16)",
         static_cast<int>(code));
  }
  const auto n = load<std::uint64_t>(idx + 18);
  const auto d = load<std::uint64_t>(idx + 26);
  // Compare counts with the file size before multiplying, so huge counts cannot overflow.
  if (n > static_cast<std::uint64_t>(size) / 12) {
    fail(path, 18, "sequence count too large for the file size", str("at most ", size / 12), n);
  }
  if (d > static_cast<std::uint64_t>(size) / 8) {
    fail(path, 26, "document index count too large for the file size", str("at most ", size / 8),
         d);
  }
  if (d < 1) fail(path, 26, "document index count (documents + 1)", "at least 1", d);
  const Header h{static_cast<TokenDType>(code), static_cast<std::int64_t>(n),
                 static_cast<std::int64_t>(d)};
  const std::int64_t expected = kHeaderBytes + 12 * h.n + 8 * h.d;
  // Megatron's multimodal variant appends one int8 mode per sequence; those bytes are allowed.
  if (size != expected && size != expected + h.n) {
    fail(path, size < expected ? size : expected,
         size < expected ? "file ends inside the arrays (truncated)"
                         : "unexpected bytes after the arrays",
         str(expected, " bytes in all (34 + 4*", n, " + 8*", n, " + 8*", d, ")"),
         str(size, " bytes"));
  }
  return h;
}

// Lengths and pointers describe the .bin exactly, sequence after sequence; document indices
// run from 0 to n without decreasing. Returns the token count.
std::int64_t check_arrays(const unsigned char* idx, const Header& h, std::int64_t bin_size,
                          const std::string& idx_path, const std::string& bin_path) {
  const std::int64_t item = token_dtype_size(h.dtype);
  const unsigned char* lengths = idx + kHeaderBytes;
  const unsigned char* pointers = lengths + 4 * h.n;
  std::int64_t next_pointer = 0, tokens = 0;
  for (std::int64_t i = 0; i < h.n; ++i) {
    const auto len = load<std::int32_t>(lengths + 4 * i);
    const auto ptr = load<std::int64_t>(pointers + 8 * i);
    if (len < 0) fail(idx_path, kHeaderBytes + 4 * i, str("length of sequence ", i), ">= 0", len);
    if (ptr != next_pointer) {
      fail(idx_path, kHeaderBytes + 4 * h.n + 8 * i,
           str("byte pointer of sequence ", i, " (previous pointer + length * ", item, ")"),
           next_pointer, ptr);
    }
    next_pointer += static_cast<std::int64_t>(len) * item;
    tokens += len;
  }
  if (next_pointer != bin_size) {
    throw DataError(str(bin_path, ": size does not match its index ", idx_path, ": expected ",
                        next_pointer, " bytes (", tokens, " tokens of ", item, " bytes), found ",
                        bin_size, " bytes"));
  }
  const unsigned char* docs = pointers + 8 * h.n;
  std::int64_t prev = -1;
  for (std::int64_t k = 0; k < h.d; ++k) {
    const auto v = load<std::int64_t>(docs + 8 * k);
    const std::int64_t off = kHeaderBytes + 12 * h.n + 8 * k;
    if (k == 0 && v != 0) fail(idx_path, off, "first document index", 0, v);
    if (v < prev || v > h.n) {
      fail(idx_path, off,
           str("document index ", k, " (non-decreasing, at most the sequence count)"),
           str(prev, "..", h.n), v);
    }
    prev = v;
  }
  if (prev != h.n) {
    fail(idx_path, kHeaderBytes + 12 * h.n + 8 * (h.d - 1),
         "last document index (= sequence count)", h.n, prev);
  }
  return tokens;
}

}  // namespace

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  idx_ = map_file(idx_path, idx_bytes_);
  try {
    bin_ = map_file(bin_path, bin_bytes_);
    const Header h = check_header(idx_, static_cast<std::int64_t>(idx_bytes_), idx_path);
    dtype_ = h.dtype;
    num_sequences_ = h.n;
    num_documents_ = h.d - 1;
    num_tokens_ = check_arrays(idx_, h, static_cast<std::int64_t>(bin_bytes_), idx_path, bin_path);
  } catch (...) {
    if (idx_) ::munmap(const_cast<unsigned char*>(idx_), idx_bytes_);
    if (bin_) ::munmap(const_cast<unsigned char*>(bin_), bin_bytes_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idx_) ::munmap(const_cast<unsigned char*>(idx_), idx_bytes_);
  if (bin_) ::munmap(const_cast<unsigned char*>(bin_), bin_bytes_);
}

std::int32_t IndexedDataset::sequence_length(std::int64_t i) const {
  TRIDENT_CHECK(i >= 0 && i < num_sequences_, "sequence ", i, " out of range [0, ", num_sequences_,
                ") in dataset ", prefix_);
  return load<std::int32_t>(idx_ + kHeaderBytes + 4 * i);
}

std::int64_t IndexedDataset::sequence_pointer(std::int64_t i) const {
  TRIDENT_CHECK(i >= 0 && i < num_sequences_, "sequence ", i, " out of range [0, ", num_sequences_,
                ") in dataset ", prefix_);
  return load<std::int64_t>(idx_ + kHeaderBytes + 4 * num_sequences_ + 8 * i);
}

std::vector<std::int32_t> IndexedDataset::sequence_lengths() const {
  std::vector<std::int32_t> v(static_cast<std::size_t>(num_sequences_));
  if (num_sequences_ > 0) std::memcpy(v.data(), idx_ + kHeaderBytes, 4 * v.size());
  return v;
}

std::vector<std::int64_t> IndexedDataset::document_indices() const {
  std::vector<std::int64_t> v(static_cast<std::size_t>(num_documents_ + 1));
  std::memcpy(v.data(), idx_ + kHeaderBytes + 12 * num_sequences_, 8 * v.size());
  return v;
}

namespace {
template <class T>
void convert(const unsigned char* src, std::int64_t count, std::int32_t* out) {
  for (std::int64_t k = 0; k < count; ++k) {
    out[k] = static_cast<std::int32_t>(load<T>(src + k * static_cast<std::int64_t>(sizeof(T))));
  }
}
}  // namespace

void IndexedDataset::read(std::int64_t i, std::int64_t offset, std::int64_t count,
                          std::int32_t* out) const {
  const std::int64_t len = sequence_length(i);
  TRIDENT_CHECK(offset >= 0 && count >= 0 && offset + count <= len, "tokens [", offset, ", ",
                offset + count, ") out of range for sequence ", i, " of length ", len,
                " in dataset ", prefix_);
  const unsigned char* src = bin_ + sequence_pointer(i) + offset * token_dtype_size(dtype_);
  switch (dtype_) {
    case TokenDType::kU8:
      convert<std::uint8_t>(src, count, out);
      break;
    case TokenDType::kI8:
      convert<std::int8_t>(src, count, out);
      break;
    case TokenDType::kI16:
      convert<std::int16_t>(src, count, out);
      break;
    case TokenDType::kU16:
      convert<std::uint16_t>(src, count, out);
      break;
    case TokenDType::kI32:
      convert<std::int32_t>(src, count, out);
      break;
    case TokenDType::kI64:
      convert<std::int64_t>(src, count, out);
      break;
    default:
      TRIDENT_ASSERT(false, "float dtype passed validation");
  }
}

std::vector<std::int32_t> IndexedDataset::sequence(std::int64_t i) const {
  std::vector<std::int32_t> v(static_cast<std::size_t>(sequence_length(i)));
  read(i, 0, static_cast<std::int64_t>(v.size()), v.data());
  return v;
}

// ---------------------------------------------------------------------------------------------
// Builder

struct IndexedDatasetBuilder::Impl {
  std::string prefix, bin_tmp, idx_tmp;
  TokenDType dtype;
  std::int64_t item = 0;
  std::FILE* bin = nullptr;
  std::vector<std::int32_t> lengths;
  std::vector<std::int64_t> doc_indices{0};
  std::vector<unsigned char> buf;
  bool finalized = false;

  void write(const void* p, std::size_t n, const std::string& path) {
    if (n && std::fwrite(p, 1, n, bin) != n) {
      throw DataError(str("cannot write ", path, ": ", std::strerror(errno)));
    }
  }
};

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& prefix, TokenDType dtype)
    : impl_(new Impl) {
  impl_->prefix = prefix;
  impl_->dtype = dtype;
  TRIDENT_CHECK(is_token_dtype(static_cast<std::uint8_t>(dtype)), "token dtype code ",
                static_cast<int>(dtype), " is not an integer dtype");
  impl_->item = token_dtype_size(dtype);
  const std::string tag = str(".tmp.", ::getpid());
  impl_->bin_tmp = prefix + ".bin" + tag;
  impl_->idx_tmp = prefix + ".idx" + tag;
  impl_->bin = std::fopen(impl_->bin_tmp.c_str(), "wb");
  if (!impl_->bin) {
    const std::string err = std::strerror(errno);
    delete impl_;
    throw DataError(
        str("cannot create ", prefix, ".bin (as temporary ", prefix, ".bin", tag, "): ", err));
  }
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!impl_->finalized) {  // abandoned: leave nothing behind
    if (impl_->bin) std::fclose(impl_->bin);
    std::remove(impl_->bin_tmp.c_str());
    std::remove(impl_->idx_tmp.c_str());
  }
  delete impl_;
}

void IndexedDatasetBuilder::add_sequence(std::span<const std::int32_t> tokens) {
  Impl& m = *impl_;
  TRIDENT_CHECK(!m.finalized, "add_sequence after finalize on ", m.prefix);
  TRIDENT_CHECK(tokens.size() <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
                "a sequence of ", tokens.size(), " tokens does not fit the int32 length field");
  std::int64_t lo = 0, hi = 0;
  switch (m.dtype) {
    case TokenDType::kU8:
      lo = 0, hi = 255;
      break;
    case TokenDType::kI8:
      lo = -128, hi = 127;
      break;
    case TokenDType::kI16:
      lo = -32768, hi = 32767;
      break;
    case TokenDType::kU16:
      lo = 0, hi = 65535;
      break;
    default:
      lo = std::numeric_limits<std::int32_t>::min(), hi = std::numeric_limits<std::int32_t>::max();
  }
  m.buf.resize(tokens.size() * static_cast<std::size_t>(m.item));
  unsigned char* dst = m.buf.data();
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    const std::int32_t t = tokens[k];
    TRIDENT_CHECK(t >= lo && t <= hi, "token id ", t, " does not fit the dataset dtype (code ",
                  static_cast<int>(m.dtype), ", range ", lo, "..", hi, ") of ", m.prefix,
                  "; a vocabulary of 65500 or more needs int32 (code 4)");
    switch (m.dtype) {
      case TokenDType::kU8:
      case TokenDType::kI8:
        dst[k] = static_cast<unsigned char>(t);
        break;
      case TokenDType::kI16:
      case TokenDType::kU16: {
        const auto v = static_cast<std::uint16_t>(t);
        std::memcpy(dst + 2 * k, &v, 2);
        break;
      }
      case TokenDType::kI32:
        std::memcpy(dst + 4 * k, &t, 4);
        break;
      default: {
        const auto v = static_cast<std::int64_t>(t);
        std::memcpy(dst + 8 * k, &v, 8);
      }
    }
  }
  m.write(m.buf.data(), m.buf.size(), m.bin_tmp);
  m.lengths.push_back(static_cast<std::int32_t>(tokens.size()));
}

void IndexedDatasetBuilder::end_document() {
  impl_->doc_indices.push_back(static_cast<std::int64_t>(impl_->lengths.size()));
}

void IndexedDatasetBuilder::add_dataset(const IndexedDataset& other) {
  Impl& m = *impl_;
  TRIDENT_CHECK(!m.finalized, "add_dataset after finalize on ", m.prefix);
  if (other.dtype() != m.dtype) {
    throw DataError(str("cannot merge ", other.prefix(), " into ", m.prefix, ": dtype code ",
                        static_cast<int>(other.dtype()), " differs from ",
                        static_cast<int>(m.dtype), " (datasets must share one tokenizer dtype)"));
  }
  const auto offset = static_cast<std::int64_t>(m.lengths.size());
  const std::vector<std::int32_t> lengths = other.sequence_lengths();
  m.lengths.insert(m.lengths.end(), lengths.begin(), lengths.end());
  const std::vector<std::int64_t> docs = other.document_indices();
  for (std::size_t k = 1; k < docs.size(); ++k) m.doc_indices.push_back(offset + docs[k]);
  if (other.num_sequences() > 0) {
    m.write(other.bin_, other.bin_bytes_, m.bin_tmp);
  }
}

void IndexedDatasetBuilder::finalize() {
  Impl& m = *impl_;
  TRIDENT_CHECK(!m.finalized, "finalize called twice on ", m.prefix);
  if (std::fflush(m.bin) != 0 || ::fsync(::fileno(m.bin)) != 0) {
    throw DataError(str("cannot write ", m.bin_tmp, ": ", std::strerror(errno)));
  }
  std::fclose(m.bin);
  m.bin = nullptr;
  // Index: header, int32 lengths, int64 byte pointers, int64 document indices.
  const auto n = static_cast<std::uint64_t>(m.lengths.size());
  const auto d = static_cast<std::uint64_t>(m.doc_indices.size());
  std::vector<unsigned char> idx(34 + 12 * n + 8 * d);
  unsigned char* p = idx.data();
  std::memcpy(p, kMagic, 9);
  const std::uint64_t version = 1;
  std::memcpy(p + 9, &version, 8);
  p[17] = static_cast<std::uint8_t>(m.dtype);
  std::memcpy(p + 18, &n, 8);
  std::memcpy(p + 26, &d, 8);
  if (n) std::memcpy(p + 34, m.lengths.data(), 4 * n);
  std::int64_t ptr = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::memcpy(p + 34 + 4 * n + 8 * i, &ptr, 8);
    ptr += static_cast<std::int64_t>(m.lengths[i]) * m.item;
  }
  std::memcpy(p + 34 + 12 * n, m.doc_indices.data(), 8 * d);
  std::FILE* f = std::fopen(m.idx_tmp.c_str(), "wb");
  if (!f) throw DataError(str("cannot create ", m.idx_tmp, ": ", std::strerror(errno)));
  const bool ok = std::fwrite(idx.data(), 1, idx.size(), f) == idx.size() && std::fflush(f) == 0 &&
                  ::fsync(::fileno(f)) == 0;
  std::fclose(f);
  if (!ok) throw DataError(str("cannot write ", m.idx_tmp, ": ", std::strerror(errno)));
  const std::string bin_final = m.prefix + ".bin", idx_final = m.prefix + ".idx";
  if (std::rename(m.bin_tmp.c_str(), bin_final.c_str()) != 0 ||
      std::rename(m.idx_tmp.c_str(), idx_final.c_str()) != 0) {
    throw DataError(str("cannot rename the temporary files to ", bin_final, " / ", idx_final, ": ",
                        std::strerror(errno)));
  }
  m.finalized = true;
}

}  // namespace trident::data
