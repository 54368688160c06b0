// libFuzzer target: arbitrary bytes as the text of a profile JSON ("harmony-profile-json" v1). A
// ConfigError (any harmony::core::Error) is the documented answer to bad input; any other exception,
// a crash or a sanitizer report is a bug. It also checks that the simdjson fast path and the located
// (nlohmann-json) path agree: the same Model, or the same error message.
// Seeds: fuzz/corpus/profile/, dictionary: fuzz/corpus/profile.dict.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/base/error.hpp"
#include "core/model/profile.hpp"
#include "core/model/profile_write.hpp"

namespace {

// The Model as profile text, or the error's message: what the two paths must agree on.
template <typename Load>
std::string outcome(Load load) {
  try {
    return harmony::core::write_profile_json(load());
  } catch (const harmony::core::Error& e) {
    return std::string("error: ") + e.what();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string fast = outcome([&] { return harmony::core::load_profile_text(text, "fuzz.json"); });
  const std::string located = outcome([&] { return harmony::core::load_profile_text_located(text, "fuzz.json"); });
  if (fast != located) {
    std::fprintf(stderr, "fast path and located path disagree:\n--- fast\n%s\n--- located\n%s\n", fast.c_str(),
                 located.c_str());
    std::abort();
  }
  return 0;
}
