// libFuzzer target: arbitrary bytes as the text of a profile JSON ("harmony-profile-json" v1). A
// ConfigError (any harmony::core::Error) is the documented answer to bad input; any other exception,
// a crash or a sanitizer report is a bug. Seeds: fuzz/corpus/profile/, dictionary: fuzz/corpus/profile.dict.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/base/error.hpp"
#include "core/model/profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const harmony::core::Model model = harmony::core::load_profile_text(text, "fuzz.json");
    (void)model;
  } catch (const harmony::core::Error&) {
    // Rejected input, reported with file:line:column: expected.
  }
  return 0;
}
