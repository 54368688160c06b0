// Token files in llm.c's convention: a flat array of little-endian uint16 token ids, optionally preceded by
// llm.c's 1024-byte header (256 int32: magic 20240520, version 1, token count). Training step k reads the
// B*T+1 tokens from k*B*T (wrapping to the start once past the end, as llm.c's loader does): inputs are the
// first B*T, targets the same shifted by one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/safetensors.hpp"

namespace harmony::backend {

inline constexpr std::int32_t kTokenMagic = 20240520;
inline constexpr std::int64_t kTokenHeaderBytes = 1024;

class TokenFile {
 public:
  // FormatError (file and byte offset) for an unreadable file, an odd byte count, a header whose version is
  // not 1 or whose count disagrees with the file size.
  static TokenFile load(const std::string& path);
  static TokenFile from_bytes(std::span<const std::uint8_t> bytes, const std::string& name);
  // The synthetic task: `count` tokens of a fixed random Markov chain over `vocab` ids in which every token
  // has kSyntheticSuccessors equally likely successors (so the best achievable loss is ln 4 = 1.386 nats,
  // against ln(vocab) for an untrained model). The chain and the walk come from `seed` through splitmix64
  // only: the same on every platform and standard library. Named "synthetic:markov4:V=..:n=..:seed=..".
  static TokenFile synthetic(int vocab, std::int64_t count, std::uint64_t seed);
  static constexpr int kSyntheticSuccessors = 4;

  const std::string& name() const { return name_; }
  bool has_header() const { return has_header_; }
  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::span<const std::uint16_t> tokens() const { return tokens_; }
  int max_token() const;  // -1 when empty

  // Steps before the data wraps: floor((size - 1) / (B*T)). BackendError if the file has fewer than B*T+1.
  std::int64_t steps_per_epoch(int B, int T) const;
  // Step k's inputs and targets, B*T each (row-major (B, T)), starting at (k mod steps_per_epoch)*B*T.
  void batch(std::int64_t step, int B, int T, std::vector<std::int32_t>& inputs,
             std::vector<std::int32_t>& targets) const;

 private:
  std::string name_;
  bool has_header_ = false;
  std::vector<std::uint16_t> tokens_;
};

}  // namespace harmony::backend
