// config_parse.cc — layered config loading (defaults < preset < file < --set), strict checks.
//
// Layering happens on JSON before any value is read: every layer is checked for unknown keys on
// its own, so an unknown key is reported against the file (or "<command line>") that spelled it;
// the layers are then merged key by key over the defaults, remembering which layer set each
// leaf (config_reader.h). Values are read into Config only after merging, through the key tables
// of config_schema.h, so a type or range error names the source that last set the bad value, and
// a consistency error (config_checks.cc) names the most recently set of the keys involved.

#include "launch/config/config_parse.h"

#include <fnmatch.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "launch/config/config_reader.h"
#include "launch/config/config_schema.h"
#include "launch/config/json_values.h"
#include "runtime/base/error.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

using json = nlohmann::json;

const char kCommandLine[] = "<command line>";
const char kDefaultsFile[] = "<defaults>";

std::string models_dir() {
  return configs_dir() + "/models";
}

std::string preset_path(const std::string& name) {
  return models_dir() + "/" + name + ".json";
}

std::vector<std::string> known_presets() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(models_dir(), ec)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Preset names become file names; refusing separators keeps a name from reaching outside
// configs/models.
bool valid_preset_name(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
  });
}

void merge_into(json& dst, const json& src, const std::string& path, const Origin& origin,
                Origins& origins) {
  for (const auto& [key, value] : src.items()) {
    const std::string sub = join(path, key);
    if (find_section(sub)) {
      merge_into(dst[key], value, sub, origin, origins);
    } else {
      dst[key] = value;
      origins[sub] = origin;
    }
  }
}

// `--set a.b=v` as a one-key layer {"a": {"b": v}}, after checking that a.b is a known key.
json parse_set(const std::string& arg) {
  const size_t eq = arg.find('=');
  const std::string path = arg.substr(0, eq);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const bool empty_part =
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); });
  if (eq == std::string::npos || empty_part) {
    throw InputError(kCommandLine, "--set " + arg, "expected section.key=value");
  }
  std::string at;
  for (const std::string& part : parts) {
    const Section* section = find_section(at);
    if (!section) {
      throw InputError(kCommandLine, join(at, part),
                       "unknown key (" + at + " is a value, not a section)");
    }
    if (!has_key(*section, part)) {
      throw InputError(kCommandLine, join(at, part), unknown_key_message(*section, part));
    }
    at = join(at, part);
  }
  const std::string text = arg.substr(eq + 1);
  json value;
  try {
    value = parse_json_if_json(text, kCommandLine).value_or(json(text));
  } catch (const InputError& e) {
    // JSON Strata cannot hold (too deep, a number beyond double's range), at its path in a.b.
    const std::string& w = e.where();
    throw InputError(e.file(), w.empty() || w[0] == '[' ? at + w : join(at, w), e.expected());
  }
  if (find_section(at)) check_keys(value, at, at, kCommandLine);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    json wrapped = json::object();
    wrapped[*it] = std::move(value);
    value = std::move(wrapped);
  }
  return value;
}

// ffn_hidden_size follows hidden_size (4x) unless it was given at the same layer as
// hidden_size or later: a file that widens a preset's hidden_size widens its FFN too.
void derive_ffn(json& merged, Origins& origins) {
  auto layer_of = [&origins](const std::string& p) {
    const auto it = origins.find(p);
    return it == origins.end() ? static_cast<int>(kLayerDefaults) : it->second.layer;
  };
  if (layer_of("model.ffn_hidden_size") >= layer_of("model.hidden_size")) return;
  const std::optional<int64_t> hidden = as_int64(merged["model"]["hidden_size"]);
  // A bad hidden_size is reported when it is read, before ffn_hidden_size.
  if (!hidden || *hidden < 1 || *hidden > INT_MAX) return;
  merged["model"]["ffn_hidden_size"] = 4 * *hidden;
  origins["model.ffn_hidden_size"] = origins.at("model.hidden_size");
}

// A relative path of a config, for errors about it: the path Strata opens and what it counts from.
struct PathNote {
  std::string key;  // "data.path", "data.blend[1].path"
  std::string resolved;
  std::string note;  // " (data.path \"x.txt\", relative to the config file's folder DIR)"
};

