#include "models/hf_checkpoint.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "models/registry.h"
#include "runtime/base/error.h"
#include "runtime/io/json_file.h"
#include "runtime/io/safetensors.h"

namespace strata {
namespace {
namespace fs = std::filesystem;

const char* const kConfig = "config.json";
const char* const kSingle = "model.safetensors";
const char* const kIndex = "model.safetensors.index.json";

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

nlohmann::json read_json(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path, "", what);
  const nlohmann::json j = read_json_file(path);
  if (!j.is_object()) throw InputError(path, "", "a JSON object");
  return j;
}

// Every float tensor of `r` named in `names` (all of them when null) into `out`.
void read_floats(StReader& r, const std::vector<std::string>* names, HfTensors& out) {
  std::vector<std::string> all;
  if (!names) {
    for (const auto& [name, e] : r.entries()) all.push_back(name);
    names = &all;
  }
  for (const std::string& name : *names) {
    const StEntry& e = r.entries().at(name);
    if (!st_is_float(e.dtype)) continue;
    FullTensor t{e.shape, r.read_f32(name)};
    expect_finite(r.path(), "tensor " + name, t.data.data(), static_cast<int64_t>(t.data.size()));
    out.tensors[name] = std::move(t);
    out.file[name] = r.path();
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError(path, "", "a writable path");
  out << text;
  if (!out) throw InputError(path, "", "a file that can be written completely");
}

// A save's own file names: model.safetensors, the index, model-00001-of-00003.safetensors.
bool is_weights_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingle || name == kIndex || std::regex_match(name, shard);
}

std::vector<StF32View> views(const FullTensors& t, const std::vector<std::string>& names) {
  std::vector<StF32View> v;
  for (const std::string& n : names) {
    const FullTensor& f = t.at(n);
    v.push_back({n, f.shape, f.data.data()});
  }
  return v;
}

// Name pieces for the natural order: runs of digits compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      // Compare as numbers without overflow: strip leading zeros, then length, then digits.
      size_t ia = i, jb = j;
      while (ia + 1 < ie && a[ia] == '0') ++ia;
      while (jb + 1 < je && b[jb] == '0') ++jb;
      const std::string na = a.substr(ia, ie - ia), nb = b.substr(jb, je - jb);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

// The error_code forms of std::filesystem throughout: a path the system refuses (too long, say)
// is then a missing file, which the readers report as input errors, not a filesystem_error.
bool is_hf_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

nlohmann::json read_hf_config(const std::string& dir) {
  return read_json(join(dir, kConfig),
                   "a Hugging Face config.json (a model directory as save_pretrained writes it)");
}

namespace {

// Calls f(reader, names) for each safetensors file of a directory or of one file: names is the
// tensors the index assigns to that shard, or null for every tensor of a single file. Returns the
// listing (the index, or the one file). The index is checked first: shard names that are files of
// the directory, present, holding what it says.
std::string for_each_hf_file(
    const std::string& path,
    const std::function<void(StReader&, const std::vector<std::string>*)>& f) {
  if (!is_hf_directory(path)) {
    StReader r(path);
    f(r, nullptr);
    return path;
  }
  const std::string index = join(path, kIndex);
  std::error_code ec;
  if (!fs::exists(index, ec)) {
    const std::string single = join(path, kSingle);
    if (!fs::exists(single, ec))
      throw InputError(single, "",
                       std::string("the model's weights: ") + kSingle + " or " + kIndex +
                           " with its shards (safetensors only)");
    StReader r(single);
    f(r, nullptr);
    return single;
  }
  const nlohmann::json j = read_json(index, "a readable model.safetensors.index.json");
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object())
    throw InputError(index, "weight_map", "an object mapping tensor names to shard files");
  std::map<std::string, std::vector<std::string>> by_shard;  // [shard file] tensors, in order
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string())
      throw InputError(index, "weight_map." + it.key(), "the name of a shard file (a string)");
    by_shard[it->get<std::string>()].push_back(it.key());
  }
  // A shard is a file of this directory: a plain name, and no link leading out of it (an index
  // naming /etc/passwd or ../x must not make Strata open, or print a byte of, a foreign file).
  const fs::path home = fs::weakly_canonical(fs::path(path), ec);
  for (const auto& [shard, names] : by_shard) {
    const bool plain = !shard.empty() && shard.find('/') == std::string::npos &&
                       shard.find('\0') == std::string::npos && shard != "." && shard != "..";
    const fs::path real = plain ? fs::weakly_canonical(fs::path(path) / shard, ec) : fs::path();
    if (!plain || ec || real.parent_path() != home)
      throw InputError(index, "weight_map." + names.front(),
                       "the name of a shard file inside " + path +
                           " (a plain file name, not a path, and no link leading out of the "
                           "directory), got \"" +
                           shard + "\"");
  }
  for (const auto& [shard, names] : by_shard) {
    const std::string file = join(path, shard);
    if (!fs::is_regular_file(file, ec))
      throw InputError(file, "tensor " + names.front(),
                       std::string("the shard ") + kIndex + " lists for this tensor (and " +
                           std::to_string(names.size() - 1) + " others); the file is missing");
    StReader r(file);
    for (const std::string& name : names)
      if (!r.contains(name))
        throw InputError(file, "tensor " + name,
                         std::string("present, as ") + kIndex + " says, but it is missing");
    f(r, &names);
  }
  return index;
}

}  // namespace

