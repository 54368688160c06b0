// A JSON config file that a config reader walks key by key (model.hf_config, --deepspeed): the file parsed into one
// JSON object, with bad syntax or a document that is not an object refused at its line:column, and the
// file:line:column of any value or key in it for the reader's own messages.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "core/base/error.hpp"
#include "core/base/json_locate.hpp"

namespace harmony::core {

// How a JsonConfigFile names its kind of file in the errors parse_object raises.
struct JsonFileWords {
  std::string what;         // "a DeepSpeed config": "<what> is one JSON object; ...", "<what> must be a JSON object"
  std::string number_hint;  // hint for a number too large for a double; empty: the syntax hint
  std::string object_hint;  // hint when the document is not a JSON object
};

// Owns the text (its locator refers to it), so it is neither copied nor moved.
class JsonConfigFile {
 public:
  JsonConfigFile(std::string path, std::string text) : path_(std::move(path)), text_(std::move(text)), loc_(text_) {}
  JsonConfigFile(const JsonConfigFile&) = delete;
  JsonConfigFile& operator=(const JsonConfigFile&) = delete;

  // Parses the text; throws ConfigError at the problem's line:column when it is not JSON, at 1:1 when it is not an
  // object. Returns the document (also doc()).
  const nlohmann::json& parse_object(const JsonFileWords& words);

  const std::string& path() const { return path_; }
  const nlohmann::json& doc() const { return j_; }
  // Where the value (or the key) at a JSON pointer stands; a pointer that does not exist gives the deepest value on
  // its path that does.
  SourceLoc value_at(std::string_view pointer) const { return at(loc_.value_pos(pointer)); }
  SourceLoc key_at(std::string_view pointer) const { return at(loc_.key_pos(pointer)); }

 private:
  SourceLoc at(TextPos p) const { return SourceLoc{path_, p.line, p.column}; }

  std::string path_;
  std::string text_;
  JsonLocator loc_;
  nlohmann::json j_;
};

}  // namespace harmony::core
