// Training checkpoint files (see train_checkpoint.hpp): the writer (through core::AtomicFile: temp file, fsync,
// rename, directory fsync; then pruning), the two-pass reader (verify every length and the checksum, then fill the
// state), the checkpoint directory listing and XXH64.
#include "backend/train_checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/input_file.hpp"

namespace harmony::backend {

static_assert(std::endian::native == std::endian::little, "checkpoint I/O assumes a little-endian host");

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::array<char, 8> kMagic = {'H', 'R', 'M', 'Y', 'C', 'K', 'P', 'T'};
constexpr std::uint64_t kFixedBytes = 32;  // magic, version, flags, header_bytes, payload_bytes
constexpr std::uint64_t kTrailerBytes = 8;
constexpr std::size_t kIoChunkBytes = std::size_t{4} << 20;
constexpr const char* kLayout =
    "per layer: weights, exp_avg, exp_avg_sq (f32 LE); per-layer step counts (i64 LE); losses (f64 LE); "
    "then XXH64 (seed 0) of all preceding bytes (u64 LE)";

std::string errno_message(int err) { return std::generic_category().message(err); }

// ---- XXH64 primitives -------------------------------------------------------------------------------------

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr std::uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr std::uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr std::uint64_t kP5 = 0x27D4EB2F165667C5ULL;

std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

std::uint32_t load32(const unsigned char* p) {
  std::uint32_t v = 0;
  std::memcpy(&v, p, 4);
  return v;
}

std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t input) {
  acc += input * kP2;
  acc = std::rotl(acc, 31);
  return acc * kP1;
}

std::uint64_t xxh_merge(std::uint64_t acc, std::uint64_t v) {
  acc ^= xxh_round(0, v);
  return acc * kP1 + kP4;
}

// ---- file descriptors -------------------------------------------------------------------------------------

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

// ---- naming -----------------------------------------------------------------------------------------------

constexpr std::string_view kPrefix = "step-";
constexpr std::string_view kSuffix = ".hckpt";
constexpr std::string_view kTmpSuffix = ".tmp";

// The step of a canonical checkpoint name (exactly checkpoint_file_name(step)), else nullopt.
std::optional<std::int64_t> parse_checkpoint_name(std::string_view name) {
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  if (checkpoint_file_name(step) != name) return std::nullopt;  // "step-120.hckpt", "step-0000120.hckpt"
  return step;
}

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// What to do about a damaged file: name the previous checkpoint in its directory if there is one.
std::string damaged_hint(const std::string& path) {
  const std::string dir = parent_dir(path);
  const std::string self = fs::path(path).filename().string();
  const std::optional<std::int64_t> own_step = parse_checkpoint_name(self);
  std::optional<CheckpointFile> previous;
  try {
    for (const CheckpointFile& f : list_checkpoints(dir)) {
      if (fs::path(f.path).filename().string() == self) continue;
      if (own_step && f.step >= *own_step) continue;
      previous = f;  // ascending: the last one kept is the newest before this file
    }
  } catch (const CheckpointError&) {
    // an unlistable directory: no suggestion
  }
  if (previous)
    return fmt::format("move it away and resume from {}, the previous checkpoint in {}", previous->path, dir);
  return fmt::format("there is no older checkpoint in {}: move the file away and start the run again", dir);
}

// ---- meta <-> JSON ----------------------------------------------------------------------------------------

std::string bits_hex(double v) { return fmt::format("{:016x}", std::bit_cast<std::uint64_t>(v)); }
std::string bits_hex(float v) { return fmt::format("{:08x}", std::bit_cast<std::uint32_t>(v)); }

std::string describe(const Gpt2Config& c) {
  return fmt::format("vocab_size={} max_seq_len={} n_layer={} n_head={} n_embd={} ln_eps={}", c.vocab_size,
                     c.max_seq_len, c.n_layer, c.n_head, c.n_embd, c.ln_eps);
}

