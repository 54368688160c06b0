// What the C++ tests share: the source root they read configs and data from (HARMONY_SOURCE_DIR, which
// tests/meson.build sets for every test; "." when run by hand from the root), and a temporary folder that is
// removed with everything in it at scope exit.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>

namespace harmony::test {

inline std::string source_dir() {
  const char* dir = std::getenv("HARMONY_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

// "configs/profiles/bert_large.json" -> that file in the source root.
inline std::string source_path(const std::string& relative) { return source_dir() + "/" + relative; }

// A fresh folder under the system temp folder, unique to this process and object.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("harmony_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return path_.string(); }
  // The path of `name` inside (which may name subfolders).
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  // Writes `text` to `name` inside, creating its subfolders; returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  // The names of the entries directly inside.
  std::set<std::string> names() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.insert(e.path().filename().string());
    return out;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace harmony::test
