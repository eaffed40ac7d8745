#include "runtime/safetensors.h"

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace strata {
namespace {

size_t dtype_bytes(const std::string& dt, const std::string& path, const std::string& name) {
  if (dt == "F32" || dt == "I32") return 4;
  if (dt == "BF16" || dt == "F16") return 2;
  throw InputError(path, "tensor " + name, "dtype F32, I32 or BF16, got " + dt);
}

}  // namespace

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> StTensor::as_f32() const {
  if (dtype != "F32") throw InputError("<safetensors>", "", "an F32 tensor, got " + dtype);
  std::vector<float> v(static_cast<size_t>(numel()));
  std::memcpy(v.data(), data.data(), v.size() * sizeof(float));
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

StFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "a readable safetensors file");
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  if (size < 8) throw InputError(path, "byte 0", "an 8-byte header length, file has " +
                                                     std::to_string(size) + " bytes");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > static_cast<uint64_t>(size - 8))
    throw InputError(path, "byte 0", "a header length ≤ " + std::to_string(size - 8) +
                                         ", got " + std::to_string(n));
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path, "byte " + std::to_string(8 + e.byte), "a JSON header");
  }
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  const int64_t data_size = size - data_start;
  StFile f;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it->begin(); m != it->end(); ++m)
        f.metadata[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
      continue;
    }
    StTensor t;
    try {
      t.dtype = it->at("dtype").get<std::string>();
      t.shape = it->at("shape").get<std::vector<int64_t>>();
      const auto off = it->at("data_offsets").get<std::vector<int64_t>>();
      if (off.size() != 2 || off[0] < 0 || off[1] < off[0] || off[1] > data_size)
        throw InputError(path, "tensor " + it.key(),
                         "data_offsets within the " + std::to_string(data_size) +
                             " data bytes");
      const int64_t want = t.numel() * static_cast<int64_t>(dtype_bytes(t.dtype, path, it.key()));
      if (off[1] - off[0] != want)
        throw InputError(path, "tensor " + it.key(),
                         std::to_string(want) + " bytes for its shape, offsets span " +
                             std::to_string(off[1] - off[0]));
      t.data.resize(static_cast<size_t>(want));
      in.seekg(data_start + off[0]);
      in.read(t.data.data(), want);
      if (!in) throw InputError(path, "byte " + std::to_string(data_start + off[0]),
                                std::to_string(want) + " readable bytes of " + it.key());
    } catch (const nlohmann::json::exception&) {
      throw InputError(path, "tensor " + it.key(), "dtype, shape and data_offsets");
    }
    f.tensors.emplace(it.key(), std::move(t));
  }
  return f;
}

void write_safetensors(const std::string& path, const StFile& f) {
  nlohmann::ordered_json j;
  if (!f.metadata.empty()) j["__metadata__"] = f.metadata;
  int64_t offset = 0;
  for (const auto& [name, t] : f.tensors) {
    const int64_t bytes = static_cast<int64_t>(t.data.size());
    j[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError(path, "", "a writable path");
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& [name, t] : f.tensors)
    out.write(t.data.data(), static_cast<std::streamsize>(t.data.size()));
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
