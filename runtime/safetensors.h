// safetensors.h — read and write the safetensors format (Hugging Face).
//
// Layout: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32"|"I32"|"BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "string value", ...}}
// then the raw little-endian data, offsets relative to the end of the header. Used for golden
// fixtures, checkpoints and exports. Malformed files throw InputError naming the file and the
// byte offset or tensor at fault.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata {

struct StTensor {
  std::string dtype;           // "F32", "I32", "BF16"
  std::vector<int64_t> shape;  // outermost first
  std::vector<char> data;      // raw little-endian bytes

  int64_t numel() const;
  std::vector<float> as_f32() const;      // F32 only (InputError otherwise)
  std::vector<int32_t> as_i32() const;    // I32 only
};

struct StFile {
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor named `name`; InputError naming `path` when absent.
  const StTensor& at(const std::string& name, const std::string& path) const;
};

StFile read_safetensors(const std::string& path);
// Writes atomically enough for fixtures (checkpoints add their own rename protocol).
void write_safetensors(const std::string& path, const StFile& f);

StTensor st_from_f32(const float* p, const std::vector<int64_t>& shape);

}  // namespace strata
