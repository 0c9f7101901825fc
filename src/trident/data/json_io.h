// Small file helpers for the data module: read a whole file, parse a JSON file, and turn a JSON
// parse failure into a DataError that names the file and the position. Also the strict JSON
// parser every reader of a file from elsewhere uses (tokenizers, checkpoints, safetensors, HF
// configs, DeepSpeed configs, the plan's calibration cache).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace trident::data {

// A key given twice in one JSON object. nlohmann::json::parse (like Python's json.loads) keeps the
// last value without a word, so a vocabulary, a safetensors header or a config naming an entry
// twice would silently lose one. It derives from nlohmann::json::exception (id 601), so a reader's
// existing `catch (const nlohmann::json::exception&)` reports it with the file's name.
class JsonDuplicateKey : public nlohmann::json::exception {
 public:
  explicit JsonDuplicateKey(const std::string& what);
};

// nlohmann::json::parse, except that a key given twice in one object throws JsonDuplicateKey,
// naming the key and the object (a JSON pointer such as /model/vocab). With `unique_top_level`
// non-empty, only those keys of the top-level object are checked (JSON Lines corpora: Megatron's
// reader keeps the last of any other duplicate, and so does trident).
nlohmann::json parse_json_strict(std::string_view text,
                                 const std::vector<std::string>& unique_top_level = {});
nlohmann::json parse_json_strict(std::istream& in);

// Reads all bytes of `path`. Throws DataError "cannot read <what> <path>: <reason>".
std::string read_file_bytes(const std::string& path, std::string_view what);

// Parses the whole file as one JSON value (parse_json_strict). Throws DataError naming the file
// and the line and column (or, for a key given twice, the key and its object).
nlohmann::json parse_json_file(const std::string& path, std::string_view what);

// Parses one line of a JSON-lines file. Throws DataError "<path>:<line>: ..." when the line is not
// valid JSON or not a JSON object, or names one of `keys_read` twice.
nlohmann::json parse_json_line(std::string_view line, const std::string& path, std::int64_t line_no,
                               const std::vector<std::string>& keys_read = {});

}  // namespace trident::data
