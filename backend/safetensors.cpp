// safetensors reading (the whole header validated up front, tensor data read on demand, F16/BF16 widened
// to F32) and F32 writing through core::AtomicFile; see safetensors.hpp.
#include "backend/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/base/atomic_file.hpp"
#include "core/base/input_file.hpp"

namespace harmony::backend {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr std::uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit

std::optional<std::uint64_t> dtype_size(const std::string& dtype) {
  static const std::map<std::string, std::uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  if (it == sizes.end()) return std::nullopt;
  return it->second;
}

}  // namespace

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);  // +-0
    // Subnormal: mant * 2^-24, a normal float (exact: 10 bits of mantissa, exponent >= -24).
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(mag));
  }
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf (mant 0) or NaN with its payload
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

FormatError::FormatError(std::string file, std::uint64_t offset, const std::string& message)
    : BackendError(fmt::format("{}: byte {}: {}", file, offset, message)), file_(std::move(file)), offset_(offset) {}

SafetensorsReader SafetensorsReader::open(const std::string& path) {
  if (const auto problem = core::input_file_problem(path))  // folders, FIFOs, devices refused
    throw FormatError(path, 0, "cannot open the file: " + *problem);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(path, 0, "cannot open the file");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  if (size < 8)
    throw FormatError(path, size, fmt::format("file of {} bytes is too short for the 8-byte header length", size));
  std::uint8_t len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t n = 0;
  std::memcpy(&n, len_bytes, 8);
  if (n > kMaxHeader || n > size - 8)
    throw FormatError(path, 0,
                      fmt::format("header length {} exceeds the {} bytes after it{}", n, size - 8,
                                  n > kMaxHeader ? " (and the 100 MB limit)" : " (truncated file?)"));
  std::string header(static_cast<std::size_t>(n), '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  if (!in) throw FormatError(path, 8, "cannot read the header");
  SafetensorsReader r;
  r.name_ = path;
  r.parse(size, header);
  return r;
}

SafetensorsReader SafetensorsReader::from_bytes(std::vector<std::uint8_t> bytes, std::string name) {
  const std::uint64_t size = bytes.size();
  if (size < 8)
    throw FormatError(name, size, fmt::format("file of {} bytes is too short for the 8-byte header length", size));
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeader || n > size - 8)
    throw FormatError(name, 0,
                      fmt::format("header length {} exceeds the {} bytes after it{}", n, size - 8,
                                  n > kMaxHeader ? " (and the 100 MB limit)" : " (truncated file?)"));
  std::string header(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(n));
  SafetensorsReader r;
  r.name_ = std::move(name);
  r.bytes_ = std::move(bytes);
  r.parse(size, header);
  return r;
}

namespace {

// One tensor's header entry: its dtype, shape and data_offsets, checked against each other (the bytes the offsets
// hold are the shape's); `bad(msg)` is the error naming the tensor.
template <class Bad>
TensorInfo tensor_entry(const std::string& key, const nlohmann::json& v, const Bad& bad) {
  if (!v.is_object()) throw bad("entry must be an object with dtype, shape and data_offsets");
  TensorInfo t;
  t.name = key;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) throw bad("missing or non-string 'dtype'");
  t.dtype = dt->get<std::string>();
  const auto esize = dtype_size(t.dtype);
  if (!esize) throw bad(fmt::format("unknown dtype '{}'", t.dtype));
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) throw bad("missing 'shape' array");
  std::uint64_t numel = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
    const auto dim = d.get<std::uint64_t>();
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        __builtin_mul_overflow(numel, dim, &numel) ||
        numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw bad("shape has too many elements");
    t.shape.push_back(static_cast<std::int64_t>(dim));
  }
  t.numel = static_cast<std::int64_t>(numel);
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    throw bad("'data_offsets' must be [begin, end] with non-negative integers");
  t.begin = (*off)[0].get<std::uint64_t>();
  t.end = (*off)[1].get<std::uint64_t>();
  if (t.begin > t.end) throw bad(fmt::format("data_offsets [{}, {}] run backwards", t.begin, t.end));
  std::uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, *esize, &nbytes) || t.end - t.begin != nbytes)
    throw bad(fmt::format("data_offsets [{}, {}] hold {} bytes but {} {} of shape {} need {}", t.begin, t.end,
                          t.end - t.begin, numel, t.dtype, nlohmann::json(t.shape).dump(), numel * *esize));
  return t;
}

}  // namespace

