// manifest.cc — reading a checkpoint's metadata.json and run_state.json, every field checked as
// strictly as a config's (load.h), and the checks of a file against its metadata.json record.
#include <climits>
#include <cmath>
#include <filesystem>
#include <iterator>

#include "runtime/base/error.h"
#include "runtime/checkpoint/checkpoint_internal.h"
#include "runtime/io/input_file.h"
#include "runtime/io/json_file.h"

namespace strata::checkpoint_internal {
namespace fs = std::filesystem;

namespace {

// A checkpoint's JSON file; "" when it is missing, unreadable, not a regular file or larger than
// any metadata (the callers report that as the file's fault).
std::string read_file(const std::string& path) {
  try {
    return read_input_file(path, kMaxJsonFileBytes);
  } catch (const InputError&) {
    return {};
  }
}

// The directory's name as written (trailing slashes dropped), for iter_<N>.
std::string dir_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

std::string show(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t int_in(const json& v, int64_t lo, int64_t hi, const std::string& file,
               const std::string& key) {
  bool ok = false;
  int64_t n = 0;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() <= static_cast<uint64_t>(hi);
    n = ok ? static_cast<int64_t>(v.get<uint64_t>()) : 0;
  } else if (v.is_number_integer()) {
    ok = true;
    n = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    ok = std::isfinite(d) && std::floor(d) == d && d >= -9e18 && d <= 9e18;
    n = ok ? static_cast<int64_t>(d) : 0;
  }
  if (!ok || n < lo || n > hi)
    throw InputError(file, key,
                     "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "], got " + show(v));
  return n;
}

const json& field(const json& obj, const std::string& key, const std::string& file,
                  const std::string& prefix) {
  if (!obj.contains(key)) throw InputError(file, prefix + key, "present, but it is missing");
  return obj.at(key);
}

int64_t int_field(const json& obj, const std::string& key, int64_t lo, int64_t hi,
                  const std::string& file, const std::string& prefix) {
  return int_in(field(obj, key, file, prefix), lo, hi, file, prefix + key);
}

std::string string_field(const json& obj, const std::string& key, const std::string& file,
                         const std::string& prefix) {
  const json& v = field(obj, key, file, prefix);
  if (!v.is_string()) throw InputError(file, prefix + key, "expected a string, got " + show(v));
  return v.get<std::string>();
}

void expect_string(const json& obj, const std::string& key, const std::string& want,
                   const std::string& file) {
  const json& v = field(obj, key, file, "");
  if (v != want) throw InputError(file, key, "expected \"" + want + "\", got " + show(v));
}

void exact_object(const json& v, const std::vector<std::string>& keys, const std::string& file,
                  const std::string& where) {
  if (!v.is_object()) throw InputError(file, where, "expected a JSON object, got " + show(v));
  std::string list;
  for (const std::string& k : keys) list += (list.empty() ? "" : ", ") + k;
  for (const auto& [k, value] : v.items())
    if (std::find(keys.begin(), keys.end(), k) == keys.end())
      throw InputError(file, (where.empty() ? "" : where + ".") + k,
                       "a known key (" + list + "), got an unknown one");
  for (const std::string& k : keys)
    if (!v.contains(k))
      throw InputError(file, (where.empty() ? "" : where + ".") + k, "present, but it is missing");
}

Manifest read_manifest(const std::string& path) {
  const std::string file = path + "/metadata.json";
  // The error_code form: a path the system refuses (too long) is a missing file, not a throw.
  std::error_code ec;
  if (!fs::exists(file, ec)) throw InputError(file, "", "a checkpoint's metadata.json, found none");
  const json j = read_json_file(file);
  exact_object(j, {"format", "iteration", "world_size", "checksum", "files"}, file, "");
  Manifest m;
  // Format 1 (before block checksums) is still read: its files are checksummed whole.
  if (j.at("format") == "strata-checkpoint-1")
    m.format = 1;
  else
    expect_string(j, "format", "strata-checkpoint-2", file);
  expect_string(j, "checksum", "crc32-ieee", file);
  m.iteration = static_cast<int>(int_field(j, "iteration", 0, INT_MAX, file));
  const int named = iteration_of(dir_name(path));
  if (named >= 0 && named != m.iteration)
    throw InputError(file, "iteration",
                     "expected " + std::to_string(named) + " (the directory's name), got " +
                         std::to_string(m.iteration));
  m.world_size = static_cast<int>(int_field(j, "world_size", 1, INT_MAX, file));
  const json& files = j.at("files");
  if (!files.is_object()) throw InputError(file, "files", "expected an object of file entries");
  for (const auto& [name, e] : files.items()) {
    const std::string where = "files." + name;
    const int rank = rank_of_file(name);
    const bool tokenizer =
        std::find(std::begin(kCheckpointTokenizerFiles), std::end(kCheckpointTokenizerFiles),
                  name) != std::end(kCheckpointTokenizerFiles);
    if (name != "run_state.json" && !tokenizer && !(rank >= 0 && rank < m.world_size))
      throw InputError(file, where,
                       "only run_state.json, rank_0.safetensors … " + rank_file(m.world_size - 1) +
                           " (world_size " + std::to_string(m.world_size) +
                           ") and tokenizer.json or tokenizer.tiktoken, got this entry");
    const bool headed = m.format >= 2 && rank >= 0;
    exact_object(e,
                 headed ? std::vector<std::string>{"bytes", "crc32", "header_bytes", "header_crc32"}
                        : std::vector<std::string>{"bytes", "crc32"},
                 file, where);
    FileRecord r;
    r.bytes = int_field(e, "bytes", 0, INT64_MAX, file, where + ".");
    const auto hex_field = [&](const char* key) {
      const std::string v = string_field(e, key, file, where + ".");
      if (v.size() != 8 || v.find_first_not_of("0123456789abcdef") != std::string::npos)
        throw InputError(file, where + "." + key,
                         "expected 8 lowercase hexadecimal digits, got \"" + v + "\"");
      return v;
    };
    r.crc32 = hex_field("crc32");
    if (headed) {
      r.header_bytes = int_field(e, "header_bytes", 8, r.bytes, file, where + ".");
      r.header_crc32 = hex_field("header_crc32");
    }
    m.files[name] = r;
  }
  // Every file a load reads must be covered: the run state and the shard of every rank.
  std::vector<std::string> needed = {"run_state.json"};
  for (int r = 0; r < m.world_size; ++r) needed.push_back(rank_file(r));
  for (const std::string& n : needed)
    if (!m.files.count(n))
      throw InputError(file, "files",
                       "an entry (bytes, CRC-32) for " + n + " (world_size " +
                           std::to_string(m.world_size) + "), found none");
  if (m.files.count(kCheckpointTokenizerFiles[0]) && m.files.count(kCheckpointTokenizerFiles[1]))
    throw InputError(file, std::string("files.") + kCheckpointTokenizerFiles[1],
                     "one tokenizer, got tokenizer.json too");
  return m;
}

std::optional<std::string> checked_tokenizer(const std::string& path, const Manifest& m) {
  for (const char* name : kCheckpointTokenizerFiles) {
    const auto it = m.files.find(name);
    if (it == m.files.end()) continue;
    const std::string file = path + "/" + name;
    check_size(file, it->second);
    const std::string bytes = read_file(file);
    check_crc(file, it->second, crc32_ieee(bytes.data(), bytes.size()));
    return file;  // read_manifest allows one
  }
  return std::nullopt;
}

void check_size(const std::string& file, const FileRecord& rec) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) throw InputError(file, "", "a readable file (metadata.json lists it): " + ec.message());
  if (static_cast<int64_t>(size) != rec.bytes)
    throw InputError(file, "",
                     std::to_string(rec.bytes) + " bytes as metadata.json records, found " +
                         std::to_string(size) + " (truncated or extended)");
}