nlohmann::ordered_json header_json(const CheckpointMeta& m, const Gpt2& model) {
  nlohmann::ordered_json j;
  j["format"] = "harmony training checkpoint";
  j["checksum"] = "xxh64";
  j["layout"] = kLayout;
  j["model"] = {{"vocab_size", m.model.vocab_size}, {"max_seq_len", m.model.max_seq_len}, {"n_layer", m.model.n_layer},
                {"n_head", m.model.n_head},         {"n_embd", m.model.n_embd},           {"ln_eps", m.model.ln_eps}};
  j["batch"] = m.batch;
  j["seq_len"] = m.seq_len;
  j["plan"] = m.plan;
  j["data"] = m.data;
  if (m.dtype) j["dtype"] = std::string(dtype_name(*m.dtype));
  j["adamw"] = {{"lr", m.adamw.lr},
                {"beta1", m.adamw.beta1},
                {"beta2", m.adamw.beta2},
                {"eps", m.adamw.eps},
                {"weight_decay", m.adamw.weight_decay}};
  j["step"] = m.step;
  j["data_position"] = m.data_position;
  j["rng_seed"] = m.rng_seed;
  j["rng_counter"] = m.rng_counter;
  j["num_losses"] = static_cast<std::uint64_t>(m.losses.size());
  if (!m.losses.empty()) j["last_loss"] = m.losses.back();  // informational; the payload holds the bits
  auto layers = nlohmann::ordered_json::array();
  for (int l = 0; l < model.num_layers(); ++l)
    layers.push_back({{"name", model.layer_name(l)}, {"floats", model.param_floats(l)}});
  j["layers"] = std::move(layers);
  // The values read back: exact bit patterns (the readable numbers above are for people).
  j["bits"] = {{"model.ln_eps", bits_hex(m.model.ln_eps)}, {"adamw.lr", bits_hex(m.adamw.lr)},
               {"adamw.beta1", bits_hex(m.adamw.beta1)},   {"adamw.beta2", bits_hex(m.adamw.beta2)},
               {"adamw.eps", bits_hex(m.adamw.eps)},       {"adamw.weight_decay", bits_hex(m.adamw.weight_decay)}};
  return j;
}

// What the verified header says.
struct Parsed {
  CheckpointMeta meta;  // losses not read yet
  std::vector<std::uint64_t> layer_floats;
  std::uint64_t num_losses = 0;
  std::uint64_t payload_offset = 0;
  std::uint64_t payload_bytes = 0;
};

// A header that passed the checksum but does not make sense: written so, by something else.
[[noreturn]] void malformed(const std::string& path, const std::string& what) {
  throw CheckpointError(path, "malformed header: " + what,
                        "its checksum is right, so it was written this way: not by a compatible harmony-run; "
                        "resume from a checkpoint this version wrote, or start a new run");
}

// Reads fields of the JSON header; anything missing or of the wrong type is a CheckpointError.
class HeaderReader {
 public:
  HeaderReader(const json& j, const std::string& path) : j_(j), path_(path) {}

  [[noreturn]] void fail(const std::string& what) const { malformed(path_, what); }
  const json& field(const json& obj, const std::string& key, const std::string& where) const {
    if (!obj.is_object()) fail(fmt::format("'{}' is not an object", where));
    const auto it = obj.find(key);
    if (it == obj.end()) fail(fmt::format("'{}' is missing", where.empty() ? key : where + "." + key));
    return *it;
  }
  std::int64_t i64(const json& obj, const std::string& key, const std::string& where, std::int64_t lo,
                   std::int64_t hi) const {
    const json& v = field(obj, key, where);
    const std::string name = where.empty() ? key : where + "." + key;
    bool ok = false;
    std::int64_t x = 0;
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      ok = u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
      x = static_cast<std::int64_t>(u);
    } else if (v.is_number_integer()) {
      ok = true;
      x = v.get<std::int64_t>();
    }
    if (!ok || x < lo || x > hi) fail(fmt::format("'{}' is {}, not an integer in [{}, {}]", name, v.dump(), lo, hi));
    return x;
  }
  std::uint64_t u64(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_number_unsigned())
      fail(fmt::format("'{}' is {}, not an unsigned integer", where.empty() ? key : where + "." + key, v.dump()));
    return v.get<std::uint64_t>();
  }
  std::string str(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string())
      fail(fmt::format("'{}' is {}, not a string", where.empty() ? key : where + "." + key, v.dump()));
    return v.get<std::string>();
  }
  // A hex bit pattern of `digits` digits from the "bits" object.
  std::uint64_t bits(const std::string& key, std::size_t digits) const {
    const std::string s = str(field(j_, "bits", ""), key, "bits");
    std::uint64_t x = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x, 16);
    if (s.size() != digits || ec != std::errc() || end != s.data() + s.size())
      fail(fmt::format("'bits.{}' is \"{}\", not {} hex digits", key, s, digits));
    return x;
  }

 private:
  const json& j_;
  const std::string& path_;
};

