// UTF-8 helpers for the tokenizers: validation, and lossy repair of invalid input by the Unicode
// "maximal subpart" rule (each maximal invalid subsequence becomes one U+FFFD), which is what
// Python's bytes.decode("utf-8", errors="replace") and Rust's String::from_utf8_lossy do.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace trident::data::utf8 {

// Length of the valid UTF-8 prefix of `s` (== s.size() when all of s is valid). Rejects overlong
// forms, surrogates (U+D800..U+DFFF) and code points above U+10FFFF, like the Unicode standard.
std::size_t valid_prefix(std::string_view s);
inline bool is_valid(std::string_view s) { return valid_prefix(s) == s.size(); }

// Returns `s` with every maximal invalid subsequence replaced by U+FFFD (EF BF BD). Returns a
// view of `s` itself when it is valid (no copy); otherwise the repaired text is written to
// `storage` and a view of it is returned.
std::string_view repair(std::string_view s, std::string& storage);

// Appends the UTF-8 encoding of code point cp (< 0x110000, not a surrogate) to out.
void append_code_point(std::uint32_t cp, std::string& out);

// Decodes the code point starting at s[i] of a valid UTF-8 string and advances i past it.
std::uint32_t next_code_point(std::string_view s, std::size_t& i);

}  // namespace trident::data::utf8