HfTensors read_hf_tensors(const std::string& path) {
  HfTensors out;
  out.listing = for_each_hf_file(path, [&out](StReader& r, const std::vector<std::string>* names) {
    read_floats(r, names, out);
  });
  return out;
}

HfShapes read_hf_shapes(const std::string& path) {
  HfShapes out;
  out.listing = for_each_hf_file(path, [&out](StReader& r, const std::vector<std::string>* names) {
    for (const auto& [name, e] : r.entries()) {
      if (names && std::find(names->begin(), names->end(), name) == names->end()) continue;
      if (!st_is_float(e.dtype)) continue;
      out.shapes[name] = e.shape;
      out.file[name] = r.path();
    }
  });
  return out;
}

FullTensors load_hf_model(const ModelConfig& m, const std::string& path) {
  const HfAdapter& hf = architecture(m.arch).hf;
  if (!hf.from_hf)
    throw InputError(path, "",
                     "no checkpoint for model.arch \"" + m.arch +
                         "\": it has no Hugging Face adapter yet (model.init_from)");
  if (is_hf_directory(path) && hf.check_hf_config)
    hf.check_hf_config(m, read_hf_config(path), join(path, kConfig));
  HfTensors t = read_hf_tensors(path);
  if (hf.canonical_name) {  // the adapter's spelling; buffers that are not parameters go
    HfTensors named;
    named.listing = t.listing;
    for (auto& [name, tensor] : t.tensors) {
      const std::optional<std::string> c = hf.canonical_name(name);
      if (!c) continue;
      if (named.tensors.count(*c))
        throw InputError(t.file[name], "tensor " + name,
                         "one tensor per parameter; " + *c + " is in the file twice");
      named.file[*c] = t.file[name];
      named.tensors[*c] = std::move(tensor);
    }
    t = std::move(named);
  }
  // Every tensor must be used: one the model does not have (a layer beyond model.num_layers, a
  // head of an untied model) is a checkpoint of another model, not something to drop silently.
  // A tied model may carry the shared lm_head.weight (save_pretrained usually drops it), which
  // from_hf checks equals the embedding.
  std::set<std::string> known;
  if (hf.hf_order) {
    const std::vector<std::string> order = hf.hf_order(m);
    known.insert(order.begin(), order.end());
    if (m.tie_embeddings) known.insert("lm_head.weight");
    for (const auto& [name, tensor] : t.tensors)
      if (!known.count(name))
        throw InputError(t.file[name], "tensor " + name,
                         "only tensors of a " + hf.hf_class + " with the model config's shape (" +
                             std::to_string(m.num_layers) + " layers, tie_embeddings " +
                             (m.tie_embeddings ? "true" : "false") +
                             "); this one has no place in it");
  }
  try {
    return hf.from_hf(m, t.tensors, t.listing);
  } catch (const InputError& e) {
    // A tensor of the wrong shape: name the shard it is in rather than the index.
    const std::string prefix = "tensor ";
    std::string name = e.where();
    if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
    const auto it = t.file.find(name);
    if (it == t.file.end() || it->second == e.file()) throw;
    throw InputError(it->second, e.where(), e.expected());
  }
}

