// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header length, a
// JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {string: string}}, then the raw tensor
// bytes. The reader validates the whole header up front (offsets inside the file, sizes matching shapes,
// no overlaps), so truncated or malformed input is a FormatError naming the file and byte offset, never
// a crash; tensor data is read on demand, F16 and BF16 converted to F32 (exactly: every half and bfloat16
// value, subnormals, infinities and NaNs included, is a float). The writer writes F32 tensors.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device.hpp"

namespace harmony::backend {

// Malformed input file. what(): "<file>: byte <offset>: <message>".
class FormatError : public BackendError {
 public:
  FormatError(std::string file, std::uint64_t offset, const std::string& message);
  const std::string& file() const { return file_; }
  std::uint64_t offset() const { return offset_; }

 private:
  std::string file_;
  std::uint64_t offset_;
};

struct TensorInfo {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "I64", ...
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::uint64_t begin = 0;  // byte range within the data section (after the header)
  std::uint64_t end = 0;
};

class SafetensorsReader {
 public:
  static SafetensorsReader open(const std::string& path);
  // Parses an in-memory file; `name` stands for the file in messages.
  static SafetensorsReader from_bytes(std::vector<std::uint8_t> bytes, std::string name);

  const std::string& name() const { return name_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data order
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::uint64_t data_start() const { return data_start_; }  // file offset of the data section
  // A floating-point tensor's values as floats (little-endian in the file): F32 as stored, F16 and BF16
  // widened (f16_to_f32, bf16_to_f32). FormatError if absent or of another dtype (F64, integers, F8).
  std::vector<float> read_f32(std::string_view name) const;
  void read_f32(std::string_view name, std::span<float> out) const;  // out.size() must equal numel

 private:
  void parse(std::uint64_t file_size, const std::string& header_text);
  void read_bytes(std::uint64_t offset, void* dst, std::uint64_t n) const;

  std::string name_;
  std::optional<std::vector<std::uint8_t>> bytes_;  // in-memory files; else read from name_
  std::uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// IEEE binary16 (bits) to float: normals, subnormals (mantissa * 2^-24), +-0, +-inf and NaN (payload kept).
float f16_to_f32(std::uint16_t bits);
// bfloat16 (the upper 16 bits of a float) to float.
float bf16_to_f32(std::uint16_t bits);

struct TensorView {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<const float> data;  // numel(shape) floats
};

// F32 tensors in the given order; the header is padded with spaces to a multiple of 8 bytes.
std::vector<std::uint8_t> encode_safetensors(const std::vector<TensorView>& tensors,
                                             const std::map<std::string, std::string>& metadata = {});
// Writes PATH atomically through core::AtomicFile (a regular file is replaced, a symlink written through, a
// device, FIFO or folder refused). Throws BackendError on a bad tensor, core::FileError on I/O failure (PATH
// untouched, no temp file left).
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace harmony::backend
