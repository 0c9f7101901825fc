// Small file helpers for the data module: read a whole file, parse a JSON file, and turn a JSON
// parse failure into a DataError that names the file and the position.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace trident::data {

// Reads all bytes of `path`. Throws DataError "cannot read <what> <path>: <reason>".
std::string read_file_bytes(const std::string& path, std::string_view what);

// Parses the whole file as one JSON value. Throws DataError naming the file, line and column.
nlohmann::json parse_json_file(const std::string& path, std::string_view what);

// Parses one line of a JSON-lines file. Throws DataError "<path>:<line>: ..." when the line is not
// valid JSON or not a JSON object.
nlohmann::json parse_json_line(std::string_view line, const std::string& path,
                               std::int64_t line_no);

}  // namespace trident::data
