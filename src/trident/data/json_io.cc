// File and JSON helpers with DataError messages that name the file and the place.
#include "trident/data/json_io.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <istream>
#include <iterator>
#include <unordered_set>

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

JsonDuplicateKey::JsonDuplicateKey(const std::string& what)
    : nlohmann::json::exception(601, what.c_str()) {}

namespace {

// The parser callbacks that find a key given twice. The first pass only counts: an object whose
// key events outnumber the keys it ends up with held a duplicate (nlohmann keeps one), which costs
// a counter per open object. Only when that finds one does a second pass name it:
// DuplicateKeyCheck keeps, per open object or array, an object's keys so far and its current key,
// an array's current index, which give the JSON pointer of the object the duplicate is in.
struct FoundDuplicate {};

class DuplicateKeyCount {
 public:
  bool operator()(int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
        keys_.push_back(0);
        break;
      case E::key:
        ++keys_.back();
        break;
      case E::object_end:
        if (keys_.back() != static_cast<std::int64_t>(parsed.size())) throw FoundDuplicate{};
        keys_.pop_back();
        break;
      default:
        break;
    }
    return true;
  }

 private:
  std::vector<std::int64_t> keys_;  // key events of each open object
};

class DuplicateKeyCheck {
 public:
  explicit DuplicateKeyCheck(const std::vector<std::string>& unique_top_level)
      : only_(unique_top_level) {}

  bool operator()(int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        next_element();
        stack_.push_back(Frame{event == E::object_start, -1, {}, {}});
        break;
      case E::object_end:
      case E::array_end:
        stack_.pop_back();
        break;
      case E::key: {
        Frame& f = stack_.back();
        f.key = parsed.get_ref<const std::string&>();
        const bool check =
            only_.empty() ||
            (stack_.size() == 1 && std::find(only_.begin(), only_.end(), f.key) != only_.end());
        if (check && !f.keys.insert(f.key).second) {
          const std::string where = pointer();
          throw JsonDuplicateKey(
              str("the key \"", f.key, "\" appears twice in the object at ",
                  where.empty() ? "the top level" : str(where, " (JSON pointer)"),
                  ": a JSON reader keeps only one of the two values; remove or rename one"));
        }
        break;
      }
      case E::value:
        next_element();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object;
    std::int64_t index;  // an array's current element
    std::string key;     // an object's current key
    std::unordered_set<std::string> keys;
  };

  // A value starts: in an array, it is the next element.
  void next_element() {
    if (!stack_.empty() && !stack_.back().object) ++stack_.back().index;
  }

  // The JSON pointer (RFC 6901) of the innermost open object.
  std::string pointer() const {
    std::string p;
    for (std::size_t i = 0; i + 1 < stack_.size(); ++i) {
      p += '/';
      if (!stack_[i].object) {
        p += std::to_string(stack_[i].index);
        continue;
      }
      for (char ch : stack_[i].key) {
        if (ch == '~') {
          p += "~0";
        } else if (ch == '/') {
          p += "~1";
        } else {
          p += ch;
        }
      }
    }
    return p;
  }

  const std::vector<std::string>& only_;
  std::vector<Frame> stack_;
};

nlohmann::json parse_naming_the_duplicate(std::string_view text,
                                          const std::vector<std::string>& unique_top_level) {
  DuplicateKeyCheck check(unique_top_level);
  return nlohmann::json::parse(
      text, [&check](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        return check(depth, event, parsed);
      });
}

}  // namespace

nlohmann::json parse_json_strict(std::string_view text,
                                 const std::vector<std::string>& unique_top_level) {
  // Only some top-level keys (a corpus line): the naming pass is cheap enough.
  if (!unique_top_level.empty()) return parse_naming_the_duplicate(text, unique_top_level);
  try {
    DuplicateKeyCount count;
    return nlohmann::json::parse(
        text, [&count](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          return count(depth, event, parsed);
        });
  } catch (const FoundDuplicate&) {
    parse_naming_the_duplicate(text, unique_top_level);  // throws JsonDuplicateKey
    throw core::InternalError("parse_json_strict: the two passes disagree about a duplicate key");
  }
}

nlohmann::json parse_json_strict(std::istream& in) {
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_json_strict(text);
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
    return parse_json_strict(text);
  } catch (const JsonDuplicateKey& e) {
    throw DataError(str(what, " ", path, ": ", e.what()));
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

nlohmann::json parse_json_line(std::string_view line, const std::string& path, std::int64_t line_no,
                               const std::vector<std::string>& keys_read) {
  nlohmann::json j;
  try {
    j = keys_read.empty() ? nlohmann::json::parse(line) : parse_json_strict(line, keys_read);
  } catch (const JsonDuplicateKey& e) {
    throw DataError(str(path, ":", line_no, ": ", e.what()));
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
