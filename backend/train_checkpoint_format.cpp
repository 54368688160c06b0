// The training checkpoint's byte format (train_checkpoint.hpp): the JSON header written from and parsed into a
// CheckpointMeta (every field typed and range-checked, doubles read back from their bit patterns), the two-pass
// reader (every length against the file size and the XXH64 over the whole file, before anything is used).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <system_error>

#include <fmt/format.h>

#include "backend/train_checkpoint_internal.hpp"
#include "core/base/input_file.hpp"

namespace harmony::backend::checkpoint_detail {

using nlohmann::json;

std::string errno_message(int err) { return std::generic_category().message(err); }

std::string bits_hex(double v) { return fmt::format("{:016x}", std::bit_cast<std::uint64_t>(v)); }
std::string bits_hex(float v) { return fmt::format("{:08x}", std::bit_cast<std::uint32_t>(v)); }

std::string describe(const Gpt2Config& c) {
  std::string out =
      fmt::format("{} vocab_size={} max_seq_len={} n_layer={} n_head={} n_embd={} ln_eps={}", arch_name(c.arch),
                  c.vocab_size, c.max_seq_len, c.n_layer, c.n_head, c.n_embd, c.ln_eps);
  if (c.arch == Arch::Llama)
    out +=
        fmt::format(" n_kv_head={} intermediate_size={} rope_theta={} tie_embeddings={} qkv_bias={} sliding_window={}",
                    c.n_kv_head, c.intermediate_size, c.rope_theta, c.tie_embeddings, c.qkv_bias, c.sliding_window);
  return out;
}

nlohmann::ordered_json header_json(const CheckpointMeta& m, const Gpt2& model) {
  nlohmann::ordered_json j;
  j["format"] = "harmony training checkpoint";
  j["checksum"] = "xxh64";
  j["layout"] = kLayout;
  const Gpt2Config& c = m.model;
  j["model"] = {{"arch", arch_name(c.arch)}, {"vocab_size", c.vocab_size}, {"max_seq_len", c.max_seq_len},
                {"n_layer", c.n_layer},      {"n_head", c.n_head},         {"n_embd", c.n_embd},
                {"ln_eps", c.ln_eps}};
  if (c.arch == Arch::Llama) {  // the fields a GPT-2 model does not have (Gpt2Config::validate refuses them there)
    j["model"]["n_kv_head"] = c.n_kv_head;
    j["model"]["intermediate_size"] = c.intermediate_size;
    j["model"]["rope_theta"] = c.rope_theta;
    j["model"]["tie_embeddings"] = c.tie_embeddings;
    j["model"]["qkv_bias"] = c.qkv_bias;
    j["model"]["sliding_window"] = c.sliding_window;
  }
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
  j["bits"] = {{"model.ln_eps", bits_hex(c.ln_eps)}};
  if (c.arch == Arch::Llama) j["bits"]["model.rope_theta"] = bits_hex(c.rope_theta);
  j["bits"]["adamw.lr"] = bits_hex(m.adamw.lr);
  j["bits"]["adamw.beta1"] = bits_hex(m.adamw.beta1);
  j["bits"]["adamw.beta2"] = bits_hex(m.adamw.beta2);
  j["bits"]["adamw.eps"] = bits_hex(m.adamw.eps);
  j["bits"]["adamw.weight_decay"] = bits_hex(m.adamw.weight_decay);
  return j;
}

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
  bool boolean(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_boolean())
      fail(fmt::format("'{}' is {}, not true or false", where.empty() ? key : where + "." + key, v.dump()));
    return v.get<bool>();
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

// The model object: version 1 files (written before the Llama family could be checkpointed) have no "arch" and are
// GPT-2; from version 2 "arch" is required, and a Llama model carries its own fields (all required).
Gpt2Config parse_model(const HeaderReader& r, const json& j, std::uint32_t version) {
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  Gpt2Config c;
  const json& model = r.field(j, "model", "");
  if (version >= 2) {
    const std::string arch = r.str(model, "arch", "model");
    if (arch == arch_name(Arch::Llama)) {
      c.arch = Arch::Llama;
    } else if (arch != arch_name(Arch::Gpt2)) {
      r.fail(fmt::format("'model.arch' is \"{}\", neither \"gpt2\" nor \"llama\"", arch));
    }
  }
  c.vocab_size = static_cast<int>(r.i64(model, "vocab_size", "model", 0, kIntMax));
  c.max_seq_len = static_cast<int>(r.i64(model, "max_seq_len", "model", 0, kIntMax));
  c.n_layer = static_cast<int>(r.i64(model, "n_layer", "model", 0, kIntMax - 2));
  c.n_head = static_cast<int>(r.i64(model, "n_head", "model", 0, kIntMax));
  c.n_embd = static_cast<int>(r.i64(model, "n_embd", "model", 0, kIntMax));
  c.ln_eps = std::bit_cast<float>(static_cast<std::uint32_t>(r.bits("model.ln_eps", 8)));
  if (c.arch == Arch::Llama) {
    c.n_kv_head = static_cast<int>(r.i64(model, "n_kv_head", "model", 0, kIntMax));
    c.intermediate_size = static_cast<int>(r.i64(model, "intermediate_size", "model", 0, kIntMax));
    c.rope_theta = std::bit_cast<float>(static_cast<std::uint32_t>(r.bits("model.rope_theta", 8)));
    c.tie_embeddings = r.boolean(model, "tie_embeddings", "model");
    c.qkv_bias = r.boolean(model, "qkv_bias", "model");
    c.sliding_window = static_cast<int>(r.i64(model, "sliding_window", "model", 0, kIntMax));
  }
  try {
    c.validate();
  } catch (const BackendError& e) {
    r.fail(e.what());
  }
  return c;
}

Parsed parse_header(const std::string& path, const std::string& text, std::uint32_t version,
                    std::uint64_t payload_offset, std::uint64_t payload_bytes) {
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
  m.model = parse_model(r, j, version);
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
  std::optional<Gpt2> shape;  // the model the header describes: its layers' sizes must be the listed ones
  try {
    shape.emplace(m.model);
  } catch (const BackendError& e) {
    r.fail(e.what());
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::uint64_t n = r.u64(layers[l], "floats", fmt::format("layers[{}]", l));
    const int layer = static_cast<int>(l);
    if (n != static_cast<std::uint64_t>(shape->param_floats(layer)))
      r.fail(fmt::format("layer {} has {} floats, the model's {} has {} ({})", l, n, shape->layer_name(layer),
                         shape->param_floats(layer), describe(m.model)));
    p.layer_floats.push_back(n);
    add(n, 3 * sizeof(float), "weights and moments");
  }
  add(num_layers, sizeof(std::int64_t), "step counts");
  add(p.num_losses, sizeof(double), "losses");
  if (expected != payload_bytes)
    r.fail(fmt::format("the payload has {} bytes, the header's layers and losses need {}", payload_bytes, expected));
  return p;
}

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

// The checkpoint file opened for reading (a regular file), and its size in *size.
Fd open_checkpoint(const std::string& path, std::uint64_t* size) {
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
  *size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

// The file starts with the magic (as far as it goes: a shorter file is named by what it holds).
void check_magic(const std::string& path, const std::array<unsigned char, kFixedBytes>& fixed, std::uint64_t size) {
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
}

// The fixed header's version and flags (ones this build reads), and its lengths, whose sum with the fixed header
// and the trailer (returned) must be the file's size.
std::uint64_t checked_file_bytes(const std::string& path, std::uint32_t version, std::uint32_t flags,
                                 std::uint64_t header_bytes, std::uint64_t payload_bytes, std::uint64_t size) {
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
  return expected;
}

// Pass 1: the XXH64 over everything before the trailer (the first `expected` - trailer bytes, the fixed header
// already read) against the trailer's.
void verify_checksum(const Fd& fd, const std::string& path, const std::array<unsigned char, kFixedBytes>& fixed,
                     std::uint64_t expected) {
  XxHash64 hash;
  hash.update(fixed.data(), kFixedBytes);
  std::vector<unsigned char> chunk(static_cast<std::size_t>(std::min<std::uint64_t>(kIoChunkBytes, expected)));
  for (std::uint64_t at = kFixedBytes; at < expected - kTrailerBytes;) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), expected - kTrailerBytes - at);
    pread_exact(fd.get(), path, at, chunk.data(), n);
    hash.update(chunk.data(), static_cast<std::size_t>(n));
    at += n;
  }
  std::array<unsigned char, kTrailerBytes> trailer{};
  pread_exact(fd.get(), path, expected - kTrailerBytes, trailer.data(), kTrailerBytes);
  const std::uint64_t stored = load_le64(trailer.data());
  const std::uint64_t computed = hash.digest();
  if (stored != computed)
    throw CheckpointError(
        path, fmt::format("corrupt: checksum mismatch (stored XXH64 {:016x}, computed {:016x})", stored, computed),
        damaged_hint(path));
}

