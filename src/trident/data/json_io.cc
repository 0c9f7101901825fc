// File and JSON helpers with DataError messages that name the file and the place.
#include "trident/data/json_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "trident/core/error.h"

namespace trident::data {

using core::DataError;
using core::str;

std::string read_file_bytes(const std::string& path, std::string_view what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw DataError(str("cannot read ", what, " ", path, ": ", std::strerror(errno)));
  std::string data;
  char buf[1 << 16];
  std::size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, got);
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) throw DataError(str("error while reading ", what, " ", path));
  return data;
}

namespace {
// Line and column (1-based) of byte offset `pos` in `text`.
std::pair<std::int64_t, std::int64_t> line_col(std::string_view text, std::size_t pos) {
  std::int64_t line = 1, col = 1;
  for (std::size_t i = 0; i < pos && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line, col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}
}  // namespace

nlohmann::json parse_json_file(const std::string& path, std::string_view what) {
  const std::string text = read_file_bytes(path, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const auto [line, col] = line_col(text, e.byte > 0 ? e.byte - 1 : 0);
    throw DataError(str(what, " ", path, ":", line, ":", col, " (byte ", e.byte,
                        "): not valid JSON: ", e.what()));
  } catch (const nlohmann::json::exception& e) {
    // The parser's other errors carry no position, e.g. a number too large for a double
    // (out_of_range 406).
    throw DataError(str(what, " ", path, ": not valid JSON: ", e.what()));
  }
}

nlohmann::json parse_json_line(std::string_view line, const std::string& path,
                               std::int64_t line_no) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(str(path, ":", line_no, ": not a valid JSON line (column ", e.byte,
                        "): ", e.what(),
                        "; each line of a .jsonl/.json input must hold one JSON "
                        "object"));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
    throw DataError(str(path, ":", line_no, ": not a valid JSON line: ", e.what(),
                        "; each line of a .jsonl/.json input must hold one JSON object"));
  }
  if (!j.is_object()) {
    throw DataError(str(path, ":", line_no, ": expected a JSON object, found a JSON ",
                        j.type_name(), "; each line must hold one object such as {\"text\": ...}"));
  }
  return j;
}

}  // namespace trident::data