Parsed parse_header(const std::string& path, const std::string& text, std::uint64_t payload_offset,
                    std::uint64_t payload_bytes) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    malformed(path, fmt::format("the JSON does not parse: {}", e.what()));
  }
  const HeaderReader r(j, path);
  if (!j.is_object()) r.fail("the JSON is not an object");
  Parsed p;
  p.payload_offset = payload_offset;
  p.payload_bytes = payload_bytes;
  CheckpointMeta& m = p.meta;
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
  const json& model = r.field(j, "model", "");
  m.model.vocab_size = static_cast<int>(r.i64(model, "vocab_size", "model", 0, kIntMax));
  m.model.max_seq_len = static_cast<int>(r.i64(model, "max_seq_len", "model", 0, kIntMax));
  m.model.n_layer = static_cast<int>(r.i64(model, "n_layer", "model", 0, kIntMax - 2));
  m.model.n_head = static_cast<int>(r.i64(model, "n_head", "model", 0, kIntMax));
  m.model.n_embd = static_cast<int>(r.i64(model, "n_embd", "model", 0, kIntMax));
  m.model.ln_eps = std::bit_cast<float>(static_cast<std::uint32_t>(r.bits("model.ln_eps", 8)));
  try {
    m.model.validate();
  } catch (const BackendError& e) {
    r.fail(e.what());
  }
  m.batch = static_cast<int>(r.i64(j, "batch", "", 1, kIntMax));
  m.seq_len = static_cast<int>(r.i64(j, "seq_len", "", 1, kIntMax));
  m.plan = r.str(j, "plan", "");
  m.data = r.str(j, "data", "");
  m.dtype = std::nullopt;
  if (j.contains("dtype")) {
    const std::string d = r.str(j, "dtype", "");
    m.dtype = parse_dtype(d);
    if (!m.dtype) r.fail(fmt::format("dtype '{}' is neither fp32 nor bf16", d));
  }
  m.adamw.lr = std::bit_cast<double>(r.bits("adamw.lr", 16));
  m.adamw.beta1 = std::bit_cast<double>(r.bits("adamw.beta1", 16));
  m.adamw.beta2 = std::bit_cast<double>(r.bits("adamw.beta2", 16));
  m.adamw.eps = std::bit_cast<double>(r.bits("adamw.eps", 16));
  m.adamw.weight_decay = std::bit_cast<double>(r.bits("adamw.weight_decay", 16));
  m.step = r.i64(j, "step", "", 0, kI64Max);
  m.data_position = r.u64(j, "data_position", "");
  m.rng_seed = r.u64(j, "rng_seed", "");
  m.rng_counter = r.u64(j, "rng_counter", "");
  p.num_losses = r.u64(j, "num_losses", "");

  // The payload must be exactly what the layer list and loss count say (every product overflow-checked).
  const json& layers = r.field(j, "layers", "");
  if (!layers.is_array()) r.fail("'layers' is not an array");
  const std::uint64_t num_layers = static_cast<std::uint64_t>(m.model.n_layer) + 2;
  if (layers.size() != num_layers)
    r.fail(fmt::format("'layers' has {} entries, the model has {} layers", layers.size(), num_layers));
  std::uint64_t expected = 0;
  auto add = [&](std::uint64_t count, std::uint64_t unit, const char* what) {
    if (count > (payload_bytes - expected) / unit)
      r.fail(fmt::format("the payload of {} bytes is too small for the {} the header lists", payload_bytes, what));
    expected += count * unit;
  };
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::uint64_t n = r.u64(layers[l], "floats", fmt::format("layers[{}]", l));
    p.layer_floats.push_back(n);
    add(n, 3 * sizeof(float), "weights and moments");
  }
  add(num_layers, sizeof(std::int64_t), "step counts");
  add(p.num_losses, sizeof(double), "losses");
  if (expected != payload_bytes)
    r.fail(fmt::format("the payload has {} bytes, the header's layers and losses need {}", payload_bytes, expected));
  return p;
}

