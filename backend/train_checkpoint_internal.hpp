// The training checkpoint's internals shared by its two files: train_checkpoint_format.cpp (the byte format:
// header JSON both ways, the two-pass verifying reader, the hashing writer) and train_checkpoint.cpp (the store:
// names, listing, saving with pruning, loading into a HostState). Nothing outside them includes it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backend/train_checkpoint.hpp"
#include "backend/xxhash64.hpp"
#include "core/base/atomic_file.hpp"

namespace harmony::backend::checkpoint_detail {

inline constexpr std::array<char, 8> kMagic = {'H', 'R', 'M', 'Y', 'C', 'K', 'P', 'T'};
inline constexpr std::uint64_t kFixedBytes = 32;  // magic, version, flags, header_bytes, payload_bytes
inline constexpr std::uint64_t kTrailerBytes = 8;
inline constexpr std::size_t kIoChunkBytes = std::size_t{4} << 20;
inline constexpr const char* kLayout =
    "per layer: weights, exp_avg, exp_avg_sq (f32 LE); per-layer step counts (i64 LE); losses (f64 LE); "
    "then XXH64 (seed 0) of all preceding bytes (u64 LE)";

inline constexpr std::string_view kPrefix = "step-";
inline constexpr std::string_view kSuffix = ".hckpt";
inline constexpr std::string_view kTmpSuffix = ".tmp";

std::string errno_message(int err);

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&&) = delete;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and reports close()'s error (a deferred write error on some file systems); 0 when fine.
  int close() {
    const int fd = std::exchange(fd_, -1);
    return fd >= 0 && ::close(fd) != 0 ? errno : 0;
  }

 private:
  int fd_;
};

// What the verified header says.
struct Parsed {
  CheckpointMeta meta;  // losses not read yet
  std::vector<std::uint64_t> layer_floats;
  std::uint64_t num_losses = 0;
  std::uint64_t payload_offset = 0;
  std::uint64_t payload_bytes = 0;
};

struct Verified {
  Fd fd;
  Parsed parsed;
};

// ---- train_checkpoint_format.cpp

std::string bits_hex(double v);
std::string bits_hex(float v);
std::string describe(const Gpt2Config& c);
nlohmann::ordered_json header_json(const CheckpointMeta& m, const Gpt2& model);
// A header that passed the checksum but does not make sense: written so, by something else.
[[noreturn]] void malformed(const std::string& path, const std::string& what);
// Every check that needs no state: magic, version, lengths against the file size, the checksum over the whole
// file, the header's fields and their consistency with the payload length and with the model they describe (every
// layer's float count).
Verified open_and_verify(const std::string& path);
// Reads exactly n bytes at `offset`; a short read is a truncation (the file shrank under us).
void pread_exact(int fd, const std::string& path, std::uint64_t offset, void* dst, std::uint64_t n);
// The step counts and losses at the payload's end.
void read_tail(const Verified& v, const std::string& path, std::vector<std::int64_t>& steps,
               std::vector<double>& losses);

// Buffered writes to an AtomicFile, hashing every byte.
class HashingWriter {
 public:
  explicit HashingWriter(core::AtomicFile& file) : file_(file) { buffer_.reserve(kIoChunkBytes); }
  void put(const void* data, std::size_t n) {
    hash_.update(data, n);
    const auto* p = static_cast<const unsigned char*>(data);
    if (buffer_.size() + n > kIoChunkBytes) flush();
    if (n >= kIoChunkBytes) {
      file_.write(p, n);
    } else {
      buffer_.insert(buffer_.end(), p, p + n);
    }
  }
  template <class T>
  void put_value(T v) {
    put(&v, sizeof v);
  }
  void flush() {
    file_.write(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  std::uint64_t digest() const { return hash_.digest(); }

 private:
  core::AtomicFile& file_;
  XxHash64 hash_;
  std::vector<unsigned char> buffer_;
};

// ---- train_checkpoint.cpp

// The step of a canonical checkpoint name (exactly checkpoint_file_name(step)), else nullopt.
std::optional<std::int64_t> parse_checkpoint_name(std::string_view name);
// What to do about a damaged file: name the previous checkpoint in its directory if there is one.
std::string damaged_hint(const std::string& path);

}  // namespace harmony::backend::checkpoint_detail