// Every check that needs no state: magic, version, lengths against the file size, the checksum over the whole
// file, the header's fields and their consistency with the payload length and the model they describe.
Verified open_and_verify(const std::string& path) {
  std::uint64_t size = 0;
  Fd fd = open_checkpoint(path, &size);
  std::array<unsigned char, kFixedBytes> fixed{};
  pread_exact(fd.get(), path, 0, fixed.data(), std::min<std::uint64_t>(size, kFixedBytes));
  check_magic(path, fixed, size);
  if (size < kFixedBytes)
    throw CheckpointError(path,
                          fmt::format("truncated: {} bytes, shorter than the {}-byte fixed header", size, kFixedBytes),
                          damaged_hint(path));
  const std::uint32_t version = load_le32(fixed.data() + 8);
  const std::uint64_t header_bytes = load_le64(fixed.data() + 16);
  const std::uint64_t payload_bytes = load_le64(fixed.data() + 24);
  const std::uint64_t expected =
      checked_file_bytes(path, version, load_le32(fixed.data() + 12), header_bytes, payload_bytes, size);
  verify_checksum(fd, path, fixed, expected);
  std::string text(static_cast<std::size_t>(header_bytes), '\0');
  pread_exact(fd.get(), path, kFixedBytes, text.data(), header_bytes);
  Parsed parsed = parse_header(path, text, version, kFixedBytes + header_bytes, payload_bytes);
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

}  // namespace harmony::backend::checkpoint_detail