// ---- reading ----------------------------------------------------------------------------------------------

// Reads exactly n bytes at `offset`; a short read is a truncation (the file shrank under us).
void pread_exact(int fd, const std::string& path, std::uint64_t offset, void* dst, std::uint64_t n) {
  auto* out = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n, kIoChunkBytes));
    const ssize_t got = ::pread(fd, out, want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(path, fmt::format("cannot read byte {}: {}", offset, errno_message(errno)),
                            "check the disk, or " + damaged_hint(path));
    }
    if (got == 0)
      throw CheckpointError(path, fmt::format("truncated: the file ends at byte {} while reading it", offset),
                            damaged_hint(path));
    out += got;
    offset += static_cast<std::uint64_t>(got);
    n -= static_cast<std::uint64_t>(got);
  }
}

struct Verified {
  Fd fd;
  Parsed parsed;
};

// Every check that needs no state: magic, version, lengths against the file size, the checksum over the whole
// file, the header's fields and their consistency with the payload length.
Verified open_and_verify(const std::string& path) {
  std::string problem;
  Fd fd(core::open_input_file(path, &problem));  // folders, FIFOs and devices refused, never blocks
  if (fd.get() < 0) {
    throw CheckpointError(path, fmt::format("cannot open: {}", problem),
                          problem == errno_message(ENOENT)
                              ? "check the path: checkpoints are DIR/step-NNNNNN.hckpt, the largest step the newest"
                              : "check the file's permissions");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw CheckpointError(path, fmt::format("cannot stat: {}", errno_message(errno)), "check the file");
  if (!S_ISREG(st.st_mode))
    throw CheckpointError(path, "not a regular file", "pass a .hckpt file written by harmony-run");
  const auto size = static_cast<std::uint64_t>(st.st_size);

  std::array<unsigned char, kFixedBytes> fixed{};
  pread_exact(fd.get(), path, 0, fixed.data(), std::min<std::uint64_t>(size, kFixedBytes));
  const std::size_t magic_seen = static_cast<std::size_t>(std::min<std::uint64_t>(size, kMagic.size()));
  if (std::memcmp(fixed.data(), kMagic.data(), magic_seen) != 0) {
    std::string shown;
    for (std::size_t i = 0; i < magic_seen; ++i) {
      const auto c = static_cast<char>(fixed[i]);
      shown += c >= 0x20 && c < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", fixed[i]);
    }
    throw CheckpointError(path, fmt::format("not a harmony checkpoint: it starts with \"{}\", not \"HRMYCKPT\"", shown),
                          "pass a .hckpt file written by harmony-run's --checkpoint-dir");
  }
  if (size < kFixedBytes)
    throw CheckpointError(path,
                          fmt::format("truncated: {} bytes, shorter than the {}-byte fixed header", size, kFixedBytes),
                          damaged_hint(path));
  const std::uint32_t version = load32(fixed.data() + 8);
  const std::uint32_t flags = load32(fixed.data() + 12);
  const std::uint64_t header_bytes = load64(fixed.data() + 16);
  const std::uint64_t payload_bytes = load64(fixed.data() + 24);
  if (version > kCheckpointVersion)
    throw CheckpointError(
        path, fmt::format("format version {} is newer than this build reads ({})", version, kCheckpointVersion),
        "resume with the (newer) harmony-run that wrote it, or start a new run");
  if (version == 0) throw CheckpointError(path, "corrupt: format version 0 does not exist", damaged_hint(path));
  if (flags != 0)
    throw CheckpointError(path, fmt::format("corrupt: flags are {:#x}, version {} defines none", flags, version),
                          damaged_hint(path));
  // expected = fixed + header + payload + trailer, without overflow.
  const std::uint64_t room = std::numeric_limits<std::uint64_t>::max() - kFixedBytes - kTrailerBytes;
  if (header_bytes > room || payload_bytes > room - header_bytes)
    throw CheckpointError(path, "corrupt: impossible header or payload length", damaged_hint(path));
  const std::uint64_t expected = kFixedBytes + header_bytes + payload_bytes + kTrailerBytes;
  if (size < expected)
    throw CheckpointError(
        path,
        fmt::format("truncated: the file has {} bytes, its header says {} (an interrupted write or copy?)", size,
                    expected),
        damaged_hint(path));
  if (size > expected)
    throw CheckpointError(
        path,
        fmt::format("corrupt: {} bytes follow the checksum at byte {}", size - expected, expected - kTrailerBytes),
        damaged_hint(path));

  // Pass 1: the checksum over everything before the trailer.
  XxHash64 hash;
  hash.update(fixed.data(), kFixedBytes);
  std::vector<unsigned char> chunk(static_cast<std::size_t>(std::min<std::uint64_t>(kIoChunkBytes, size)));
  for (std::uint64_t at = kFixedBytes; at < expected - kTrailerBytes;) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), expected - kTrailerBytes - at);
    pread_exact(fd.get(), path, at, chunk.data(), n);
    hash.update(chunk.data(), static_cast<std::size_t>(n));
    at += n;
  }
  std::array<unsigned char, kTrailerBytes> trailer{};
  pread_exact(fd.get(), path, expected - kTrailerBytes, trailer.data(), kTrailerBytes);
  const std::uint64_t stored = load64(trailer.data());
  const std::uint64_t computed = hash.digest();
  if (stored != computed)
    throw CheckpointError(
        path, fmt::format("corrupt: checksum mismatch (stored XXH64 {:016x}, computed {:016x})", stored, computed),
        damaged_hint(path));

  std::string text(static_cast<std::size_t>(header_bytes), '\0');
  pread_exact(fd.get(), path, kFixedBytes, text.data(), header_bytes);
  Parsed parsed = parse_header(path, text, kFixedBytes + header_bytes, payload_bytes);
  return {std::move(fd), std::move(parsed)};
}