// The relative paths of every config this process loaded (a command loads one or two).
std::mutex g_notes_mutex;
std::vector<PathNote> g_notes;

void remember(const std::string& key, const std::string& resolved, const std::string& note) {
  const std::lock_guard<std::mutex> lock(g_notes_mutex);
  for (const PathNote& n : g_notes)
    if (n.key == key && n.resolved == resolved && n.note == note) return;
  g_notes.push_back({key, resolved, note});
}

// A real file set the key (the config file, a preset), not "<command line>" or "<defaults>".
bool from_file(const Origin& o) {
  return (o.layer == kLayerFile || o.layer == kLayerPreset) && !o.file.empty() && o.file[0] != '<';
}

// Resolves the relative paths of `merged` (the keys Key::is_path marks): those a file wrote
// count from that file's folder, so a config works from any directory; those --set gave count
// from the current directory, where they were typed, and stay as they are. Each is remembered
// for the errors about it (config_path_note).
void resolve_paths(json& merged, const Origins& origins) {
  namespace fs = std::filesystem;
  for_each_leaf("", [&](const std::string& key, const Key& k) {
    if (!k.is_path) return;
    const auto it = origins.find(key);
    if (it == origins.end()) return;  // a default
    const Origin& o = it->second;
    const bool file = from_file(o);
    if (!file && o.layer < kLayerFirstSet) return;
    std::string base;
    fs::path folder;
    std::error_code ec;
    if (file) {
      folder = fs::path(o.file).parent_path();
      const fs::path shown = folder.empty() ? fs::current_path(ec) : fs::absolute(folder, ec);
      base = std::string(o.layer == kLayerPreset ? "the model preset's folder "
                                                 : "the config file's folder ") +
             shown.string();
    } else {
      base = "the current directory " + fs::current_path(ec).string();
    }
    auto resolve = [&](json& v, const std::string& where) {
      if (!v.is_string()) return;  // the key's read reports a wrong type
      const std::string written = v.get<std::string>();
      if (written.empty() || fs::path(written).is_absolute()) return;
      for (const std::string& word : k.path_keywords)
        if (written == word) return;
      const std::string resolved = (folder / written).string();
      v = resolved;
      remember(where, resolved,
               " (" + where + " " + show(json(written)) + ", relative to " + base + ")");
    };
    json& v = merged[json_path(key)];
    if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i)
        if (v[i].is_object() && v[i].contains("path"))
          resolve(v[i]["path"], key + "[" + std::to_string(i) + "].path");
    } else {
      resolve(v, key);
    }
  });
}

}  // namespace

std::string config_path_note(const std::string& file, const std::string& where) {
  const std::lock_guard<std::mutex> lock(g_notes_mutex);
  const PathNote* best = nullptr;
  for (const PathNote& n : g_notes) {
    const std::string& r = n.resolved;
    // The path itself, a file under it (a checkpoint.dir's, a Hugging Face directory's), an
    // indexed prefix's .idx and .bin, or a shard a glob matched.
    const bool under = file.size() > r.size() && file.compare(0, r.size(), r) == 0 &&
                       (file[r.size()] == '/' || file[r.size()] == '.');
    const bool glob =
        r.find_first_of("*?[") != std::string::npos && ::fnmatch(r.c_str(), file.c_str(), 0) == 0;
    if ((file == r || under || glob) && (!best || r.size() > best->resolved.size())) best = &n;
  }
  // An error at the key itself (the config's file, "data.path": a data file that is missing),
  // about the path the latest config gave it.
  for (auto it = g_notes.rbegin(); !best && !where.empty() && it != g_notes.rend(); ++it)
    if (it->key == where) best = &*it;
  return best ? best->note : std::string();
}

std::string configs_dir() {
  if (const char* env = std::getenv("STRATA_CONFIGS"); env != nullptr && *env != '\0') return env;
  return std::string(STRATA_SOURCE_DIR) + "/configs";
}

