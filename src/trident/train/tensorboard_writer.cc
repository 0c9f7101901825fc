#include "trident/train/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "trident/core/error.h"

namespace trident::train {

namespace {

using core::str;

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected
    t[i] = c;
  }
  return t;
}
constexpr std::array<std::uint32_t, 256> kTable = make_table();

// Protocol-buffer wire format, the few pieces an Event needs.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void tag(std::string& out, int field, int wire) {
  varint(out, (static_cast<std::uint64_t>(field) << 3) | static_cast<unsigned>(wire));
}
template <class T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, std::string_view v) {
  tag(out, field, 2);
  varint(out, v.size());
  out.append(v);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string event_header(std::int64_t step) {
  std::string e;
  tag(e, 1, 1);
  fixed(e, now_s());
  if (step != 0) {
    tag(e, 2, 0);
    varint(e, static_cast<std::uint64_t>(step));
  }
  return e;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw core::Error(str("--tensorboard-dir ", dir, ": cannot create it: ", ec.message()));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = (std::filesystem::path(dir) / str("events.out.tfevents.", static_cast<long long>(now_s()),
                                            ".", host, ".", static_cast<long long>(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) {
    throw core::Error(str("--tensorboard-dir: cannot create ", path_, ": ", std::strerror(errno)));
  }
  std::string e = event_header(0);
  bytes_field(e, 3, "brain.Event:2");
  write_event(e);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(std::string_view tag_name, double value, std::int64_t step) {
  if (!file_) return;
  // Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
  std::string v;
  bytes_field(v, 1, tag_name);
  tag(v, 2, 5);
  fixed(v, static_cast<float>(value));
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event_header(step);
  bytes_field(e, 5, summary);
  write_event(e);
}

void TensorBoardWriter::write_event(const std::string& event) {
  std::string rec;
  const std::uint64_t len = event.size();
  fixed(rec, len);
  fixed(rec, masked_crc32c(&len, sizeof(len)));
  rec += event;
  fixed(rec, masked_crc32c(event.data(), event.size()));
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size() || std::fflush(file_) != 0) {
    throw core::Error(str("--tensorboard-dir: writing ", path_, " failed: ", std::strerror(errno)));
  }
}

}  // namespace trident::train