// The step counts and losses at the payload's end.
void read_tail(const Verified& v, const std::string& path, std::vector<std::int64_t>& steps,
               std::vector<double>& losses) {
  std::uint64_t at = v.parsed.payload_offset;
  for (const std::uint64_t n : v.parsed.layer_floats) at += 3 * n * sizeof(float);
  steps.resize(v.parsed.layer_floats.size());
  pread_exact(v.fd.get(), path, at, steps.data(), steps.size() * sizeof(std::int64_t));
  at += steps.size() * sizeof(std::int64_t);
  for (std::size_t l = 0; l < steps.size(); ++l)
    if (steps[l] < 0) malformed(path, fmt::format("layer {} has a negative step count {}", l, steps[l]));
  losses.resize(static_cast<std::size_t>(v.parsed.num_losses));
  pread_exact(v.fd.get(), path, at, losses.data(), losses.size() * sizeof(double));
}

// ---- writing ----------------------------------------------------------------------------------------------

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

// Deletes the checkpoints older than the newest keep-1 before `step`, and stale temp files. Best effort.
void prune(const std::string& dir, std::int64_t step, int keep) {
  std::vector<CheckpointFile> older;
  std::vector<fs::path> stale;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.ends_with(kTmpSuffix) && parse_checkpoint_name(name.substr(0, name.size() - kTmpSuffix.size()))) {
      stale.push_back(it->path());
      continue;
    }
    const std::optional<std::int64_t> s = parse_checkpoint_name(name);
    std::error_code type_ec;
    if (s && *s < step && it->is_regular_file(type_ec)) older.push_back({*s, it->path().string()});
  }
  std::sort(older.begin(), older.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  for (std::size_t i = static_cast<std::size_t>(keep - 1); i < older.size(); ++i) {
    std::error_code rm_ec;
    fs::remove(older[i].path, rm_ec);
  }
  for (const fs::path& p : stale) {
    std::error_code rm_ec;
    fs::remove(p, rm_ec);
  }
}

}  // namespace