nlohmann::json load_model_preset(const std::string& name, const std::string& file,
                                 const std::string& where) {
  if (!valid_preset_name(name)) {
    throw InputError(
        file, where,
        "expected a preset name (letters, digits, '.', '_', '-'), got " + show(json(name)));
  }
  const std::string path = preset_path(name);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(file, where,
                     "unknown preset " + show(json(name)) + " (known presets in " + models_dir() +
                         ": " + join_list(known_presets(), ", ") + ")");
  }
  json preset = read_json_file(path, kMaxJsonFileBytes, DuplicateKeys::kRefuse);
  check_keys(preset, "model", "", path);
  if (preset.contains("preset")) {
    throw InputError(path, "preset",
                     "unknown key (a preset holds model keys and names no other preset)");
  }
  return preset;
}

Config config_from_json(const nlohmann::json& j, const std::string& file,
                        const std::vector<std::string>& sets) {
  const std::string source = file.empty() ? kDefaultsFile : file;
  check_keys(j, "", "", source);

  struct Layer {
    json value;
    Origin origin;
  };
  std::vector<Layer> layers = {{j, Origin{source, kLayerFile, ""}}};
  for (size_t i = 0; i < sets.size(); ++i) {
    layers.push_back(
        {parse_set(sets[i]), Origin{kCommandLine, kLayerFirstSet + static_cast<int>(i), ""}});
  }

  json merged = default_json();
  Origins origins;
  // The preset sits under the file's keys even when --set names it, so it is found first.
  const Layer* named = nullptr;
  for (const Layer& l : layers) {
    if (l.value.contains("model") && l.value["model"].contains("preset")) named = &l;
  }
  if (named != nullptr) {
    const json& name = named->value["model"]["preset"];
    if (name.is_string()) {
      json preset_layer = json::object();
      preset_layer["model"] =
          load_model_preset(name.get<std::string>(), named->origin.file, "model.preset");
      merge_into(merged, preset_layer, "",
                 Origin{preset_path(name.get<std::string>()), kLayerPreset, "model."}, origins);
    } else if (!name.is_null()) {
      throw InputError(named->origin.file, "model.preset",
                       "expected a string or null, got " + show(name));
    }
  }
  for (const Layer& l : layers) merge_into(merged, l.value, "", l.origin, origins);
  derive_ffn(merged, origins);
  resolve_paths(merged, origins);

  const Reader reader(merged, origins, source);
  Config c = read_config(reader);
  check_consistency(c, reader);
  c.source_file = source;
  for (const auto& [path, origin] : origins)
    if (origin.layer >= kLayerFirstSet) c.command_line_keys.push_back(path);
  std::sort(c.command_line_keys.begin(), c.command_line_keys.end(),
            [&](const std::string& a, const std::string& b) {
              return origins.at(a).layer < origins.at(b).layer;
            });
  c.resolved = to_json(c);
  return c;
}

Config config_with_layer(const Config& c, const nlohmann::json& layer, const std::string& file) {
  check_keys(layer, "", "", file);
  json merged = c.resolved;
  Origins origins;
  // The config's keys keep its file; which layer inside it set each is no longer known.
  for_each_leaf("", [&](const std::string& path, const Key&) {
    origins[path] = Origin{c.source_file, kLayerFile, ""};
  });
  merge_into(merged, layer, "", Origin{file, kLayerOver, ""}, origins);
  const Reader reader(merged, origins, c.source_file);
  Config out = read_config(reader);
  check_consistency(out, reader);
  out.source_file = c.source_file;
  out.command_line_keys = c.command_line_keys;
  out.resolved = to_json(out);
  return out;
}

json model_section(const ModelConfig& m) {
  Config c;
  c.model = m;
  json model = to_json(c)["model"];
  model["preset"] = nullptr;
  return model;
}

ModelConfig checked_model(const ModelConfig& m, const std::string& file) {
  // The synthetic data's default vocabulary must not be what fails a model of fewer tokens.
  return config_from_json(json{{"model", model_section(m)}}, file, {"data.synthetic.vocab_size=1"})
      .model;
}

Config load_config(const std::string& path, const std::vector<std::string>& sets) {
  if (path.empty()) return config_from_json(json::object(), kDefaultsFile, sets);
  return config_from_json(read_json_file(path, kMaxJsonFileBytes, DuplicateKeys::kRefuse), path,
                          sets);
}

}  // namespace strata
