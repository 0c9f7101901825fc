// parse_json_strict: a key given twice in one JSON object is an error (nlohmann, like Python's
// json.loads, keeps the last value silently). Checked against Python's json module refusing
// duplicates through object_pairs_hook (reference/json_duplicates.py, the way DeepSpeed reads its
// config), on random documents.
#include "trident/data/json_io.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "reference/reference_util.h"
#include "trident/core/error.h"

namespace trident::data {
namespace {

using testing::expect_error;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

std::string duplicate_message(const std::string& text,
                              const std::vector<std::string>& unique_top_level = {}) {
  try {
    parse_json_strict(text, unique_top_level);
  } catch (const JsonDuplicateKey& e) {
    return e.what();
  }
  return "";
}

TEST(JsonStrict, NamesTheKeyAndTheObject) {
  EXPECT_NE(duplicate_message(R"({"a": 1, "b": 2, "a": 3})").find("\"a\""), std::string::npos);
  EXPECT_NE(duplicate_message(R"({"a": 1, "a": 1})").find("the top level"), std::string::npos);
  // The JSON pointer (RFC 6901) of the object, through objects and arrays, '~' and '/' escaped.
  const std::string nested = R"({"model": {"vocab": {"x": 0, "y": 1, "x": 2}}})";
  EXPECT_NE(duplicate_message(nested).find("/model/vocab (JSON pointer)"), std::string::npos)
      << duplicate_message(nested);
  const std::string in_array = R"({"l": [1, {"k": 0}, [2, {"k": 1, "k": 2}]]})";
  EXPECT_NE(duplicate_message(in_array).find("/l/2/1 "), std::string::npos)
      << duplicate_message(in_array);
  const std::string escaped = R"({"a/b": {"c~d": {"e": 1, "e": 2}}})";
  EXPECT_NE(duplicate_message(escaped).find("/a~1b/c~0d "), std::string::npos)
      << duplicate_message(escaped);
  // It is a nlohmann::json::exception: readers' existing handlers name their file.
  EXPECT_THROW(parse_json_strict(R"({"a": 1, "a": 2})"), nlohmann::json::exception);
}

TEST(JsonStrict, SameKeysInDifferentObjectsAreFine) {
  const std::string text =
      R"({"a": {"a": 1, "b": {"a": 2}}, "b": [{"a": 1, "b": 2}, {"a": 3, "b": 4}], "c": "a"})";
  EXPECT_EQ(parse_json_strict(text), nlohmann::json::parse(text));
  EXPECT_EQ(parse_json_strict("[]"), nlohmann::json::parse("[]"));
  EXPECT_EQ(parse_json_strict("5"), nlohmann::json::parse("5"));
  // Syntax errors are nlohmann's parse_error, as before.
  EXPECT_THROW(parse_json_strict(R"({"a": })"), nlohmann::json::parse_error);
}

TEST(JsonStrict, OnlyTheNamedTopLevelKeys) {
  const std::vector<std::string> text_key{"text"};
  EXPECT_NE(duplicate_message(R"({"text": "a", "id": 1, "text": "b"})", text_key), "");
  // Other duplicates, and "text" inside a nested object, keep nlohmann's (and json.loads') last.
  EXPECT_EQ(duplicate_message(R"({"text": "a", "id": 1, "id": 2})", text_key), "");
  EXPECT_EQ(duplicate_message(R"({"text": "a", "m": {"text": 1, "text": 2}})", text_key), "");
  EXPECT_EQ(parse_json_strict(R"({"text": "a", "id": 1, "id": 2})", text_key)["id"], 2);
}

// A random JSON text with keys from a small set, so that some objects name a key twice.
void random_value(std::mt19937& rng, int depth, std::ostringstream& os) {
  static const char* const keys[] = {"a", "b", "c", "a/b", "~"};
  const int kind = depth >= 4 ? 2 : static_cast<int>(rng() % 3);
  if (kind == 0) {
    os << '{';
    const int n = static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      os << (i ? ", " : "") << '"' << keys[rng() % 5] << "\": ";
      random_value(rng, depth + 1, os);
    }
    os << '}';
  } else if (kind == 1) {
    os << '[';
    const int n = static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      os << (i ? ", " : "");
      random_value(rng, depth + 1, os);
    }
    os << ']';
  } else {
    os << (rng() % 2 ? "\"s\"" : std::to_string(rng() % 100));
  }
}

TEST(JsonStrict, AgreesWithPythonOnRandomDocuments) {
  std::mt19937 rng(20261203);
  std::vector<std::string> texts;
  std::ostringstream all;
  for (int i = 0; i < 400; ++i) {
    std::ostringstream os;
    os << "{\"root\": ";
    random_value(rng, 0, os);
    os << '}';
    texts.push_back(os.str());
    all << texts.back() << '\n';
  }
  TempDir dir;
  write_bytes(dir / "texts.jsonl", all.str());
  ASSERT_TRUE(testing::run_reference("json_duplicates.py", {dir / "texts.jsonl", dir / "out.txt"}));
  std::istringstream verdicts(read_bytes(dir / "out.txt"));
  int duplicates = 0;
  for (const std::string& text : texts) {
    std::string want;
    ASSERT_TRUE(std::getline(verdicts, want)) << "the reference wrote too few lines";
    const std::string got = duplicate_message(text);
    EXPECT_EQ(got.empty() ? "ok" : "dup", want) << text << "\n" << got;
    if (want == "ok") {
      EXPECT_EQ(parse_json_strict(text), nlohmann::json::parse(text)) << text;
    }
    duplicates += want == "dup";
  }
  // Both kinds occur (the check can fail both ways).
  EXPECT_GT(duplicates, 40);
  EXPECT_LT(duplicates, 360);
}

TEST(JsonStrict, FileReadersNameTheFile) {
  TempDir dir;
  write_bytes(dir / "vocab.json", "{\"a\": 0,\n \"b\": 1,\n \"a\": 2}\n");
  expect_error<core::DataError>([&] { parse_json_file(dir / "vocab.json", "vocab file"); },
                                {"vocab file", "vocab.json", "\"a\"", "twice"});
  expect_error<core::DataError>(
      [&] { parse_json_line(R"({"text": "a", "text": "b"})", "c.jsonl", 7, {"text"}); },
      {"c.jsonl:7:", "\"text\"", "twice"});
  EXPECT_EQ(parse_json_line(R"({"text": "a", "n": 1, "n": 2})", "c.jsonl", 7, {"text"})["n"], 2);
}

}  // namespace
}  // namespace trident::data
