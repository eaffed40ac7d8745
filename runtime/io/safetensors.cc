#include "runtime/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "kernels/cpu/precision.h"
#include "runtime/base/error.h"
#include "runtime/io/input_file.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

// The largest JSON header read (Hugging Face's safetensors refuses larger ones too).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// `path`, once it is known to be a regular file (the stream's open would block on a FIFO).
const std::string& checked_input(const std::string& path) {
  check_input_file(path, kAnySize);
  return path;
}

// IEEE half → f32, exactly (every half is an f32: subnormal halves become normal floats).
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u = 0;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // infinity or NaN (payload kept)
  } else if (exp != 0) {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;  // ±0
  } else {
    // Subnormal: mant·2⁻²⁴. Shift the leading one up to the implicit bit.
    uint32_t e = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::string header_entry_error(int64_t data_size) {
  return "dtype, shape and data_offsets within the " + std::to_string(data_size) + " data bytes";
}

}  // namespace

int64_t st_dtype_bytes(const std::string& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "BF16" || dt == "F16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "I8" || dt == "U8" || dt == "BOOL" || dt == "F8_E4M3" || dt == "F8_E5M2") return 1;
  return 0;
}

bool st_is_float(const std::string& dt) {
  return dt == "F32" || dt == "BF16" || dt == "F16" || dt == "F64";
}

void st_to_f32(const std::string& dt, const char* raw, int64_t n, float* out) {
  const size_t count = static_cast<size_t>(n);
  if (dt == "F32") {
    std::memcpy(out, raw, count * sizeof(float));
  } else if (dt == "BF16" || dt == "F16") {
    const bool bf16 = dt == "BF16";
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, raw + 2 * i, 2);
      out[i] = bf16 ? kernels::cpu::bf16_to_f32(h) : f16_to_f32(h);
    }
  } else if (dt == "F64") {
    for (size_t i = 0; i < count; ++i) {
      double d;
      std::memcpy(&d, raw + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    throw InputError("<safetensors>", "", "a float tensor (F32, BF16, F16, F64), got " + dt);
  }
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t StEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> StTensor::as_f32() const {
  if (!st_is_float(dtype))
    throw InputError("<safetensors>", "", "a float tensor (F32, BF16, F16, F64), got " + dtype);
  std::vector<float> v(static_cast<size_t>(numel()));
  st_to_f32(dtype, data.data(), numel(), v.data());
  return v;
}

std::vector<int32_t> StTensor::as_i32() const {
  if (dtype != "I32") throw InputError("<safetensors>", "", "an I32 tensor, got " + dtype);
  std::vector<int32_t> v(static_cast<size_t>(numel()));
  std::memcpy(v.data(), data.data(), v.size() * sizeof(int32_t));
  return v;
}

const StTensor& StFile::at(const std::string& name, const std::string& path) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw InputError(path, "tensor " + name, "present, but it is missing");
  return it->second;
}

StReader::StReader(const std::string& path)
    : path_(path), in_(checked_input(path), std::ios::binary) {
  if (!in_) throw InputError(path, "", "a readable safetensors file");
  in_.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in_.tellg());
  in_.seekg(0);
  if (size < 8)
    throw InputError(path, "byte 0",
                     "an 8-byte header length, file has " + std::to_string(size) + " bytes");
  uint64_t n = 0;
  in_.read(reinterpret_cast<char*>(&n), 8);
  if (n > kMaxHeaderBytes)
    throw InputError(
        path, "byte 0",
        "a header length ≤ " + std::to_string(kMaxHeaderBytes) + ", got " + std::to_string(n));
  if (n > static_cast<uint64_t>(size - 8))
    throw InputError(
        path, "byte 0",
        "a header length ≤ " + std::to_string(size - 8) + ", got " + std::to_string(n));
  std::string header(n, '\0');
  in_.read(header.data(), static_cast<std::streamsize>(n));
  nlohmann::json j;
  try {
    j = parse_json(header, path);
  } catch (const InputError& e) {
    // The header starts at byte 8 of the file.
    std::string where = e.where();
    if (where.rfind("byte ", 0) == 0)
      where = "byte " + std::to_string(8 + std::stoull(where.substr(5)));
    throw InputError(path, where, "a JSON header: " + e.expected());
  }
  if (!j.is_object()) throw InputError(path, "byte 8", "a JSON object as the header");
  data_start_ = 8 + static_cast<int64_t>(n);
  const int64_t data_size = size - data_start_;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw InputError(path, "__metadata__", "an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m)
        metadata_[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
      continue;
    }
    const std::string where = "tensor " + it.key();
    StEntry e;
    try {
      e.dtype = it->at("dtype").get<std::string>();
      e.shape = it->at("shape").get<std::vector<int64_t>>();
      const auto off = it->at("data_offsets").get<std::vector<int64_t>>();
      if (off.size() != 2 || off[0] < 0 || off[1] < off[0] || off[1] > data_size)
        throw InputError(path, where, header_entry_error(data_size));
      e.begin = off[0];
      e.end = off[1];
    } catch (const nlohmann::json::exception&) {
      throw InputError(path, where, header_entry_error(data_size));
    }
    const int64_t bytes = st_dtype_bytes(e.dtype);
    if (bytes == 0)
      throw InputError(path, where,
                       "a safetensors dtype (F64, F32, BF16, F16, I64, I32, I16, I8, U8, BOOL, …), "
                       "got " +
                           e.dtype);
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0 || (d > 0 && numel > data_size / d))
        throw InputError(
            path, where,
            "a shape of sizes ≥ 0 that fits the file's data, got " + it->at("shape").dump());
      numel *= d;
    }
    const int64_t want = numel * bytes;
    if (e.end - e.begin != want)
      throw InputError(path, where,
                       std::to_string(want) + " bytes for its shape, offsets span " +
                           std::to_string(e.end - e.begin));
    entries_.emplace(it.key(), std::move(e));
  }
  // As the safetensors library requires: the tensors tile the data section in offset order, no
  // overlap, no gap, nothing after the last (a byte no tensor owns could hide anything).
  std::vector<std::pair<const std::string*, const StEntry*>> order;
  for (const auto& [name, e] : entries_) order.emplace_back(&name, &e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second->begin, a.second->end) <
           std::make_pair(b.second->begin, b.second->end);
  });
  int64_t next = 0;
  for (const auto& [name, e] : order) {
    if (e->begin != next)
      throw InputError(path, "tensor " + *name,
                       "data_offsets starting at " + std::to_string(next) +
                           ", where the previous tensor in offset order ends (no overlap, no "
                           "gap), got [" +
                           std::to_string(e->begin) + ", " + std::to_string(e->end) + "]");
    next = e->end;
  }
  if (next != data_size)
    throw InputError(path, "byte " + std::to_string(data_start_ + next),
                     "the end of the file after the last tensor's data, " +
                         std::to_string(data_size - next) + " more bytes follow");
}