// ---- public -----------------------------------------------------------------------------------------------

CheckpointError::CheckpointError(std::string file, const std::string& problem, const std::string& hint)
    : BackendError(fmt::format("{}: {}{}", file, problem, hint.empty() ? "" : "\n  hint: " + hint)),
      file_(std::move(file)),
      problem_(problem),
      hint_(hint) {}

XxHash64::XxHash64(std::uint64_t seed) : v_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1}, seed_(seed) {}

void XxHash64::update(const void* data, std::size_t bytes) {
  if (bytes == 0) return;  // data may be null
  const auto* p = static_cast<const unsigned char*>(data);
  total_bytes_ += bytes;
  if (buffered_bytes_ > 0) {
    const std::size_t take = std::min(bytes, sizeof buffer_ - buffered_bytes_);
    std::memcpy(buffer_ + buffered_bytes_, p, take);
    buffered_bytes_ += take;
    p += take;
    bytes -= take;
    if (buffered_bytes_ < sizeof buffer_) return;
    for (int i = 0; i < 4; ++i) v_[i] = xxh_round(v_[i], load64(buffer_ + 8 * i));
    buffered_bytes_ = 0;
  }
  std::uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
  for (; bytes >= 32; p += 32, bytes -= 32) {
    v0 = xxh_round(v0, load64(p));
    v1 = xxh_round(v1, load64(p + 8));
    v2 = xxh_round(v2, load64(p + 16));
    v3 = xxh_round(v3, load64(p + 24));
  }
  v_[0] = v0;
  v_[1] = v1;
  v_[2] = v2;
  v_[3] = v3;
  if (bytes > 0) std::memcpy(buffer_, p, bytes);
  buffered_bytes_ = bytes;
}

