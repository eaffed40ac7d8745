// safetensors.h — read and write the safetensors format (Hugging Face).
//
// Layout: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32"|"BF16"|"I32"|…, "shape": [...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "string value", ...}}
// then the raw little-endian data, offsets relative to the end of the header. Used for golden
// fixtures, checkpoints and exports. Malformed files throw InputError naming the file and the
// byte offset or tensor at fault.
//
// Two ways in: read_safetensors loads a whole (small) file; StReader parses the header and reads
// one tensor at a time, so a model file need not be held twice (raw bytes and floats). Writing
// likewise: write_safetensors from bytes held in an StFile, write_safetensors_f32 straight from
// f32 buffers, converting one tensor at a time.
//
// Float dtypes: F32, BF16 and F16 read as f32 exactly (both 16-bit formats are subsets of f32);
// F64 rounds to the nearest f32. Writing BF16 rounds to nearest, ties to even.
//
// Thread-safety: plain values; one StReader per thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace strata {

struct StTensor {
  std::string dtype;           // "F32", "I32", "BF16", "F16", …
  std::vector<int64_t> shape;  // outermost first
  std::vector<char> data;      // raw little-endian bytes

  int64_t numel() const;
  std::vector<float> as_f32() const;    // a float dtype (st_is_float; InputError otherwise)
  std::vector<int32_t> as_i32() const;  // I32 only
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

// Bytes per element of a safetensors dtype; 0 for a name the format does not define.
int64_t st_dtype_bytes(const std::string& dtype);
// Whether `dtype` reads as f32 (F32, BF16, F16, F64).
bool st_is_float(const std::string& dtype);
// `n` elements of `dtype` (st_is_float) at `raw` as f32, into `out`.
void st_to_f32(const std::string& dtype, const char* raw, int64_t n, float* out);

// One tensor's header entry.
struct StEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // bytes [begin, end) of the data section

  int64_t numel() const;
};

// A safetensors file opened for reading tensor by tensor. The constructor reads and checks the
// header (every tensor's dtype known, its shape's sizes ≥ 0, its byte span inside the file and
// matching its shape; the spans tiling the data section in offset order without overlap or gap,
// as the safetensors library requires).
class StReader {
 public:
  explicit StReader(const std::string& path);
  StReader(const StReader&) = delete;
  StReader& operator=(const StReader&) = delete;

  const std::string& path() const { return path_; }
  // Bytes before the data section: the length prefix and the JSON header.
  int64_t data_start() const { return data_start_; }
  const std::map<std::string, StEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }

  // The tensor's raw bytes; InputError naming the file and the tensor when it is absent.
  StTensor read(const std::string& name);
  // A float tensor (st_is_float) as f32: InputError naming the file and tensor otherwise.
  std::vector<float> read_f32(const std::string& name);

 private:
  const StEntry& entry(const std::string& name) const;
  void read_bytes(const std::string& name, const StEntry& e, char* out);

  std::string path_;
  std::ifstream in_;
  int64_t data_start_ = 0;
  std::map<std::string, StEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write from f32 values.
struct StF32View {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel values, row-major
};
// Writes `tensors` in the given order as `dtype` ("F32", or "BF16" rounded to nearest even),
// converting one tensor at a time. InputError naming `path` when it cannot be written.
void write_safetensors_f32(const std::string& path, const std::vector<StF32View>& tensors,
                           const std::string& dtype,
                           const std::map<std::string, std::string>& metadata);

}  // namespace strata