const FullTensor& hf_tensor(const FullTensors& hf, const std::string& name,
                            const std::vector<int64_t>& shape, const std::string& path) {
  auto it = hf.find(name);
  if (it == hf.end()) throw InputError(path, name, "a tensor of shape " + shape_string(shape));
  if (it->second.shape != shape)
    throw InputError(path, name,
                     "shape " + shape_string(shape) + " (from the config), found " +
                         shape_string(it->second.shape));
  return it->second;
}

FullTensor hf_rows(const FullTensor& t, int64_t begin, int64_t count) {
  FullTensor o;
  o.shape = t.shape;
  o.shape[0] = count;
  const int64_t row = t.data.size() / static_cast<size_t>(t.shape[0]);
  const auto first = t.data.begin() + begin * row;
  o.data.assign(first, first + count * row);
  return o;
}

nlohmann::json hf_value(const nlohmann::json& hf, const std::string& key,
                        const nlohmann::json& absent) {
  const auto it = hf.find(key);
  return it == hf.end() || it->is_null() ? absent : *it;
}

void check_hf_key(const nlohmann::json& hf, const std::string& key, const nlohmann::json& want,
                  const std::string& ours, const std::string& path, const nlohmann::json& absent) {
  const nlohmann::json got = hf_value(hf, key, absent);
  bool same = got == want;
  if (!same && got.is_number() && want.is_number() && !got.is_boolean()) {
    const double a = got.get<double>(), b = want.get<double>();
    same = std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b));
  }
  if (!same)
    throw InputError(path, key,
                     want.dump() + " (" + ours + " of the model config), found " +
                         got.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

int hf_int(const nlohmann::json& hf, const std::string& key, int64_t absent,
           const std::string& path, int64_t min) {
  const nlohmann::json v = hf_value(hf, key, absent);
  // Integral floats count (some exporters write 64.0); nothing beyond an int does.
  std::optional<int64_t> n;
  if (v.is_number_unsigned()) {
    n = v.get<uint64_t>() > static_cast<uint64_t>(INT_MAX)
            ? int64_t{INT_MAX} + 1
            : static_cast<int64_t>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9e18) n = static_cast<int64_t>(d);
  }
  if (!n || *n < min || *n > INT_MAX)
    throw InputError(path, key,
                     "an integer from " + std::to_string(min) + " to " + std::to_string(INT_MAX) +
                         ", found " +
                         v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return static_cast<int>(*n);
}

double hf_number(const nlohmann::json& hf, const std::string& key, double absent,
                 const std::string& path) {
  const nlohmann::json v = hf_value(hf, key, absent);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw InputError(
        path, key,
        "a number, found " + v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return v.get<double>();
}

bool hf_bool(const nlohmann::json& hf, const std::string& key, bool absent,
             const std::string& path) {
  const nlohmann::json v = hf_value(hf, key, absent);
  if (!v.is_boolean())
    throw InputError(
        path, key,
        "true or false, found " + v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return v.get<bool>();
}

std::optional<int64_t> parse_hf_size(const std::string& s) {
  static const std::regex re(R"(\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*)");
  std::smatch m;
  if (!std::regex_match(s, m, re)) return std::nullopt;
  std::string unit = m[3].str();
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  static const std::map<std::string, double> units = {{"", 1},
                                                      {"B", 1},
                                                      {"KB", 1e3},
                                                      {"MB", 1e6},
                                                      {"GB", 1e9},
                                                      {"TB", 1e12},
                                                      {"KIB", 1024.0},
                                                      {"MIB", 1048576.0},
                                                      {"GIB", 1073741824.0},
                                                      {"TIB", 1099511627776.0}};
  const auto u = units.find(unit);
  if (u == units.end()) return std::nullopt;
  const bool integer = m[2].str().empty() && m[1].str().find('.') == std::string::npos;
  if (integer && u->second == 1) {
    if (m[1].str().size() > 18) return std::nullopt;
    const int64_t n = std::stoll(m[1].str());
    return n >= 1 ? std::optional<int64_t>(n) : std::nullopt;
  }
  const double bytes = std::stod(m[1].str()) * u->second;
  if (!(bytes >= 1) || bytes > 9e18) return std::nullopt;
  return static_cast<int64_t>(bytes);  // truncated, as transformers' int(value * unit)
}

std::vector<std::string> hf_tensor_order(const FullTensors& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  const auto head = [](const std::string& n) { return n.rfind("lm_head.", 0) == 0; };
  std::sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    if (head(a) != head(b)) return head(b);
    return natural_less(a, b);
  });
  return names;
}

std::vector<std::vector<std::string>> hf_shard_plan(
    const std::vector<std::pair<std::string, int64_t>>& sizes, int64_t max_shard_bytes) {
  std::vector<std::vector<std::string>> shards;
  std::vector<std::string> current;
  int64_t current_bytes = 0;
  for (const auto& [name, bytes] : sizes) {
    if (bytes > max_shard_bytes) {  // alone in a shard, the current one stays open
      shards.push_back({name});
      continue;
    }
    if (current_bytes + bytes > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(name);
    current_bytes += bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

void write_hf_directory(const std::string& dir, const nlohmann::json& config,
                        const FullTensors& tensors, const HfWriteOptions& options,
                        const std::vector<std::string>& order_hint,
                        const std::map<std::string, std::string>& other_files) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec))
    throw InputError(dir, "", "a directory that can be created (" + ec.message() + ")");
  const int64_t width = st_dtype_bytes(options.dtype);
  if (options.dtype != "F32" && options.dtype != "BF16")
    throw InputError(dir, "", "F32 or BF16 as the dtype to write, got " + options.dtype);
  std::vector<std::string> order;
  std::set<std::string> placed;
  for (const std::string& n : order_hint)
    if (tensors.count(n) && placed.insert(n).second) order.push_back(n);
  for (const std::string& n : hf_tensor_order(tensors))
    if (!placed.count(n)) order.push_back(n);
  std::vector<std::pair<std::string, int64_t>> sizes;
  int64_t total = 0, parameters = 0;
  for (const std::string& n : order) {
    const int64_t numel = static_cast<int64_t>(tensors.at(n).data.size());
    sizes.emplace_back(n, numel * width);
    total += numel * width;
    parameters += numel;
  }
  const std::vector<std::vector<std::string>> plan = hf_shard_plan(sizes, options.max_shard_bytes);
  std::vector<std::string> files;
  if (plan.size() == 1) {
    files.push_back(kSingle);
  } else {
    for (size_t k = 0; k < plan.size(); ++k) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, plan.size());
      files.push_back(name);
    }
  }
  // What an earlier save left and this one does not rewrite.
  const std::set<std::string> keep(files.begin(), files.end());
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && is_weights_file(name) && !keep.count(name))
      fs::remove(e.path(), ec);
  }
  write_text(join(dir, kConfig), config.dump(2) + "\n");
  for (const auto& [name, text] : other_files) write_text(join(dir, name), text);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < plan.size(); ++k) {
    std::vector<std::string> names = plan[k];
    std::sort(names.begin(), names.end());
    write_safetensors_f32(join(dir, files[k]), views(tensors, names), options.dtype,
                          {{"format", "pt"}});
    for (const std::string& n : plan[k]) weight_map[n] = files[k];
  }
  if (plan.size() > 1) {
    const nlohmann::json index = {
        {"metadata", {{"total_parameters", parameters}, {"total_size", total}}},
        {"weight_map", weight_map}};
    write_text(join(dir, kIndex), index.dump(2) + "\n");
  }
}

void write_hf_file(const std::string& path, const FullTensors& tensors, const std::string& dtype) {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  write_safetensors_f32(path, views(tensors, names), dtype, {{"format", "pt"}});
}

}  // namespace strata
