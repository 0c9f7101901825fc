// UTF-8 validation and maximal-subpart repair (Unicode 15, §3.9 "U+FFFD Substitution of Maximal
// Subparts"), table-free: the well-formed byte sequences are those of Table 3-7.
#include "trident/data/utf8.h"

#include <cstring>

namespace trident::data::utf8 {

namespace {

// Number of bytes of the longest prefix of s[i..] that is a valid start of a UTF-8 sequence
// (its "maximal subpart"), and whether the whole sequence is complete. For ASCII: (1, true).
struct Subpart {
  std::size_t length;
  bool complete;
};

Subpart scan_sequence(const unsigned char* p, std::size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {1, true};
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong 3-byte forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;  // no overlong 4-byte forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {1, false};  // C0, C1, F5..FF, or a stray continuation byte
  }
  std::size_t k = 1;
  for (; k <= need; ++k) {
    if (k >= n) return {k, false};
    const unsigned char b = p[k];
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {k, false};
  }
  return {k, true};
}

}  // namespace

std::size_t valid_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const Subpart sp = scan_sequence(p + i, n - i);
    if (!sp.complete) return i;
    i += sp.length;
  }
  return n;
}

std::string_view repair(std::string_view s, std::string& storage) {
  std::size_t i = valid_prefix(s);
  if (i == s.size()) return s;
  storage.clear();
  storage.reserve(s.size() + 16);
  storage.append(s.data(), i);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    const Subpart sp = scan_sequence(p + i, s.size() - i);
    if (sp.complete) {
      storage.append(s.data() + i, sp.length);
    } else {
      storage.append("\xEF\xBF\xBD");
    }
    i += sp.length;
  }
  return storage;
}

void append_code_point(std::uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::uint32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::uint32_t cp;
  std::size_t extra;
  if (b0 < 0x80) {
    cp = b0, extra = 0;
  } else if (b0 < 0xE0) {
    cp = b0 & 0x1F, extra = 1;
  } else if (b0 < 0xF0) {
    cp = b0 & 0x0F, extra = 2;
  } else {
    cp = b0 & 0x07, extra = 3;
  }
  ++i;
  for (std::size_t k = 0; k < extra && i < s.size(); ++k, ++i) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
  }
  return cp;
}

}  // namespace trident::data::utf8
