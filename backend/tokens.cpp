// llm.c token files: header detection and checks, uint16 decoding, and the step -> (inputs, targets)
// slicing with llm.c's wrap-around; see tokens.hpp.
#include "backend/tokens.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/base/input_file.hpp"

namespace harmony::backend {

TokenFile TokenFile::load(const std::string& path) {
  std::string problem;
  const auto text = core::try_read_input_file(path, &problem);  // folders, FIFOs, devices refused
  if (!text) throw FormatError(path, 0, "cannot open the token file: " + problem);
  return from_bytes(std::span(reinterpret_cast<const std::uint8_t*>(text->data()), text->size()), path);
}

TokenFile TokenFile::from_bytes(std::span<const std::uint8_t> bytes, const std::string& name) {
  TokenFile f;
  f.name_ = name;
  std::size_t start = 0;
  std::int32_t head[3] = {0, 0, 0};
  if (bytes.size() >= static_cast<std::size_t>(kTokenHeaderBytes)) std::memcpy(head, bytes.data(), sizeof(head));
  if (bytes.size() >= static_cast<std::size_t>(kTokenHeaderBytes) && head[0] == kTokenMagic) {
    if (head[1] != 1)
      throw FormatError(name, 4,
                        fmt::format("llm.c header version {} is not supported (version 1: uint16 tokens{})", head[1],
                                    head[1] == 2 ? "; version 2 holds uint32 tokens" : ""));
    const std::uint64_t payload = bytes.size() - kTokenHeaderBytes;
    if (payload % 2 != 0)
      throw FormatError(
          name, bytes.size(),
          fmt::format("{} bytes after the 1024-byte header is not a whole number of uint16 tokens", payload));
    if (head[2] < 0 || static_cast<std::uint64_t>(head[2]) != payload / 2)
      throw FormatError(
          name, 8, fmt::format("header says {} tokens but the file holds {} (truncated file?)", head[2], payload / 2));
    f.has_header_ = true;
    start = kTokenHeaderBytes;
  } else if (bytes.size() % 2 != 0) {
    throw FormatError(name, bytes.size(), fmt::format("{} bytes is not a whole number of uint16 tokens", bytes.size()));
  }
  const std::size_t n = (bytes.size() - start) / 2;
  f.tokens_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t* p = bytes.data() + start + 2 * i;
    f.tokens_[i] = static_cast<std::uint16_t>(p[0] | (p[1] << 8));
  }
  return f;
}

namespace {
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
}  // namespace

TokenFile TokenFile::synthetic(int vocab, std::int64_t count, std::uint64_t seed) {
  if (vocab < 2 || vocab > 65536) throw BackendError(fmt::format("synthetic task: vocab {} outside [2, 65536]", vocab));
  if (count < 2) throw BackendError(fmt::format("synthetic task: {} tokens, need at least 2", count));
  TokenFile f;
  f.name_ = fmt::format("synthetic:markov{}:V={}:n={}:seed={}", kSyntheticSuccessors, vocab, count, seed);
  const auto v = static_cast<std::uint64_t>(vocab);
  std::uint64_t state = seed;
  std::vector<std::uint16_t> next(static_cast<std::size_t>(vocab) * kSyntheticSuccessors);
  for (auto& n : next) n = static_cast<std::uint16_t>(splitmix64(state) % v);
  f.tokens_.resize(static_cast<std::size_t>(count));
  std::uint64_t cur = splitmix64(state) % v;
  for (auto& t : f.tokens_) {
    t = static_cast<std::uint16_t>(cur);
    cur = next[static_cast<std::size_t>(cur * kSyntheticSuccessors + splitmix64(state) % kSyntheticSuccessors)];
  }
  return f;
}

int TokenFile::max_token() const {
  if (tokens_.empty()) return -1;
  return *std::max_element(tokens_.begin(), tokens_.end());
}

std::int64_t TokenFile::steps_per_epoch(int B, int T) const {
  if (B <= 0 || T <= 0) throw BackendError(fmt::format("{}: batch {}x{} must be positive", name_, B, T));
  const std::int64_t bt = std::int64_t(B) * T;
  if (size() < bt + 1)
    throw BackendError(fmt::format("{}: a {}x{} batch needs {} tokens, the file has {}", name_, B, T, bt + 1, size()));
  return (size() - 1) / bt;
}

void TokenFile::batch(std::int64_t step, int B, int T, std::vector<std::int32_t>& inputs,
                      std::vector<std::int32_t>& targets) const {
  if (step < 0) throw BackendError(fmt::format("{}: negative step {}", name_, step));
  const std::int64_t epoch = steps_per_epoch(B, T);
  const std::int64_t bt = std::int64_t(B) * T;
  const std::int64_t start = (step % epoch) * bt;
  inputs.resize(static_cast<std::size_t>(bt));
  targets.resize(static_cast<std::size_t>(bt));
  for (std::int64_t i = 0; i < bt; ++i) {
    inputs[static_cast<std::size_t>(i)] = tokens_[static_cast<std::size_t>(start + i)];
    targets[static_cast<std::size_t>(i)] = tokens_[static_cast<std::size_t>(start + i + 1)];
  }
}

}  // namespace harmony::backend
