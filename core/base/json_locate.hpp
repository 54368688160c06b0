// Source positions inside JSON text, for error messages: maps a JSON pointer ("/layers/3/fwd_time")
// or a byte offset to a 1-based line:column, and turns nlohmann::json parse exceptions into a position;
// parse_json_located is the one place that parses JSON text into a located ConfigError on bad syntax.
// The text is scanned lazily, only when a position is asked for, so a locator costs nothing on the
// happy path; the locator does not parse or validate (nlohmann does that) and never throws.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace harmony::core {

// A 1-based position in a text. `column` counts Unicode code points (UTF-8 continuation bytes do not
// advance it; a tab is one column), so it matches what editors show for ASCII and UTF-8 text.
struct TextPos {
  int line = 1;
  int column = 1;
};

// Locates values in one JSON text. The text is referenced, not copied: it must outlive the locator.
//
// Accuracy: for well-formed JSON (as accepted by nlohmann::json::parse) positions are exact: a value's
// position is its first character ('{', '[', '"', '-', a digit, 't', 'f' or 'n'), a key's position is its
// opening quote. Keys are compared after decoding escapes (\", \\, \uXXXX, surrogate pairs), and a key that
// occurs twice in one object resolves to its last occurrence, as nlohmann keeps the last. A pointer that
// does not exist resolves to the deepest value on its path that does (e.g. the object a missing key
// belongs to). On malformed text the scan stops where it can go no further and reports that position.
class JsonLocator {
 public:
  explicit JsonLocator(std::string_view text) : text_(text) {}

  std::string_view text() const { return text_; }

  // Byte offset -> line:column. Offsets past the end give the position just after the last character.
  TextPos position(std::size_t offset) const;

  // Byte offset of the value at `pointer` (RFC 6901: "" is the whole document, "/a/0" the first element of
  // member "a"; "~1" stands for '/', "~0" for '~'), or of the deepest existing value on its path.
  std::size_t value_offset(std::string_view pointer) const;
  // Byte offset of the key of the member `pointer` names; the value's offset when the pointer's last token
  // indexes an array, and the deepest existing value's when the member does not exist.
  std::size_t key_offset(std::string_view pointer) const;
  // Whether `pointer` names a value that exists in the text.
  bool contains(std::string_view pointer) const;

  TextPos value_pos(std::string_view pointer) const { return position(value_offset(pointer)); }
  TextPos key_pos(std::string_view pointer) const { return position(key_offset(pointer)); }

  // Where an exception thrown by nlohmann::json::parse on this text points. `what` is the exception's
  // what(); `byte` is parse_error::byte (pass 0 for other exceptions). For parse errors nlohmann reports
  // the last character it read; this moves back to the start of the offending token when that is what the
  // message is about (an unexpected string or number, an invalid literal or number), keeps the exact
  // character for invalid strings (a raw control character, a bad escape) and points just past the end
  // for "unexpected end of input". For out_of_range.406 (a number literal too large for a double, which
  // nlohmann reports without a position) it finds the first number token spelled as quoted in `what`.
  TextPos parse_error_pos(std::size_t byte, std::string_view what) const;

 private:
  struct Found {
    std::size_t value = 0;  // offset of the deepest value reached
    std::size_t key = 0;    // offset of its key (== value for array elements and the root)
    bool complete = false;  // whether the whole pointer was resolved
  };
  Found find(std::string_view pointer) const;
  std::optional<std::size_t> find_number_token(std::string_view literal) const;

  std::string_view text_;
};

// "/layers/3/fwd_time/0" -> "layers[3].fwd_time[0]"; "" -> "the document". For messages.
std::string pointer_to_path(std::string_view pointer);

// An object key as one RFC 6901 reference token ("a/b~c" -> "a~1b~0c"): "/" + json_pointer_token(key) points
// at member `key` of the root.
std::string json_pointer_token(std::string_view key);

// What nlohmann::json::parse refused in a text, for the caller's hint.
struct JsonParseProblem {
  TextPos pos;          // where (JsonLocator::parse_error_pos)
  std::string message;  // nlohmann's what() without its "[json.exception...] parse error at line 1, column 7: "
                        // prefix, e.g. "syntax error while parsing value - unexpected '}'; expected ..."
  bool syntax = true;   // false for a number literal too large for a double (out_of_range.406)
};

// Parses `text` (called `file` in messages). Text nlohmann refuses throws ConfigError at file:line:column with
// the message "malformed JSON: <problem.message>" and the hint `hint(problem)` returns.
nlohmann::json parse_json_located(const std::string& text, const std::string& file,
                                  const std::function<std::string(const JsonParseProblem&)>& hint);

}  // namespace harmony::core