void check_crc(const std::string& file, const FileRecord& rec, uint32_t crc) {
  if (crc_hex(crc) != rec.crc32)
    throw InputError(file, "",
                     "CRC-32 " + rec.crc32 + " as metadata.json records, found " + crc_hex(crc) +
                         " (corrupted)");
}

json read_run_state(const std::string& path, const Manifest& m) {
  const std::string file = path + "/run_state.json";
  const FileRecord& rec = m.files.at("run_state.json");
  check_size(file, rec);
  const std::string text = read_file(file);
  check_crc(file, rec, crc32_ieee(text.data(), text.size()));
  const json rs = parse_json(text, file);
  std::vector<std::string> keys = {
      "format", "iteration",          "optimizer_steps", "data_position", "seed",
      "rng",    "nonfinite_in_a_row", "world_size",      "model",         "parallel",
      "train",  "config_file"};
  // The run's data section (strata eval --data reads it), recorded since run states hold it.
  if (rs.is_object() && rs.contains("data")) keys.push_back("data");
  exact_object(rs, keys, file, "");
  if (rs.contains("data") && !rs.at("data").is_object())
    throw InputError(file, "data", "expected an object of data keys, got " + show(rs.at("data")));
  expect_string(rs, "format", "strata-run-state-1", file);
  const int64_t it = int_field(rs, "iteration", 0, INT_MAX, file);
  if (it != m.iteration)
    throw InputError(file, "iteration",
                     "expected " + std::to_string(m.iteration) + " as metadata.json records, got " +
                         std::to_string(it));
  // At most one optimizer step per iteration; five non-finite steps in a row end a run.
  int_field(rs, "optimizer_steps", 0, it, file);
  int_field(rs, "data_position", 0, INT64_MAX, file);
  int_field(rs, "seed", 0, INT64_MAX, file);
  string_field(rs, "rng", file);
  int_field(rs, "nonfinite_in_a_row", 0, 4, file);
  const int64_t world = int_field(rs, "world_size", 1, INT_MAX, file);
  if (world != m.world_size)
    throw InputError(file, "world_size",
                     "expected " + std::to_string(m.world_size) +
                         " as metadata.json records, got " + std::to_string(world));
  const json& model = rs.at("model");
  if (!model.is_object()) throw InputError(file, "model", "expected an object of model keys");
  string_field(model, "arch", file, "model.");
  const json& par = rs.at("parallel");
  std::vector<std::string> par_keys = {"tensor",
                                       "pipeline",
                                       "data",
                                       "virtual_stages",
                                       "schedule",
                                       "sequence_parallel",
                                       "distributed_optimizer"};
  // Recorded only where used (> 1): expert, context.
  for (const char* k : {"expert", "context"})
    if (par.is_object() && par.contains(k)) par_keys.push_back(k);
  exact_object(par, par_keys, file, "parallel");
  int64_t ranks = 1;
  for (const char* k : {"tensor", "pipeline", "data"})
    ranks *= int_field(par, k, 1, INT_MAX, file, "parallel.");
  if (par.contains("context")) ranks *= int_field(par, "context", 2, INT_MAX, file, "parallel.");
  if (ranks != world)
    throw InputError(file, "parallel",
                     std::string("tensor × ") + (par.contains("context") ? "context × " : "") +
                         "pipeline × data = world_size " + std::to_string(world) + ", got " +
                         std::to_string(ranks));
  int_field(par, "virtual_stages", 1, INT_MAX, file, "parallel.");
  if (par.contains("expert")) {
    const int64_t e = int_field(par, "expert", 2, INT_MAX, file, "parallel.");
    if (par.at("data").get<int64_t>() % e != 0)
      throw InputError(
          file, "parallel.expert",
          "a divisor of parallel.data " + par.at("data").dump() + ", got " + std::to_string(e));
  }
  string_field(par, "schedule", file, "parallel.");
  for (const char* k : {"sequence_parallel", "distributed_optimizer"})
    if (!par.at(k).is_boolean())
      throw InputError(file, std::string("parallel.") + k,
                       "expected a boolean, got " + show(par.at(k)));
  const json& train = rs.at("train");
  exact_object(train, {"iterations", "micro_batch_size", "global_batch_size"}, file, "train");
  int_field(train, "iterations", 0, INT_MAX, file, "train.");
  int_field(train, "micro_batch_size", 1, INT_MAX, file, "train.");
  int_field(train, "global_batch_size", 1, INT_MAX, file, "train.");
  string_field(rs, "config_file", file);
  return rs;
}

}  // namespace strata::checkpoint_internal