const StEntry& StReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw InputError(path_, "tensor " + name, "present, but it is missing");
  return it->second;
}

void StReader::read_bytes(const std::string& name, const StEntry& e, char* out) {
  in_.clear();
  in_.seekg(data_start_ + e.begin);
  in_.read(out, e.end - e.begin);
  if (!in_)
    throw InputError(path_, "byte " + std::to_string(data_start_ + e.begin),
                     std::to_string(e.end - e.begin) + " readable bytes of " + name);
}

StTensor StReader::read(const std::string& name) {
  const StEntry& e = entry(name);
  StTensor t;
  t.dtype = e.dtype;
  t.shape = e.shape;
  t.data.resize(static_cast<size_t>(e.end - e.begin));
  read_bytes(name, e, t.data.data());
  return t;
}

std::vector<float> StReader::read_f32(const std::string& name) {
  const StEntry& e = entry(name);
  if (!st_is_float(e.dtype))
    throw InputError(path_, "tensor " + name,
                     "a float tensor (F32, BF16, F16, F64), got " + e.dtype);
  std::vector<float> v(static_cast<size_t>(e.numel()));
  if (e.dtype == "F32") {
    read_bytes(name, e, reinterpret_cast<char*>(v.data()));  // straight into the floats
  } else {
    std::vector<char> raw(static_cast<size_t>(e.end - e.begin));
    read_bytes(name, e, raw.data());
    st_to_f32(e.dtype, raw.data(), e.numel(), v.data());
  }
  return v;
}

StFile read_safetensors(const std::string& path) {
  StReader r(path);
  StFile f;
  f.metadata = r.metadata();
  for (const auto& [name, e] : r.entries()) f.tensors.emplace(name, r.read(name));
  return f;
}

namespace {

// The header (padded with spaces so the data starts 8-byte aligned, as the safetensors library
// writes it) of tensors (name, dtype, shape, bytes) in data order.
struct HeaderItem {
  const std::string* name;
  const std::string* dtype;
  const std::vector<int64_t>* shape;
  int64_t bytes;
};
std::string make_header(const std::vector<HeaderItem>& items,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j;
  if (!metadata.empty()) j["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const HeaderItem& t : items) {
    j[*t.name] = {
        {"dtype", *t.dtype}, {"shape", *t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

void write_header(std::ofstream& out, const std::string& header) {
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
}

}  // namespace

void write_safetensors(const std::string& path, const StFile& f) {
  std::vector<HeaderItem> items;
  for (const auto& [name, t] : f.tensors)
    items.push_back({&name, &t.dtype, &t.shape, static_cast<int64_t>(t.data.size())});
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError(path, "", "a writable path");
  write_header(out, make_header(items, f.metadata));
  for (const auto& [name, t] : f.tensors)
    out.write(t.data.data(), static_cast<std::streamsize>(t.data.size()));
  if (!out) throw InputError(path, "", "a file that can be written completely");
}

void write_safetensors_f32(const std::string& path, const std::vector<StF32View>& tensors,
                           const std::string& dtype,
                           const std::map<std::string, std::string>& metadata) {
  if (dtype != "F32" && dtype != "BF16")
    throw InputError(path, "", "F32 or BF16 as the dtype to write, got " + dtype);
  const int64_t width = st_dtype_bytes(dtype);
  std::vector<HeaderItem> items;
  for (const StF32View& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    items.push_back({&t.name, &dtype, &t.shape, n * width});
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError(path, "", "a writable path");
  write_header(out, make_header(items, metadata));
  std::vector<uint16_t> half;  // one tensor's BF16 values at a time
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = items[i].bytes / width;
    if (dtype == "F32") {
      out.write(reinterpret_cast<const char*>(tensors[i].data),
                static_cast<std::streamsize>(n * 4));
      continue;
    }
    half.resize(static_cast<size_t>(n));
    for (size_t k = 0; k < half.size(); ++k)
      half[k] = kernels::cpu::f32_to_bf16(tensors[i].data[k]);
    out.write(reinterpret_cast<const char*>(half.data()), static_cast<std::streamsize>(n * 2));
  }
  if (!out) throw InputError(path, "", "a file that can be written completely");
}

StTensor st_from_f32(const float* p, const std::vector<int64_t>& shape) {
  StTensor t;
  t.dtype = "F32";
  t.shape = shape;
  t.data.resize(static_cast<size_t>(t.numel()) * 4);
  std::memcpy(t.data.data(), p, t.data.size());
  return t;
}

}  // namespace strata