void SafetensorsReader::parse(std::uint64_t file_size, const std::string& text) {
  data_start_ = 8 + text.size();
  const std::uint64_t data_size = file_size - data_start_;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const std::uint64_t at = 8 + std::min<std::uint64_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    throw FormatError(name_, at, fmt::format("header is not valid JSON: {}", e.what()));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(name_, 8, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) throw FormatError(name_, 8, "header must be a JSON object");
  // Byte offset of a key in the header text, for messages.
  auto where = [&](const std::string& key) -> std::uint64_t {
    const std::string quoted = nlohmann::json(key).dump();
    const auto pos = text.find(quoted);
    return 8 + (pos == std::string::npos ? 0 : pos);
  };
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) throw FormatError(name_, where(key), "__metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw FormatError(name_, where(m.key()), fmt::format("__metadata__ value of '{}' is not a string", m.key()));
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& msg) {
      return FormatError(name_, where(key), fmt::format("tensor '{}': {}", key, msg));
    };
    TensorInfo t = tensor_entry(key, v, bad);
    if (t.end > data_size)
      throw FormatError(name_, file_size,
                        fmt::format("tensor '{}': data [{}, {}) ends past the end of the file (data section of {} "
                                    "bytes starting at byte {}; truncated file?)",
                                    key, t.begin, t.end, data_size, data_start_));
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (std::size_t i = 1; i < tensors_.size(); ++i) {
    const TensorInfo& a = tensors_[i - 1];
    const TensorInfo& b = tensors_[i];
    if (b.begin < a.end)
      throw FormatError(name_, data_start_ + b.begin,
                        fmt::format("tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", a.name, a.begin, a.end, b.name,
                                    b.begin, b.end));
  }
}

const TensorInfo* SafetensorsReader::find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void SafetensorsReader::read_bytes(std::uint64_t offset, void* dst, std::uint64_t n) const {
  if (n == 0) return;
  if (bytes_) {
    std::memcpy(dst, bytes_->data() + offset, static_cast<std::size_t>(n));
    return;
  }
  std::ifstream in(name_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  if (!in) throw FormatError(name_, offset, fmt::format("cannot read {} bytes (file changed or truncated?)", n));
}

std::vector<float> SafetensorsReader::read_f32(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) throw FormatError(name_, 0, fmt::format("no tensor named '{}'", name));
  std::vector<float> out(static_cast<std::size_t>(t->numel));
  read_f32(name, out);
  return out;
}

void SafetensorsReader::read_f32(std::string_view name, std::span<float> out) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) throw FormatError(name_, 0, fmt::format("no tensor named '{}'", name));
  const bool half = t->dtype == "F16", bhalf = t->dtype == "BF16";
  if (t->dtype != "F32" && !half && !bhalf)
    throw FormatError(
        name_, data_start_ + t->begin,
        fmt::format("tensor '{}' is {}; only F32, F16 and BF16 tensors can be read as floats", t->name, t->dtype));
  if (static_cast<std::int64_t>(out.size()) != t->numel)
    throw BackendError(
        fmt::format("{}: tensor '{}' has {} elements, the destination {}", name_, t->name, t->numel, out.size()));
  read_bytes(data_start_ + t->begin, out.data(), t->end - t->begin);
  if (!half && !bhalf) return;
  // The 16-bit values fill the first half of `out`; widen in place from the back, so that each float written
  // (bytes 4i..4i+3) only covers 16-bit values at index >= i, already converted.
  auto* raw = reinterpret_cast<unsigned char*>(out.data());
  for (std::size_t i = out.size(); i-- > 0;) {
    std::uint16_t v = 0;
    std::memcpy(&v, raw + 2 * i, 2);
    const float f = half ? f16_to_f32(v) : bf16_to_f32(v);
    std::memcpy(raw + 4 * i, &f, 4);
  }
}

std::vector<std::uint8_t> encode_safetensors(const std::vector<TensorView>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw BackendError(fmt::format("safetensors: invalid tensor name '{}'", t.name));
    if (header.contains(t.name)) throw BackendError(fmt::format("safetensors: duplicate tensor name '{}'", t.name));
    std::int64_t numel = 1;
    for (auto d : t.shape) {
      if (d < 0) throw BackendError(fmt::format("safetensors: tensor '{}' has a negative dimension", t.name));
      numel *= d;
    }
    if (numel != static_cast<std::int64_t>(t.data.size()))
      throw BackendError(fmt::format("safetensors: tensor '{}' has shape {} ({} elements) but {} values", t.name,
                                     nlohmann::json(t.shape).dump(), numel, t.data.size()));
    const std::uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::uint8_t> out(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::uint8_t* p = out.data() + 8 + text.size();
  for (const TensorView& t : tensors) {
    if (!t.data.empty()) std::memcpy(p, t.data.data(), t.data.size() * sizeof(float));
    p += t.data.size() * sizeof(float);
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<std::uint8_t> bytes = encode_safetensors(tensors, metadata);
  core::write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                          "the weights");
}

}  // namespace harmony::backend
