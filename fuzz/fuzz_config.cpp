// libFuzzer target: arbitrary bytes as the text of a harmony-sim YAML config. A ConfigError (any
// harmony::core::Error) is the documented answer to bad input; any other exception, a crash or a
// sanitizer report is a bug. Seeds: fuzz/corpus/config/, dictionary: fuzz/corpus/config.dict.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/base/error.hpp"
#include "core/config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const harmony::core::RunConfig config = harmony::core::load_config_text(text, "fuzz.yaml");
    (void)config;
  } catch (const harmony::core::Error&) {
    // Rejected input, reported with file:line:column: expected.
  }
  return 0;
}
