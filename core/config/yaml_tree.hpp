// The project's one YAML reader: text parsed into a tree where every node and key knows its 1-based
// file:line:column, with duplicate keys, recursive aliases, runaway expansion and deep nesting rejected as
// located ConfigErrors. The config loader and sim's sweep files read YAML only through it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/base/error.hpp"

namespace harmony::core {

struct YamlEntry;

struct YamlNode {
  enum class Kind { Null, Scalar, Seq, Map };
  Kind kind = Kind::Null;
  std::string scalar;
  std::string tag;                 // yaml-cpp's tag: "?" plain, "!" quoted, or an explicit one (!!str)
  std::vector<YamlNode> items;     // Seq
  std::vector<YamlEntry> entries;  // Map, in file order
  SourceLoc loc;
};

struct YamlEntry {
  std::string key;
  SourceLoc key_loc;
  YamlNode value;
};

// Parses YAML text into a located tree. `fixed` pins every location (used for --set values); `what` prefixes
// syntax errors ("malformed YAML").
YamlNode parse_yaml_tree(const std::string& text, const std::string& file, const std::optional<SourceLoc>& fixed = {},
                         const std::string& what = "malformed YAML");

// A node's canonical text as flow-style YAML (`[1, 2]`, `{a: b}`, quoted strings stay quoted): the form a
// `--set key=value` override takes, and what parse_yaml_tree reads back to the same tree.
std::string flow_yaml(const YamlNode& node);

}  // namespace harmony::core