std::uint64_t XxHash64::digest() const {
  std::uint64_t h = 0;
  if (total_bytes_ >= 32) {
    h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
    for (const std::uint64_t v : v_) h = xxh_merge(h, v);
  } else {
    h = seed_ + kP5;
  }
  h += total_bytes_;
  const unsigned char* p = buffer_;
  std::size_t n = buffered_bytes_;
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ xxh_round(0, load64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    h = std::rotl(h ^ (static_cast<std::uint64_t>(load32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string checkpoint_file_name(std::int64_t step) { return fmt::format("step-{:06d}.hckpt", step); }

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) return {};
  if (ec)
    throw CheckpointError(dir, fmt::format("cannot inspect the checkpoint directory: {}", ec.message()),
                          "check the path and its permissions");
  if (st.type() != fs::file_type::directory)
    throw CheckpointError(dir, "the checkpoint directory is not a directory",
                          "name a directory (it is created when missing)");
  std::vector<CheckpointFile> out;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::optional<std::int64_t> step = parse_checkpoint_name(it->path().filename().string());
    std::error_code type_ec;
    if (step && it->is_regular_file(type_ec)) out.push_back({*step, it->path().string()});
  }
  if (ec)
    throw CheckpointError(dir, fmt::format("cannot list the checkpoint directory: {}", ec.message()),
                          "check its permissions");
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::vector<CheckpointFile> files = list_checkpoints(dir);
  if (files.empty()) return std::nullopt;
  return std::move(files.back().path);
}

std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const HostState& state, int keep) {
  const Gpt2& model = state.model();
  std::string final_path = (fs::path(dir) / checkpoint_file_name(meta.step)).string();
  const std::string tmp_path = final_path + std::string(kTmpSuffix);
  const std::string nothing_written = "nothing was written";
  auto refuse = [&](const std::string& problem) {
    throw CheckpointError(final_path, "cannot save: " + problem, nothing_written);
  };
  if (keep < 1) refuse(fmt::format("keep is {}; at least the new checkpoint must be kept (keep >= 1)", keep));
  if (meta.step < 0) refuse(fmt::format("step {} is negative", meta.step));
  if (meta.batch < 1 || meta.seq_len < 1)
    refuse(fmt::format("batch {} and seq_len {} must be positive", meta.batch, meta.seq_len));
  if (!(meta.model == model.config()))
    refuse(
        fmt::format("the meta's model ({}) is not the state's ({})", describe(meta.model), describe(model.config())));
  try {
    meta.adamw.validate();
  } catch (const BackendError& e) {
    refuse(e.what());
  }

  std::string header;
  try {
    header = header_json(meta, model).dump();
  } catch (const nlohmann::json::exception& e) {
    refuse(fmt::format("the plan or data fingerprint is not valid UTF-8 ({})", e.what()));
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  std::uint64_t payload_bytes = 0;
  for (int l = 0; l < model.num_layers(); ++l)
    payload_bytes += 3 * static_cast<std::uint64_t>(model.param_floats(l)) * sizeof(float);
  payload_bytes += static_cast<std::uint64_t>(model.num_layers()) * sizeof(std::int64_t);
  payload_bytes += meta.losses.size() * sizeof(double);

  std::error_code ec;
  fs::create_directories(dir, ec);
  std::error_code dir_ec;
  if (ec || !fs::is_directory(dir, dir_ec))
    throw CheckpointError(dir,
                          fmt::format("cannot create the checkpoint directory: {}",
                                      ec ? ec.message() : std::string("a file of that name exists")),
                          "name a writable directory");

  const std::string write_hint = fmt::format(
      "free space in {} or choose another checkpoint directory; the previous checkpoints are untouched", dir);
  try {
    core::AtomicFile file(final_path, "the checkpoint", write_hint);  // DIR/step-NNNNNN.hckpt.tmp, then renamed
    HashingWriter w(file);
    w.put(kMagic.data(), kMagic.size());
    w.put_value<std::uint32_t>(kCheckpointVersion);
    w.put_value<std::uint32_t>(0);  // flags
    w.put_value<std::uint64_t>(header.size());
    w.put_value<std::uint64_t>(payload_bytes);
    w.put(header.data(), header.size());
    for (int l = 0; l < model.num_layers(); ++l) {
      const std::span<const float> blocks[] = {state.weights(l), state.exp_avg(l), state.exp_avg_sq(l)};
      for (const std::span<const float> b : blocks) w.put(b.data(), b.size_bytes());
    }
    for (int l = 0; l < model.num_layers(); ++l) w.put_value<std::int64_t>(state.steps(l));
    w.put(meta.losses.data(), meta.losses.size() * sizeof(double));
    const std::uint64_t checksum = w.digest();
    w.put_value<std::uint64_t>(checksum);
    w.flush();
    file.commit();  // fsync, rename over the final name, fsync DIR; the temp file is removed on any failure
  } catch (const core::FileError& e) {
    throw CheckpointError(e.path(), e.message(), write_hint);
  }
  prune(dir, meta.step, keep);
  return final_path;
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  Verified v = open_and_verify(path);
  std::vector<std::int64_t> steps;
  read_tail(v, path, steps, v.parsed.meta.losses);
  return std::move(v.parsed.meta);
}

CheckpointMeta load_checkpoint(const std::string& path, HostState& state, const CheckpointMeta* expect) {
  Verified v = open_and_verify(path);
  const CheckpointMeta& got = v.parsed.meta;
  if (expect != nullptr) {
    auto mismatch = [&](const std::string& field, const std::string& file_value, const std::string& expected) {
      throw CheckpointError(
          path, fmt::format("{} differs: the checkpoint has {}, this run has {}", field, file_value, expected),
          fmt::format("resume with {} = {} as the run that wrote it, or start a new run in another checkpoint "
                      "directory",
                      field, file_value));
    };
    auto check_int = [&](const char* field, auto a, auto b) {
      if (a != b) mismatch(field, fmt::format("{}", a), fmt::format("{}", b));
    };
    auto check_double = [&](const char* field, double a, double b) {
      if (std::bit_cast<std::uint64_t>(a) != std::bit_cast<std::uint64_t>(b))
        mismatch(field, fmt::format("{} (bits {})", a, bits_hex(a)), fmt::format("{} (bits {})", b, bits_hex(b)));
    };
    check_int("model.vocab_size", got.model.vocab_size, expect->model.vocab_size);
    check_int("model.max_seq_len", got.model.max_seq_len, expect->model.max_seq_len);
    check_int("model.n_layer", got.model.n_layer, expect->model.n_layer);
    check_int("model.n_head", got.model.n_head, expect->model.n_head);
    check_int("model.n_embd", got.model.n_embd, expect->model.n_embd);
    if (std::bit_cast<std::uint32_t>(got.model.ln_eps) != std::bit_cast<std::uint32_t>(expect->model.ln_eps))
      mismatch("model.ln_eps", fmt::format("{}", got.model.ln_eps), fmt::format("{}", expect->model.ln_eps));
    check_int("batch", got.batch, expect->batch);
    check_int("seq_len", got.seq_len, expect->seq_len);
    if (got.data != expect->data) mismatch("data", '"' + got.data + '"', '"' + expect->data + '"');
    if (got.dtype && expect->dtype && *got.dtype != *expect->dtype)
      mismatch("train.dtype", std::string(dtype_name(*got.dtype)), std::string(dtype_name(*expect->dtype)));
    check_double("adamw.lr", got.adamw.lr, expect->adamw.lr);
    check_double("adamw.beta1", got.adamw.beta1, expect->adamw.beta1);
    check_double("adamw.beta2", got.adamw.beta2, expect->adamw.beta2);
    check_double("adamw.eps", got.adamw.eps, expect->adamw.eps);
    check_double("adamw.weight_decay", got.adamw.weight_decay, expect->adamw.weight_decay);
  }
  const Gpt2& model = state.model();
  if (!(got.model == model.config()))
    throw CheckpointError(path,
                          fmt::format("the checkpoint holds the model {}, the state to load it into was built for {}",
                                      describe(got.model), describe(model.config())),
                          "build the HostState for the checkpoint's model (read_checkpoint_meta(path).model)");
  for (int l = 0; l < model.num_layers(); ++l)
    if (v.parsed.layer_floats[static_cast<std::size_t>(l)] != static_cast<std::uint64_t>(model.param_floats(l)))
      malformed(path, fmt::format("layer {} has {} floats, the model's {} has {}", l,
                                  v.parsed.layer_floats[static_cast<std::size_t>(l)], model.layer_name(l),
                                  model.param_floats(l)));

  CheckpointMeta meta = std::move(v.parsed.meta);
  std::vector<std::int64_t> steps;
  read_tail(v, path, steps, meta.losses);
  // Everything is verified: fill the state.
  std::uint64_t at = v.parsed.payload_offset;
  for (int l = 0; l < model.num_layers(); ++l) {
    const std::span<float> blocks[] = {state.weights(l), state.exp_avg(l), state.exp_avg_sq(l)};
    for (const std::span<float> b : blocks) {
      pread_exact(v.fd.get(), path, at, b.data(), b.size_bytes());
      at += b.size_bytes();
    }
    state.set_steps(l, steps[static_cast<std::size_t>(l)]);
  }
  state.zero_grads();
  return meta;
}

}  // namespace harmony::backend
