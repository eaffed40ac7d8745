// config_schema.h — (inside launch/config/) the config's key tables: every key written once, with
// its name, where it lives in Config, its kind and single-key checks, and its meaning. The
// known-key lists, the defaults (Config's own member initialisers), the reads, the resolved JSON
// and config_keys() all come from these tables; the parallel layout's keys take their rows from
// layout_fields.h, the table --plan files and --fix read through too. Only the checks that combine
// several keys are code (config_checks.cc; world_layout.h once the world size is known).
//
// Thread-safety: the tables are built once, on first use; then read-only.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launch/config/config_reader.h"
#include "runtime/base/config.h"

namespace strata {

// A rule of one key beyond its kind, run right after the key is read (the key's path, the
// Config read so far); it throws InputError through the Reader.
using KeyCheck = std::function<void(const Reader&, const std::string& path, const Config&)>;

// One key of a section. A leaf reads itself from the merged JSON into Config, with the checks
// of its kind, and writes itself back as JSON; a key without `read` is a nested section, whose
// keys are the Section at "<section path>.<name>".
struct Key {
  std::string name;
  std::string meaning;  // one line; docs/config.md says it at more length
  std::function<void(const Reader&, const std::string& path, Config&)> read;
  std::function<nlohmann::json(const Config&)> write;
  KeyCheck check;  // none when the kind says it all
  std::optional<nlohmann::json>
      layer_default;  // the defaults layer's value, where not Config's own
  // A file path (a string; in a list, each entry's "path": data.blend), but for these keywords:
  // a relative one written in a file counts from that file's folder (config_parse.h).
  bool is_path = false;
  std::vector<std::string> path_keywords;

  bool is_section() const { return !read; }
  Key then(KeyCheck c) && {
    check = std::move(c);
    return std::move(*this);
  }
  Key defaults_to(nlohmann::json v) && {
    layer_default = std::move(v);
    return std::move(*this);
  }
  Key paths(std::vector<std::string> keywords = {}) && {
    is_path = true;
    path_keywords = std::move(keywords);
    return std::move(*this);
  }
};

// The keys of one section ("" the top level, "data.synthetic" a nested one), in docs/config.md's
// order, so that error messages list them as documented.
struct Section {
  std::string path;
  std::vector<Key> keys;
};

// docs/config.md's default model. The built-in model defaults are its sizes, so the preset is only
// read from disk when a config names one: a defaults-only run needs no files.
extern const char kDefaultPreset[];

const std::vector<Section>& schema();
const Section* find_section(const std::string& path);
bool has_key(const Section& s, const std::string& key);
// "unknown key (known keys of <section>: a, b, c)", and a suggestion for `key` when one is near:
// "did you mean optimizer.lr?" (the same name in another section) or "did you mean
// micro_batch_size?" (a key of this section at most two edits away).
std::string unknown_key_message(const Section& s, const std::string& key);
// Calls f(path, key) for every leaf of the section at `path` and of its nested sections, in
// table order.
void for_each_leaf(const std::string& path,
                   const std::function<void(const std::string&, const Key&)>& f);
// Checks `j` against the section `schema_path`: an object, known keys only, nested sections
// objects too. `where` is the same place as the file spells it (differs for preset files).
void check_keys(const nlohmann::json& j, const std::string& schema_path, const std::string& where,
                const std::string& file);

// c as the config's JSON (every key).
nlohmann::json to_json(const Config& c);
// Config's member initialisers, and the few keys whose defaults layer says otherwise.
nlohmann::json default_json();
// Every key, in table order, with the checks of its kind and its own rule.
Config read_config(const Reader& r);

// Combinations that are wrong whatever the world size (config_checks.cc). Throws InputError
// through `r`, at the key set last.
void check_consistency(const Config& c, const Reader& r);

}  // namespace strata
